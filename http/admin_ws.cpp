#include "http/admin_ws.hpp"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>

#include <atomic>
#include <deque>

#include "http/admin_client_actor.hpp"
#include "http/responses.hpp"

namespace ferry::http {
namespace {

namespace beast = boost::beast;
namespace bhttp = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
using tcp = net::ip::tcp;

// "host:port" of an Origin such as "http://host:port" (empty when it has no scheme).
std::string_view origin_authority(std::string_view origin) {
  const size_t scheme = origin.find("://");
  if (scheme == std::string_view::npos) return {};
  origin.remove_prefix(scheme + 3);
  return origin.substr(0, origin.find('/'));
}

class AdminSocket final : public AdminChannel, public std::enable_shared_from_this<AdminSocket> {
 public:
  AdminSocket(tcp::socket&& socket, std::shared_ptr<ServerContext> ctx)
      : ws_(std::move(socket)), ctx_(std::move(ctx)), limit_(ctx_->config.server.admin_queue_limit) {}

  ~AdminSocket() override {
    if (counted_) ctx_->admin_metrics.clients_open.fetch_sub(1);
  }

  void start(AdminUpgradeRequest req) {
    net::dispatch(ws_.get_executor(), [self = shared_from_this(), req = std::move(req)]() mutable {
      self->check_and_accept(std::move(req));
    });
  }

  // AdminChannel, from any thread:
  bool send(std::string text) override {
    if (gone_.load()) return false;
    if (queued_.fetch_add(1) >= limit_) {
      queued_.fetch_sub(1);
      gone_.store(true);
      net::post(ws_.get_executor(), [self = shared_from_this()] { self->drop(); });
      return false;
    }
    net::post(ws_.get_executor(), [self = shared_from_this(), text = std::move(text)]() mutable {
      self->enqueue(std::move(text));
    });
    return true;
  }

  void close(uint16_t code, std::string reason) override {
    net::post(ws_.get_executor(), [self = shared_from_this(), code, reason = std::move(reason)]() mutable {
      self->close_code_ = code;
      self->close_reason_ = std::move(reason);
      self->closing_ = true;
      if (!self->writing_) self->do_close();
    });
  }

 private:
  void refuse(unsigned status, std::string code, std::string message) {
    ctx_->admin_metrics.upgrades_refused.fetch_add(1);
    ApiError e = make_error(status, status == 401 ? "authentication_error" : "invalid_request_error", std::move(code),
                            std::move(message));
    auto res = std::make_shared<bhttp::response<bhttp::string_body>>(static_cast<bhttp::status>(status), 11);
    res->set(bhttp::field::server, "ferry");
    res->set(bhttp::field::content_type, "application/json");
    if (status == 401) res->set(bhttp::field::www_authenticate, "Bearer realm=\"ferry admin\"");
    res->keep_alive(false);
    res->body() = to_json(e);
    res->prepare_payload();
    auto& stream = beast::get_lowest_layer(ws_);
    stream.expires_after(std::chrono::seconds(10));
    bhttp::async_write(stream, *res, [self = shared_from_this(), res](beast::error_code, size_t) {
      beast::error_code ec;
      beast::get_lowest_layer(self->ws_).socket().shutdown(tcp::socket::shutdown_both, ec);
      beast::get_lowest_layer(self->ws_).socket().close(ec);
    });
  }

  void check_and_accept(AdminUpgradeRequest req) {
    const ServerContext& ctx = *ctx_;
    const config::ServerConfig& server = ctx.config.server;
    const ServerPhase phase = ctx.current_phase();
    if (phase != ServerPhase::ready && phase != ServerPhase::draining) {
      return refuse(503, "engine_unavailable",
                    phase == ServerPhase::loading ? "the model is still loading (GET /health shows progress)"
                                                  : "the model failed to load: " + ctx.load_failure);
    }
    const std::string_view origin = req[bhttp::field::origin];
    if (!origin.empty() && origin_authority(origin) != req[bhttp::field::host]) {
      return refuse(403, "cross_origin",
                    "the admin console takes WebSocket connections from its own page only (Origin '" +
                        std::string(origin) + "' is not this server)");
    }
    if (server.admin_token.empty() && !admin_listens_on_loopback(server)) {
      return refuse(403, "admin_token_required",
                    "the admin console listens on a non-loopback address without --admin-token: it is off");
    }
    bool authenticated = server.admin_token.empty();
    const std::string_view header = req[bhttp::field::authorization];
    if (!header.empty() && !server.admin_token.empty()) {
      const std::string_view scheme = "Bearer ";
      const bool bearer = header.size() > scheme.size() && beast::iequals(header.substr(0, scheme.size()), scheme);
      if (!bearer || !admin_token_matches(server.admin_token, std::string(header.substr(scheme.size())))) {
        return refuse(401, "invalid_admin_token", "a valid admin token is required: 'Authorization: Bearer <admin token>'");
      }
      authenticated = true;
    }
    ws_.set_option(websocket::stream_base::timeout{std::chrono::seconds(30), std::chrono::seconds(60), true});
    ws_.set_option(websocket::stream_base::decorator(
        [](websocket::response_type& res) { res.set(bhttp::field::server, "ferry"); }));
    ws_.read_message_max(64 * 1024);
    beast::get_lowest_layer(ws_).expires_never();  // the WebSocket keeps its own timeouts
    auto shared_req = std::make_shared<AdminUpgradeRequest>(std::move(req));
    ws_.async_accept(*shared_req, [self = shared_from_this(), shared_req, authenticated](beast::error_code ec) {
      self->on_accept(ec, authenticated);
    });
  }

  void on_accept(beast::error_code ec, bool authenticated) {
    if (ec) return;
    // A console's messages are small: a modest kernel buffer bounds what a console that stopped
    // reading holds, so it reaches --admin-queue-limit (and is dropped) within seconds.
    beast::get_lowest_layer(ws_).socket().set_option(net::socket_base::send_buffer_size(64 * 1024), ec);
    counted_ = true;
    ctx_->admin_metrics.clients_open.fetch_add(1);
    ctx_->admin_metrics.clients_total.fetch_add(1);
    AdminClientJob job;
    job.channel = shared_from_this();
    job.context = ctx_;
    job.authenticated = authenticated;
    client_ = ctx_->system->spawn(admin_client, std::move(job));
    do_read();
  }

  void do_read() {
    ws_.async_read(buffer_, [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec) return finish();
    std::string text = beast::buffers_to_string(buffer_.data());
    buffer_.consume(buffer_.size());
    caf::anon_send(client_, actors::admin_text_atom_v, std::move(text));
    do_read();
  }

  void enqueue(std::string text) {
    if (dropped_) return;
    queue_.push_back(std::move(text));
    if (!writing_) do_write();
  }

  void do_write() {
    if (queue_.empty() || dropped_) {
      if (closing_) do_close();
      return;
    }
    writing_ = true;
    ws_.text(true);
    ws_.async_write(net::buffer(queue_.front()), [self = shared_from_this()](beast::error_code ec, size_t) {
      self->writing_ = false;
      self->queue_.pop_front();
      self->queued_.fetch_sub(1);
      if (ec) return self->finish();
      self->do_write();
    });
  }

  void do_close() {
    if (close_sent_ || dropped_) return;
    close_sent_ = true;
    ws_.async_close(websocket::close_reason(static_cast<websocket::close_code>(close_code_), close_reason_),
                    [self = shared_from_this()](beast::error_code) { self->finish(); });
  }

  // The console stopped reading: it cannot take a close frame either, so the connection just ends.
  void drop() {
    if (dropped_) return;
    dropped_ = true;
    ctx_->admin_metrics.clients_dropped.fetch_add(1);
    beast::error_code ec;
    beast::get_lowest_layer(ws_).socket().shutdown(tcp::socket::shutdown_both, ec);
    beast::get_lowest_layer(ws_).socket().close(ec);
    finish();
  }

  void finish() {
    gone_.store(true);
    if (client_ && !told_) {
      told_ = true;
      caf::anon_send(client_, actors::client_gone_atom_v);
    }
  }

  websocket::stream<beast::tcp_stream> ws_;
  std::shared_ptr<ServerContext> ctx_;
  beast::flat_buffer buffer_;
  const uint32_t limit_;
  std::atomic<bool> gone_{false};
  std::atomic<uint32_t> queued_{0};
  actors::admin_client_actor client_;
  // Strand only:
  std::deque<std::string> queue_;
  bool writing_ = false;
  bool closing_ = false;
  bool close_sent_ = false;
  bool dropped_ = false;
  bool told_ = false;
  bool counted_ = false;
  uint16_t close_code_ = kCloseGoingAway;
  std::string close_reason_;
};

}  // namespace

bool admin_listens_on_loopback(const config::ServerConfig& server) {
  const std::string& host = server.admin_port != 0 ? server.admin_host : server.host;
  beast::error_code ec;
  const auto address = net::ip::make_address(host, ec);
  return !ec && address.is_loopback();
}

bool is_admin_websocket(std::string_view target) { return target.substr(0, target.find('?')) == "/admin/ws"; }

void serve_admin_websocket(const std::shared_ptr<ServerContext>& context, tcp::socket socket, AdminUpgradeRequest request) {
  std::make_shared<AdminSocket>(std::move(socket), context)->start(std::move(request));
}

}  // namespace ferry::http
