#include "http/http_server.hpp"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket/rfc6455.hpp>

#include <boost/asio/steady_timer.hpp>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <deque>
#include <functional>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "http/admin_ws.hpp"
#include "http/auth.hpp"
#include "http/connection_limiter.hpp"
#include "http/memory_release.hpp"
#include "http/request_registry.hpp"
#include "http/responses.hpp"
#include "http/router.hpp"
#include "http/server_limits.hpp"

namespace ferry::http {

namespace beast = boost::beast;
namespace bhttp = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

class Session;

std::chrono::milliseconds seconds(double s) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(s));
}

}  // namespace

// Accepts connections within the cap (ConnectionLimiter) on its own strand; sessions report to it
// when they wait for a request, begin one, and close.
class ConnectionListener : public std::enable_shared_from_this<ConnectionListener> {
 public:
  using Id = ConnectionLimiter::Id;
  ConnectionListener(net::io_context& ioc, std::shared_ptr<ServerContext> ctx, uint32_t limit);

  std::string open(const std::string& host, uint16_t port);
  void start();
  void stop();
  uint16_t port() const { return port_; }

  // From any thread (sessions' strands, their destructors):
  void connection_idle(Id id);
  void connection_busy(Id id);
  void connection_closed(Id id);

 private:
  void accept();
  void on_accept(beast::error_code ec, tcp::socket socket);
  void out_of_file_descriptors();
  void pause();
  void resume();
  void evict(Id id);
  void refuse(int fd);
  void log_limit_reached(bool refusing);

  net::io_context& ioc_;
  net::strand<net::io_context::executor_type> strand_;
  tcp::acceptor acceptor_;
  net::steady_timer retry_;
  std::shared_ptr<ServerContext> ctx_;
  // Strand only:
  ConnectionLimiter limiter_;
  std::unordered_map<Id, std::weak_ptr<Session>> sessions_;
  Id next_id_ = 1;
  bool paused_ = false;
  int spare_fd_ = -1;  // given up for a moment, out of file descriptors, to answer one client 503
  std::string refusal_;
  // Episodes, so that an attack logs a line when it starts and one when it ends, not one per connection.
  bool at_limit_ = false, refusing_ = false, out_of_fds_ = false;
  uint64_t evicted_at_start_ = 0, refused_at_start_ = 0;
  uint16_t port_ = 0;
};

namespace {

// The ResponseChannel of one request on one connection. Its methods run on any thread and post to
// the session's strand; the only state shared across threads is two atomics.
class Exchange final : public ResponseChannel, public std::enable_shared_from_this<Exchange> {
 public:
  Exchange(std::shared_ptr<Session> session, uint32_t event_limit) : session_(std::move(session)), limit_(event_limit) {}

  void send_json(unsigned status, std::string body, HeaderList headers) override;
  void start_events() override;
  bool send_event(std::string payload) override;
  void end_events() override;
  void on_client_gone(std::function<void()> callback) override;

  // On the strand: the client left (or stalled) before the exchange ended.
  void client_gone() {
    gone.store(true);
    if (on_gone_ && !notified_) {
      notified_ = true;
      on_gone_();
    }
  }
  void set_callback(std::function<void()> callback) {
    on_gone_ = std::move(callback);
    if (on_gone_ && gone.load()) client_gone();
  }

  std::atomic<bool> gone{false};
  std::atomic<uint32_t> queued_events{0};

 private:
  std::shared_ptr<Session> session_;  // keeps the session until the bridge is done with it
  uint32_t limit_;
  std::function<void()> on_gone_;  // strand only
  bool notified_ = false;          // strand only
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket&& socket, std::shared_ptr<ServerContext> context, std::shared_ptr<ConnectionListener> listener,
          ConnectionLimiter::Id id)
      : stream_(std::move(socket)), ctx_(std::move(context)), listener_(std::move(listener)), id_(id) {
    ctx_->metrics.connections_open.fetch_add(1);
    ctx_->metrics.connections_total.fetch_add(1);
  }
  ~Session() {
    ctx_->metrics.connections_open.fetch_sub(1);
    listener_->connection_closed(id_);
  }

  void run() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      // A new connection's first request must arrive whole within the read deadline of the accept.
      self->stream_.expires_after(seconds(self->ctx_->config.server.read_timeout_s));
      self->do_read();
    });
  }
  net::any_io_executor executor() { return stream_.get_executor(); }

  // At the connection cap: closes the connection if it still waits for a request (else it stays).
  // Bytes already in the socket are a request about to be read: not idle after all.
  void evict() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      beast::error_code ec;
      if (self->waiting_ && !self->closed_ && self->stream_.socket().available(ec) == 0) self->close();
    });
  }

  // The exchange's calls, on the strand. A call from an exchange that is no longer current is dropped.
  void respond(Exchange* ex, unsigned status, std::string body, HeaderList headers) {
    if (!current(ex) || started_) return;
    bhttp::response<bhttp::string_body> res{static_cast<bhttp::status>(status), version_};
    res.set(bhttp::field::server, "ferry");
    bool has_type = false;
    for (auto& [name, value] : headers) {
      has_type = has_type || beast::iequals(name, "Content-Type");
      res.set(name, value);
    }
    if (!has_type) res.set(bhttp::field::content_type, "application/json");
    res.body() = std::move(body);
    keep_alive_ = keep_alive_ && ctx_->current_phase() != ServerPhase::draining;
    res.keep_alive(keep_alive_);
    res.prepare_payload();
    std::ostringstream out;
    out << res;
    started_ = done_ = true;
    ctx_->metrics.count(endpoint_, status);
    enqueue(out.str(), false);
  }

  void begin_events(Exchange* ex) {
    if (!current(ex) || started_) return;
    bhttp::response<bhttp::empty_body> res{bhttp::status::ok, version_};
    res.set(bhttp::field::server, "ferry");
    res.set(bhttp::field::content_type, "text/event-stream");
    res.set(bhttp::field::cache_control, "no-cache");
    keep_alive_ = keep_alive_ && ctx_->current_phase() != ServerPhase::draining;
    // HTTP/1.0 has no chunked encoding: the stream is the rest of the connection.
    chunked_ = version_ >= 11;
    if (!chunked_) keep_alive_ = false;
    res.keep_alive(keep_alive_);
    res.chunked(chunked_);
    std::ostringstream out;
    out << res.base();
    started_ = true;
    ctx_->metrics.count(endpoint_, 200);
    enqueue(out.str(), false);
  }

  void push_event(Exchange* ex, const std::string& payload) {
    if (!current(ex) || !started_ || done_) {
      ex->queued_events.fetch_sub(1);
      return;
    }
    // Once per token per stream: one string, no stream object.
    ctx_->metrics.events_sent.fetch_add(1);
    const size_t event_bytes = payload.size() + 8;  // "data: " + payload + "\n\n"
    std::string out;
    out.reserve(event_bytes + 20);
    if (chunked_) {
      char hex[16];
      const char* end = std::to_chars(hex, hex + sizeof hex, event_bytes, 16).ptr;
      out.append(hex, static_cast<size_t>(end - hex)).append("\r\n");
    }
    out.append("data: ").append(payload).append("\n\n");
    if (chunked_) out.append("\r\n");
    enqueue(std::move(out), true);
  }

  void finish_events(Exchange* ex) {
    if (!current(ex) || !started_ || done_) return;
    done_ = true;
    enqueue(chunked_ ? "0\r\n\r\n" : "", false);
  }

  void set_gone_callback(Exchange* ex, std::function<void()> callback) {
    if (current(ex)) ex->set_callback(std::move(callback));
  }

  // The exchange's event queue overflowed: the client is not reading.
  void client_stalled(Exchange* ex) {
    if (!current(ex)) return;
    ctx_->metrics.slow_clients.fetch_add(1);
    client_left();
  }

 private:
  bool current(Exchange* ex) const {
    auto live = exchange_.lock();
    return !closed_ && live && live.get() == ex;
  }

  // Waits for a request's first byte (idle: the listener may close the connection for a new one),
  // then reads the rest within the read deadline.
  void do_read() {
    parser_.emplace();
    parser_->body_limit(ctx_->config.server.max_body_bytes);
    parser_->header_limit(64 * 1024);
    if (buffer_.size() > 0) return begin_request();  // a pipelined request is already here
    waiting_ = true;
    if (!fresh_) {
      listener_->connection_idle(id_);
      stream_.expires_after(seconds(ctx_->config.server.idle_timeout_s));
    }
    stream_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->waiting_ = false;
      if (self->closed_) return;
      if (ec) {
        if (ec == beast::error::timeout && self->fresh_) self->ctx_->metrics.read_timeouts.fetch_add(1);
        return self->close();
      }
      self->buffer_.commit(n);
      self->begin_request();
    });
  }

  void begin_request() {
    waiting_ = false;
    listener_->connection_busy(id_);
    if (!fresh_) stream_.expires_after(seconds(ctx_->config.server.read_timeout_s));
    fresh_ = false;
    bhttp::async_read(stream_, buffer_, *parser_,
                      [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (closed_) return;
    if (ec == beast::error::timeout) {
      ctx_->metrics.read_timeouts.fetch_add(1);  // the request began and did not arrive in time
      return close();
    }
    if (ec == bhttp::error::end_of_stream || ec == net::error::eof ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted) {
      return close();
    }
    if (ec) {
      // The request cannot be framed any further: answer once and close the connection.
      keep_alive_ = false;
      ApiError e;
      if (ec == bhttp::error::body_limit) {
        e = invalid_field("", "the request body is larger than the limit of " +
                                  std::to_string(ctx_->config.server.max_body_bytes) + " bytes (--max-body)",
                          "body_too_large");
        e.status = 413;
      } else if (ec == bhttp::error::header_limit) {
        e = invalid_field("", "the request headers are larger than 64 KiB", "headers_too_large");
        e.status = 431;
      } else {
        e = invalid_field("", "malformed HTTP request: " + ec.message(), "bad_http");
      }
      const std::shared_ptr<Exchange> ex = start_exchange(HttpMetrics::other);
      respond(ex.get(), e.status, to_json(e), {});
      return;
    }
    bhttp::request<bhttp::string_body> req = parser_->release();
    if (beast::websocket::is_upgrade(req) && is_admin_websocket(req.target()) && ctx_->config.server.admin_port == 0) {
      closed_ = true;  // the admin console's WebSocket owns the connection from here
      return serve_admin_websocket(ctx_, stream_.release_socket(), std::move(req));
    }
    keep_alive_ = req.keep_alive();
    version_ = req.version();
    HttpRequest request;
    request.method = std::string(req.method_string());
    request.target = std::string(req.target());
    request.authorization = std::string(req[bhttp::field::authorization]);
    request.body = std::move(req.body());
    const bool large = request.body.size() >= kLargeBodyBytes;
    std::shared_ptr<Exchange> ex = start_exchange(HttpMetrics::other);
    endpoint_ = route(ctx_, std::move(request), ex);
    // The body and its parse are freed by now (what a bridge took is released when it ends).
    if (large) release_free_memory();
    watch();
  }

  std::shared_ptr<Exchange> start_exchange(HttpMetrics::Endpoint endpoint) {
    stream_.expires_never();  // a request may take long; writes re-arm the timer
    auto ex = std::make_shared<Exchange>(shared_from_this(), ctx_->config.server.sse_queue_limit);
    exchange_ = ex;  // weak: whoever answers (the router's post, a bridge) holds it
    endpoint_ = endpoint;
    started_ = done_ = false;
    in_exchange_ = true;
    ctx_->metrics.exchanges_open.fetch_add(1);
    return ex;
  }

  // While an answer is in progress, a zero-byte read (peek) tells when the client leaves.
  void watch() {
    if (watching_ || closed_) return;
    watching_ = true;
    stream_.socket().async_receive(
        net::buffer(peek_, 1), tcp::socket::message_peek,
        [self = shared_from_this(), watched = exchange_](beast::error_code ec, size_t n) {
          self->watching_ = false;
          if (self->closed_) return;
          const auto current = self->exchange_.lock();
          if (!current) return;
          // A peek cancelled at the end of an earlier answer may complete after the next request
          // was read: it says nothing about this one, which gets its own watch.
          if (current != watched.lock()) return self->watch();
          if (ec == net::error::operation_aborted) return;
          if (ec || n == 0) self->client_left();
          // n > 0: the client sent more (a pipelined request); it is read once this answer is out.
        });
  }

  void client_left() {
    if (auto ex = exchange_.lock()) {
      ctx_->metrics.client_disconnects.fetch_add(1);
      ex->client_gone();
    }
    close();
  }

  void enqueue(std::string bytes, bool event) {
    queue_.push_back(Pending{std::move(bytes), event});
    if (writing_.empty()) do_write();
  }

  void do_write() {
    if (closed_) return;
    // Everything queued goes out in one write: a burst of events costs one system call.
    while (!queue_.empty()) {
      writing_.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    std::vector<net::const_buffer> buffers;
    for (const auto& p : writing_) buffers.emplace_back(net::buffer(p.bytes));
    stream_.expires_after(seconds(ctx_->config.server.idle_timeout_s));
    net::async_write(stream_, buffers, [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
  }

  void on_write(beast::error_code ec) {
    uint32_t events = 0;
    for (const auto& p : writing_) events += p.event ? 1 : 0;
    writing_.clear();
    if (auto ex = exchange_.lock()) ex->queued_events.fetch_sub(events);
    if (closed_) return;
    if (ec) return client_left();
    stream_.expires_never();
    if (!queue_.empty()) return do_write();
    if (done_) {
      end_exchange();
      // The watch's peek must not stay queued beside the next read: with edge-triggered epoll the
      // first read op to complete can leave the other waiting for a readiness event that never comes.
      if (watching_) {
        beast::error_code ignored;
        stream_.socket().cancel(ignored);
      }
      if (!keep_alive_) return linger();
      do_read();
    }
  }

  // Closing with unread request bytes in the socket makes the kernel reset the connection, and the
  // client may lose the answer (a 413 to a body still being sent): half-close, then read and drop
  // what still comes, for a few seconds at most.
  void linger() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return close();
    drain_.resize(64 * 1024);
    stream_.expires_after(std::chrono::seconds(5));
    drain_more();
  }

  void drain_more() {
    stream_.async_read_some(net::buffer(drain_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->close();
      self->drain_more();
    });
  }

  void end_exchange() {
    if (auto ex = exchange_.lock()) ex->set_callback({});  // answered: nobody to tell any more
    exchange_.reset();
    if (in_exchange_) ctx_->metrics.exchanges_open.fetch_sub(1);
    in_exchange_ = false;
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    end_exchange();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
  }

  struct Pending {
    std::string bytes;
    bool event;
  };

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::shared_ptr<ServerContext> ctx_;
  std::shared_ptr<ConnectionListener> listener_;
  ConnectionLimiter::Id id_;
  bool fresh_ = true;     // no request read yet: the read deadline counts from the accept
  bool waiting_ = false;  // waiting for a request's first byte
  std::weak_ptr<Exchange> exchange_;  // the request being answered
  HttpMetrics::Endpoint endpoint_ = HttpMetrics::other;
  bool keep_alive_ = true;
  unsigned version_ = 11;
  bool started_ = false;  // the status line of the current answer is queued
  bool done_ = false;     // its last bytes are queued
  bool closed_ = false;
  bool watching_ = false;
  bool in_exchange_ = false;
  bool chunked_ = true;  // the SSE stream's framing (HTTP/1.1)
  std::deque<Pending> queue_;
  std::vector<Pending> writing_;
  std::vector<char> drain_;
  char peek_[1] = {};
};

void Exchange::send_json(unsigned status, std::string body, HeaderList headers) {
  net::post(session_->executor(), [self = shared_from_this(), status, body = std::move(body),
                                   headers = std::move(headers)]() mutable {
    self->session_->respond(self.get(), status, std::move(body), std::move(headers));
  });
}

void Exchange::start_events() {
  net::post(session_->executor(), [self = shared_from_this()] { self->session_->begin_events(self.get()); });
}

bool Exchange::send_event(std::string payload) {
  if (gone.load()) return false;
  // Back-pressure (STYLE rule 10): a client that lets `limit_` events pile up is not reading.
  if (queued_events.fetch_add(1) >= limit_) {
    queued_events.fetch_sub(1);
    gone.store(true);
    net::post(session_->executor(), [self = shared_from_this()] { self->session_->client_stalled(self.get()); });
    return false;
  }
  net::post(session_->executor(), [self = shared_from_this(), payload = std::move(payload)] {
    self->session_->push_event(self.get(), payload);
  });
  return true;
}

void Exchange::end_events() {
  net::post(session_->executor(), [self = shared_from_this()] { self->session_->finish_events(self.get()); });
}

void Exchange::on_client_gone(std::function<void()> callback) {
  net::post(session_->executor(), [self = shared_from_this(), callback = std::move(callback)]() mutable {
    self->session_->set_gone_callback(self.get(), std::move(callback));
  });
}

}  // namespace

ConnectionListener::ConnectionListener(net::io_context& ioc, std::shared_ptr<ServerContext> ctx, uint32_t limit)
    : ioc_(ioc), strand_(net::make_strand(ioc)), acceptor_(strand_), retry_(strand_), ctx_(std::move(ctx)), limiter_(limit) {
  ctx_->metrics.connection_limit.store(limit);
  ApiError e = make_error(503, "server_error", "too_many_connections",
                          "the server has too many open connections (--max-connections " + std::to_string(limit) +
                              " or its open-file limit); retry later");
  const std::string body = to_json(e);
  refusal_ = "HTTP/1.1 503 Service Unavailable\r\nServer: ferry\r\nContent-Type: application/json\r\nRetry-After: " +
             std::to_string(ctx_->config.slots.retry_after_s) + "\r\nConnection: close\r\nContent-Length: " +
             std::to_string(body.size()) + "\r\n\r\n" + body;
}

std::string ConnectionListener::open(const std::string& host, uint16_t port) {
  beast::error_code ec;
  const auto address = net::ip::make_address(host, ec);
  if (ec) return "--host '" + host + "' is not an IP address: " + ec.message();
  const tcp::endpoint endpoint{address, port};
  const std::string where = host + ":" + std::to_string(port);
  acceptor_.open(endpoint.protocol(), ec);
  if (ec) return "cannot open a socket for " + where + ": " + ec.message();
  acceptor_.set_option(net::socket_base::reuse_address(true), ec);
  acceptor_.bind(endpoint, ec);
  if (ec) return "cannot listen on " + where + ": " + ec.message();
  acceptor_.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return "cannot listen on " + where + ": " + ec.message();
  port_ = acceptor_.local_endpoint(ec).port();
  spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  return {};
}

void ConnectionListener::start() {
  net::dispatch(strand_, [self = shared_from_this()] { self->accept(); });
}

void ConnectionListener::stop() {
  net::post(strand_, [self = shared_from_this()] {
    beast::error_code ec;
    self->acceptor_.close(ec);
    self->retry_.cancel();
    if (self->spare_fd_ >= 0) ::close(self->spare_fd_);
    self->spare_fd_ = -1;
  });
}

void ConnectionListener::connection_idle(Id id) {
  net::post(strand_, [self = shared_from_this(), id] { self->limiter_.idle(id); });
}

void ConnectionListener::connection_busy(Id id) {
  net::post(strand_, [self = shared_from_this(), id] {
    // Chosen to make room but already into a request: its descriptor will not come free, look again.
    if (self->limiter_.busy(id)) self->resume();
  });
}

void ConnectionListener::connection_closed(Id id) {
  net::post(strand_, [self = shared_from_this(), id] {
    self->limiter_.closed(id);
    self->sessions_.erase(id);
    const auto& m = self->ctx_->metrics;
    if (self->at_limit_ && self->limiter_.live() < self->limiter_.limit() - self->limiter_.limit() / 10) {
      spdlog::info("connections: below the limit again ({} open); meanwhile {} idle connections were closed for new "
                   "ones and {} new ones refused",
                   self->limiter_.open(), m.connections_evicted.load() - self->evicted_at_start_,
                   m.refused_connection_limit.load() - self->refused_at_start_);
      self->at_limit_ = self->refusing_ = false;
    }
    self->resume();
  });
}

void ConnectionListener::accept() {
  acceptor_.async_accept(net::make_strand(ioc_), [self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
    self->on_accept(ec, std::move(socket));
  });
}

namespace {

bool out_of_descriptors(const beast::error_code& ec) {
  return ec == net::error::no_descriptors || ec == net::error::no_buffer_space || ec == net::error::no_memory ||
         ec == beast::error_code(ENFILE, boost::system::system_category());
}

}  // namespace

void ConnectionListener::on_accept(beast::error_code ec, tcp::socket socket) {
  if (ec == net::error::operation_aborted || !acceptor_.is_open()) return;
  if (ec) {
    if (out_of_descriptors(ec)) return out_of_file_descriptors();
    return accept();  // the client gave up before the accept (ECONNABORTED): nothing to do
  }
  if (out_of_fds_) {
    spdlog::info("connections: file descriptors available again ({} open)", limiter_.open());
    out_of_fds_ = false;
  }
  const Id id = next_id_++;
  const ConnectionLimiter::Admission admission = limiter_.admit(id);
  if (admission.verdict == ConnectionLimiter::Verdict::refuse) {
    log_limit_reached(true);
    ctx_->metrics.refused_connection_limit.fetch_add(1);
    refuse(socket.release());
    return accept();
  }
  if (admission.verdict == ConnectionLimiter::Verdict::admit_after_evicting) {
    log_limit_reached(false);
    evict(admission.evict);
  }
  socket.set_option(tcp::no_delay(true), ec);
  auto session = std::make_shared<Session>(std::move(socket), ctx_, shared_from_this(), id);
  sessions_.emplace(id, session);
  session->run();
  accept();
}

void ConnectionListener::log_limit_reached(bool refusing) {
  const auto& m = ctx_->metrics;
  if (!at_limit_) {
    at_limit_ = true;
    evicted_at_start_ = m.connections_evicted.load();
    refused_at_start_ = m.refused_connection_limit.load();
    spdlog::warn("connections: the limit of {} is reached (--max-connections); each new connection closes the "
                 "longest-idle one, or gets 503 when every connection is busy",
                 limiter_.limit());
  }
  if (refusing && !refusing_) {
    refusing_ = true;
    spdlog::warn("connections: all {} connections are busy: new connections get 503 until one closes", limiter_.open());
  }
}

void ConnectionListener::evict(Id id) {
  ctx_->metrics.connections_evicted.fetch_add(1);
  const auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  if (auto session = it->second.lock()) session->evict();
}

// The listening socket stays readable while the queue holds connections, so an accept that fails
// for want of a descriptor would fail again at once: retrying at once is what spun two threads at
// 1.4 cores. Make room instead, or wait for it.
void ConnectionListener::out_of_file_descriptors() {
  if (!out_of_fds_) {
    out_of_fds_ = true;
    ctx_->metrics.accept_pauses.fetch_add(1);
    spdlog::warn("connections: out of file descriptors with {} connections open (the open-file limit; see "
                 "--max-connections): closing idle ones, else refusing new ones until a connection closes",
                 limiter_.open());
  }
  if (const auto victim = limiter_.evict_one()) {
    evict(*victim);
    return pause();  // its close frees the descriptor the waiting client needs
  }
  if (spare_fd_ >= 0) {
    // One descriptor kept for this: enough to tell the next client 503 instead of nothing.
    ::close(spare_fd_);
    const int fd = ::accept4(acceptor_.native_handle(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      ctx_->metrics.refused_open_file_limit.fetch_add(1);
      refuse(fd);
    }
    spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd >= 0 && spare_fd_ >= 0) return accept();
  }
  pause();
}

void ConnectionListener::pause() {
  if (paused_) return;
  paused_ = true;
  // A descriptor may also come free elsewhere (a file closed): look again after a second regardless.
  retry_.expires_after(std::chrono::seconds(1));
  retry_.async_wait([self = shared_from_this()](beast::error_code ec) {
    if (!ec) self->resume();
  });
}

void ConnectionListener::resume() {
  if (!paused_ || !acceptor_.is_open()) return;
  paused_ = false;
  retry_.cancel();
  if (spare_fd_ < 0) spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  accept();
}

// 503 and close, without a session: read what the client already sent (closing over unread bytes
// resets the connection, and the client may lose the answer), write the answer, which fits an
// empty send buffer, and close.
void ConnectionListener::refuse(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  char sink[4096];
  for (int i = 0; i < 16 && ::recv(fd, sink, sizeof sink, 0) > 0; ++i) {
  }
  [[maybe_unused]] const ssize_t sent = ::send(fd, refusal_.data(), refusal_.size(), MSG_NOSIGNAL);
  ::shutdown(fd, SHUT_WR);
  ::close(fd);
}

HttpServer::HttpServer(net::io_context& ioc, std::shared_ptr<ServerContext> context)
    : ioc_(ioc), context_(std::move(context)) {
  if (!context_->requests) context_->requests = std::make_shared<RequestRegistry>(ioc_.get_executor());
}

HttpServer::~HttpServer() = default;

std::string HttpServer::listen(const std::string& host, uint16_t port) {
  const config::ServerConfig& server = context_->config.server;
  const OpenFileLimit files = raise_open_file_limit();
  const uint32_t limit = connection_limit(server, files.now);
  spdlog::info("connections: at most {}{}; open-file limit {}{}", limit,
               server.max_connections == 0 ? " (--max-connections auto: half the open-file limit)" : "", files.now,
               files.before < files.now ? " (raised from " + std::to_string(files.before) + ")" : "");
  if (limit + 64 > files.now) {
    spdlog::warn("connections: --max-connections {} is not below the open-file limit {}: past it new connections "
                 "wait or get 503 until one closes",
                 limit, files.now);
  }
  if (auto warning = public_bind_warning(host, key_count(server))) spdlog::warn("{}", *warning);
  listener_ = std::make_shared<ConnectionListener>(ioc_, context_, limit);
  std::string error = listener_->open(host, port);
  if (!error.empty()) {
    listener_.reset();
    return error;
  }
  listener_->start();
  return {};
}

uint16_t HttpServer::port() const { return listener_ ? listener_->port() : 0; }

void HttpServer::close() {
  if (listener_) listener_->stop();
}

}  // namespace ferry::http
