#pragma once
// What every HTTP session and bridge shares: the configuration, the server's phase, load progress,
// HTTP counters, and, once the model is loaded, the engine handles and the text side (tokenizer,
// chat template). Publication without a mutex: the main thread fills the "ready" fields, then stores
// phase = ready with release order; readers load the phase with acquire order before using them,
// and never see them change afterwards.
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/bootstrap.hpp"
#include "config/serve_config.hpp"
#include "model/text/chat_template.hpp"
#include "model/text/tokenizer.hpp"

namespace ferry::http {

class RequestRegistry;

enum class ServerPhase : uint8_t { loading, ready, draining, load_failed };

// Bytes of the model read so far; written by the loader, read by /health and the progress line.
struct LoadProgress {
  std::atomic<uint64_t> bytes_done{0};
  std::atomic<uint64_t> bytes_total{0};
  std::atomic<int64_t> started_ns{0};  // steady clock
  std::string stage_name;              // set before loading starts
};

// HTTP-side counters for /metrics. Atomics, written from every session's strand.
class HttpMetrics {
 public:
  enum Endpoint : size_t { chat, completions, models, health, metrics, slots, admin, other, endpoint_count };
  static constexpr std::array<unsigned, 15> codes = {200, 202, 400, 401, 403, 404, 405, 408, 413, 429, 431, 499, 500, 503, 0};
  static const char* endpoint_name(size_t e);

  void count(Endpoint e, unsigned status);
  uint64_t requests(size_t endpoint, size_t code_index) const { return requests_[endpoint][code_index].load(); }

  std::atomic<uint64_t> connections_open{0};
  std::atomic<int64_t> exchanges_open{0};  // requests read whose answer is not fully written yet
  std::atomic<uint64_t> connections_total{0};
  std::atomic<uint64_t> client_disconnects{0};  // clients gone before their answer was complete
  std::atomic<uint64_t> slow_clients{0};        // dropped because their event queue was full
  std::atomic<uint64_t> events_sent{0};
  // The connection cap and what it did (http_server.cpp):
  std::atomic<uint64_t> connection_limit{0};
  std::atomic<uint64_t> connections_evicted{0};       // idle ones closed to make room for a new one
  std::atomic<uint64_t> refused_connection_limit{0};  // 503: at the cap with every connection busy
  std::atomic<uint64_t> refused_open_file_limit{0};   // 503 (or nothing): no file descriptor left
  std::atomic<uint64_t> accept_pauses{0};             // accepting stopped until a connection closed
  std::atomic<uint64_t> read_timeouts{0};             // requests not read within --read-timeout

 private:
  std::array<std::array<std::atomic<uint64_t>, codes.size()>, endpoint_count> requests_{};
};

// The admin console's counters for /metrics (http/admin_ws.cpp).
struct AdminMetrics {
  std::atomic<int64_t> clients_open{0};
  std::atomic<uint64_t> clients_total{0};
  std::atomic<uint64_t> clients_dropped{0};   // stopped reading: dropped
  std::atomic<uint64_t> upgrades_refused{0};  // loading, foreign Origin, no token off loopback, wrong token
  // Admin client actors alive (not a metric): shutdown waits for them to release their sessions.
  mutable std::atomic<int64_t> client_actors{0};
};

struct ServerContext {
  config::ServeConfig config;
  caf::actor_system* system = nullptr;
  std::atomic<ServerPhase> phase{ServerPhase::loading};
  std::string load_failure;  // set before phase = load_failed
  LoadProgress progress;
  HttpMetrics metrics;
  // Live and recently ended requests with the key that made each. Set by HttpServer before it
  // listens; null where bridges run without a server (tests).
  std::shared_ptr<RequestRegistry> requests;
  AdminMetrics admin_metrics;
  int64_t started_unix = 0;

  // Set once, before phase = ready:
  actors::Engine engine;
  std::shared_ptr<const model::Tokenizer> tokenizer;
  model::ChatTemplate chat_template;
  std::vector<int32_t> end_token_ids;  // end-of-generation ids of the tokenizer
  std::string backend_name;

  ServerPhase current_phase() const { return phase.load(std::memory_order_acquire); }
};

}  // namespace ferry::http
