#include "http/admin_server.hpp"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket/rfc6455.hpp>

#include <optional>

#include "http/admin_page.hpp"
#include "http/admin_ws.hpp"
#include "http/responses.hpp"

namespace ferry::http {
namespace {

namespace beast = boost::beast;
namespace bhttp = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

class AdminConnection : public std::enable_shared_from_this<AdminConnection> {
 public:
  AdminConnection(tcp::socket&& socket, std::shared_ptr<ServerContext> ctx) : stream_(std::move(socket)), ctx_(std::move(ctx)) {}

  void run() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      self->parser_.emplace();
      self->parser_->header_limit(16 * 1024);
      self->parser_->body_limit(4 * 1024);
      self->stream_.expires_after(std::chrono::seconds(30));
      bhttp::async_read(self->stream_, self->buffer_, *self->parser_,
                        [self](beast::error_code ec, size_t) { self->on_read(ec); });
    });
  }

 private:
  void on_read(beast::error_code ec) {
    if (ec) return close();
    bhttp::request<bhttp::string_body> req = parser_->release();
    const std::string target(req.target());
    const std::string path = target.substr(0, target.find('?'));
    if (beast::websocket::is_upgrade(req) && is_admin_websocket(target)) {
      stream_.expires_never();
      return serve_admin_websocket(ctx_, stream_.release_socket(), std::move(req));
    }
    if (req.method() != bhttp::verb::get) {
      return respond(405, to_json(make_error(405, "invalid_request_error", "method_not_allowed",
                                             std::string(req.method_string()) + " " + path + ": use GET")), {});
    }
    if (path == "/admin" || path == "/") return respond(200, std::string(admin_page_html()), admin_page_headers());
    if (path == "/admin/ws") {
      return respond(426, to_json(make_error(426, "invalid_request_error", "upgrade_required",
                                             "/admin/ws is the admin console's WebSocket: connect with a WebSocket client")), {});
    }
    respond(404, to_json(make_error(404, "invalid_request_error", "not_found",
                                    "no endpoint GET " + path + " on the admin port (GET /admin, /admin/ws)")), {});
  }

  void respond(unsigned status, std::string body, const HeaderList& headers) {
    res_.result(static_cast<bhttp::status>(status));
    res_.version(11);
    res_.set(bhttp::field::server, "ferry");
    res_.set(bhttp::field::content_type, "application/json");
    for (const auto& [name, value] : headers) res_.set(name, value);
    res_.keep_alive(false);
    res_.body() = std::move(body);
    res_.prepare_payload();
    stream_.expires_after(std::chrono::seconds(30));
    bhttp::async_write(stream_, res_, [self = shared_from_this()](beast::error_code, size_t) { self->close(); });
  }

  void close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
  }

  beast::tcp_stream stream_;
  std::shared_ptr<ServerContext> ctx_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  bhttp::response<bhttp::string_body> res_;
};

}  // namespace

class AdminServer::Listener : public std::enable_shared_from_this<AdminServer::Listener> {
 public:
  Listener(net::io_context& ioc, std::shared_ptr<ServerContext> ctx)
      : ioc_(ioc), acceptor_(net::make_strand(ioc)), ctx_(std::move(ctx)) {}

  std::string open(const std::string& host, uint16_t port) {
    beast::error_code ec;
    const auto address = net::ip::make_address(host, ec);
    if (ec) return "--admin-host '" + host + "' is not an IP address: " + ec.message();
    const tcp::endpoint endpoint{address, port};
    const std::string where = host + ":" + std::to_string(port);
    acceptor_.open(endpoint.protocol(), ec);
    if (ec) return "cannot open a socket for the admin console on " + where + ": " + ec.message();
    acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    acceptor_.bind(endpoint, ec);
    if (ec) return "cannot listen for the admin console on " + where + ": " + ec.message();
    acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec) return "cannot listen for the admin console on " + where + ": " + ec.message();
    port_ = acceptor_.local_endpoint(ec).port();
    return {};
  }

  void start() { net::dispatch(acceptor_.get_executor(), [self = shared_from_this()] { self->accept(); }); }
  uint16_t port() const { return port_; }
  void stop() {
    net::post(acceptor_.get_executor(), [self = shared_from_this()] {
      beast::error_code ec;
      self->acceptor_.close(ec);
    });
  }

 private:
  void accept() {
    acceptor_.async_accept(net::make_strand(ioc_), [self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
      if (ec == net::error::operation_aborted || !self->acceptor_.is_open()) return;
      if (!ec) {
        socket.set_option(tcp::no_delay(true), ec);
        std::make_shared<AdminConnection>(std::move(socket), self->ctx_)->run();
        self->accept();
      } else {
        // Out of descriptors or similar: try again shortly rather than spin.
        auto timer = std::make_shared<net::steady_timer>(self->acceptor_.get_executor(), std::chrono::milliseconds(100));
        timer->async_wait([self, timer](beast::error_code) { self->accept(); });
      }
    });
  }

  net::io_context& ioc_;
  tcp::acceptor acceptor_;
  std::shared_ptr<ServerContext> ctx_;
  uint16_t port_ = 0;
};

AdminServer::AdminServer(net::io_context& ioc, std::shared_ptr<ServerContext> context)
    : ioc_(ioc), context_(std::move(context)) {}

AdminServer::~AdminServer() = default;

std::string AdminServer::listen(const std::string& host, uint16_t port) {
  listener_ = std::make_shared<Listener>(ioc_, context_);
  std::string error = listener_->open(host, port);
  if (!error.empty()) {
    listener_.reset();
    return error;
  }
  listener_->start();
  return {};
}

uint16_t AdminServer::port() const { return listener_ ? listener_->port() : 0; }

void AdminServer::close() {
  if (listener_) listener_->stop();
}

}  // namespace ferry::http
