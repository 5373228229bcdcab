#pragma once
// The Beast HTTP server: one listener, one session per connection, each on its own strand (no
// mutexes: STYLE rule 11). A session reads one request, hands it to the router, writes the answer
// (a JSON body or an SSE stream) from a bounded queue, and watches the socket meanwhile so that a
// client leaving mid-answer cancels its request.
//
// Under abuse: the listener caps open connections (--max-connections); at the cap a new connection
// takes the place of the longest-idle one, or gets a 503 when every connection is busy. Out of file
// descriptors it stops accepting (an accept that fails at once must not be retried at once: that
// spins) until a connection closes. A request must arrive whole within --read-timeout of its first
// byte (of the accept, on a new connection); a kept-alive connection may wait --idle-timeout for the
// next one.
#include <boost/asio/io_context.hpp>

#include <memory>
#include <string>

#include "http/server_context.hpp"

namespace ferry::http {

class ConnectionListener;

class HttpServer {
 public:
  HttpServer(boost::asio::io_context& ioc, std::shared_ptr<ServerContext> context);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and starts accepting; an error message (naming the address) or empty. First raises the
  // open-file limit to its hard limit and sets the connection cap from it (logged), and warns when
  // `host` is reachable from other machines while no API key is configured.
  std::string listen(const std::string& host, uint16_t port);
  // The bound port (useful with port 0).
  uint16_t port() const;
  // Stops accepting; connections already open go on.
  void close();

 private:
  boost::asio::io_context& ioc_;
  std::shared_ptr<ServerContext> context_;
  std::shared_ptr<ConnectionListener> listener_;
};

}  // namespace ferry::http
