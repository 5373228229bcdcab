#pragma once
// The Beast HTTP server: one listener, one session per connection, each on its own strand (no
// mutexes: STYLE rule 11). A session reads one request, hands it to the router, writes the answer
// (a JSON body or an SSE stream) from a bounded queue, and watches the socket meanwhile so that a
// client leaving mid-answer cancels its request.
#include <boost/asio/io_context.hpp>

#include <memory>
#include <string>

#include "http/server_context.hpp"

namespace ferry::http {

class HttpServer {
 public:
  HttpServer(boost::asio::io_context& ioc, std::shared_ptr<ServerContext> context);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and starts accepting; an error message (naming the address) or empty.
  std::string listen(const std::string& host, uint16_t port);
  // The bound port (useful with port 0).
  uint16_t port() const;
  // Stops accepting; connections already open go on.
  void close();

 private:
  class Listener;
  boost::asio::io_context& ioc_;
  std::shared_ptr<ServerContext> context_;
  std::shared_ptr<Listener> listener_;
};

}  // namespace ferry::http
