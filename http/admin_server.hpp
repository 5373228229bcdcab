#pragma once
// The admin console on a port of its own (--admin-port, on --admin-host): GET /admin (the page) and
// the /admin/ws WebSocket, nothing else. Each connection reads one request, on its own strand, and
// either becomes the console's WebSocket or gets its answer and is closed.
#include <boost/asio/io_context.hpp>

#include <memory>
#include <string>

#include "http/server_context.hpp"

namespace ferry::http {

class AdminServer {
 public:
  AdminServer(boost::asio::io_context& ioc, std::shared_ptr<ServerContext> context);
  ~AdminServer();
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  // Binds and starts accepting; an error message (naming the address) or empty.
  std::string listen(const std::string& host, uint16_t port);
  uint16_t port() const;
  void close();

 private:
  class Listener;
  boost::asio::io_context& ioc_;
  std::shared_ptr<ServerContext> context_;
  std::shared_ptr<Listener> listener_;
};

}  // namespace ferry::http
