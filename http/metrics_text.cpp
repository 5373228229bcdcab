#include "http/metrics_text.hpp"

#include <algorithm>
#include <charconv>

namespace ferry::http {

const char* HttpMetrics::endpoint_name(size_t e) {
  static constexpr const char* names[] = {"chat_completions", "completions", "models", "health",
                                          "metrics",          "slots",       "admin",  "other"};
  return e < endpoint_count ? names[e] : "other";
}

void HttpMetrics::count(Endpoint e, unsigned status) {
  size_t code = codes.size() - 1;  // the last entry (0) collects every other status
  for (size_t i = 0; i + 1 < codes.size(); ++i) {
    if (codes[i] == status) code = i;
  }
  requests_[e < endpoint_count ? e : other][code].fetch_add(1, std::memory_order_relaxed);
}

namespace {

// The shortest text that reads back as `v` ("0.1", not "0.10000000000000001").
std::string number(double v) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, end) : "NaN";
}

class Writer {
 public:
  void header(const char* name, const char* type, const char* help) {
    out_ += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void sample(const std::string& name, double value, const std::string& labels = {}) {
    out_ += name;
    if (!labels.empty()) out_ += "{" + labels + "}";
    out_ += " " + number(value) + "\n";
  }
  void metric(const char* name, const char* type, const char* help, double value) {
    header(name, type, help);
    sample(name, value);
  }
  void histogram(const char* name, const char* help, const actors::HistogramSnapshot& h) {
    header(name, "histogram", help);
    for (size_t i = 0; i < h.counts.size(); ++i) {
      const std::string le = i < h.bounds.size() ? number(h.bounds[i]) : "+Inf";
      sample(std::string(name) + "_bucket", static_cast<double>(h.counts[i]), "le=\"" + le + "\"");
    }
    sample(std::string(name) + "_sum", h.sum);
    sample(std::string(name) + "_count", static_cast<double>(h.count));
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

std::string stage_label(const actors::StageStatus& s) {
  return "stage=\"" + std::to_string(s.index) + "\",layers=\"" + s.layers + "\"";
}

}  // namespace

std::string render_metrics(const ServerContext& ctx, const std::optional<actors::EngineSnapshot>& engine) {
  Writer w;
  const ServerPhase phase = ctx.current_phase();
  w.header("ferry_up", "gauge", "1 while serving requests, 0 while loading, draining or failed");
  w.sample("ferry_up", phase == ServerPhase::ready && !(engine && engine->failed) ? 1 : 0);
  w.metric("ferry_model_load_bytes_done", "gauge", "model bytes read at start-up",
           static_cast<double>(ctx.progress.bytes_done.load()));
  // A gauge: no _total suffix, which Prometheus reserves for counters (promtool check metrics).
  w.metric("ferry_model_size_bytes", "gauge", "model bytes to read at start-up",
           static_cast<double>(ctx.progress.bytes_total.load()));

  const HttpMetrics& m = ctx.metrics;
  w.header("ferry_http_requests_total", "counter", "HTTP requests answered, by endpoint and status code");
  for (size_t e = 0; e < HttpMetrics::endpoint_count; ++e) {
    for (size_t c = 0; c < HttpMetrics::codes.size(); ++c) {
      const uint64_t n = m.requests(e, c);
      if (n == 0) continue;
      const std::string code = HttpMetrics::codes[c] == 0 ? "other" : std::to_string(HttpMetrics::codes[c]);
      w.sample("ferry_http_requests_total", static_cast<double>(n),
               std::string("endpoint=\"") + HttpMetrics::endpoint_name(e) + "\",code=\"" + code + "\"");
    }
  }
  w.metric("ferry_http_connections_open", "gauge", "open HTTP connections", static_cast<double>(m.connections_open.load()));
  w.metric("ferry_http_connections_total", "counter", "HTTP connections accepted",
           static_cast<double>(m.connections_total.load()));
  w.metric("ferry_http_client_disconnects_total", "counter", "clients that left before their answer was complete",
           static_cast<double>(m.client_disconnects.load()));
  w.metric("ferry_http_slow_clients_total", "counter", "streams dropped because the client stopped reading",
           static_cast<double>(m.slow_clients.load()));
  w.metric("ferry_http_sse_events_total", "counter", "server-sent events queued", static_cast<double>(m.events_sent.load()));
  w.metric("ferry_http_connection_limit", "gauge", "open connections at most (--max-connections)",
           static_cast<double>(m.connection_limit.load()));
  w.metric("ferry_http_connections_evicted_total", "counter",
           "idle connections closed at the connection limit to make room for a new one",
           static_cast<double>(m.connections_evicted.load()));
  w.header("ferry_http_connections_refused_total", "counter",
           "new connections answered 503 and closed: at the connection limit with every connection busy, or with no "
           "file descriptor left");
  w.sample("ferry_http_connections_refused_total", static_cast<double>(m.refused_connection_limit.load()),
           "reason=\"connection_limit\"");
  w.sample("ferry_http_connections_refused_total", static_cast<double>(m.refused_open_file_limit.load()),
           "reason=\"open_file_limit\"");
  w.metric("ferry_http_accept_pauses_total", "counter",
           "times accepting stopped, out of file descriptors, until a connection closed",
           static_cast<double>(m.accept_pauses.load()));
  w.metric("ferry_http_read_timeouts_total", "counter", "requests whose headers and body did not arrive within --read-timeout",
           static_cast<double>(m.read_timeouts.load()));
  const AdminMetrics& a = ctx.admin_metrics;
  w.metric("ferry_admin_clients", "gauge", "admin consoles connected to /admin/ws",
           static_cast<double>(a.clients_open.load()));
  w.metric("ferry_admin_connections_total", "counter", "admin console WebSocket connections accepted",
           static_cast<double>(a.clients_total.load()));
  w.metric("ferry_admin_clients_dropped_total", "counter", "admin consoles dropped because they stopped reading",
           static_cast<double>(a.clients_dropped.load()));
  w.metric("ferry_admin_upgrades_refused_total", "counter",
           "admin WebSocket upgrades refused (loading, foreign origin, no token off loopback, wrong token)",
           static_cast<double>(a.upgrades_refused.load()));

  if (engine) {
    const auto& e = *engine;
    w.metric("ferry_queue_length", "gauge", "requests waiting for a slot", e.queued);
    w.metric("ferry_queue_limit", "gauge", "requests that may wait before 429", e.queue_limit);
    w.header("ferry_slots", "gauge", "slots by state");
    uint32_t idle = 0, prefilling = 0, decoding = 0;
    for (const auto& s : e.slots) {
      if (!s.busy) ++idle;
      else if (s.status == actors::RequestStatus::prefilling) ++prefilling;
      else ++decoding;
    }
    w.sample("ferry_slots", idle, "state=\"idle\"");
    w.sample("ferry_slots", prefilling, "state=\"prefilling\"");
    w.sample("ferry_slots", decoding, "state=\"decoding\"");
    w.metric("ferry_steps_total", "counter", "engine steps run", static_cast<double>(e.steps));
    w.metric("ferry_prompt_tokens_total", "counter", "prompt tokens computed (cache hits excluded)",
             static_cast<double>(e.prompt_tokens));
    w.metric("ferry_prompt_tokens_cached_total", "counter", "prompt tokens reused from a slot's cached prefix",
             static_cast<double>(e.cached_tokens));
    w.metric("ferry_generation_tokens_total", "counter", "tokens generated", static_cast<double>(e.generated_tokens));
    w.metric("ferry_mtp_draft_tokens_total", "counter", "MTP draft tokens verified", static_cast<double>(e.draft_tokens));
    w.metric("ferry_mtp_accepted_tokens_total", "counter", "MTP draft tokens accepted",
             static_cast<double>(e.accepted_tokens));
    w.header("ferry_requests_finished_total", "counter", "requests ended, by how they ended");
    for (size_t i = 0; i < e.finished_by_status.size(); ++i) {
      const auto status = static_cast<actors::RequestStatus>(i);
      if (!actors::is_terminal(status)) continue;
      w.sample("ferry_requests_finished_total", static_cast<double>(e.finished_by_status[i]),
               std::string("status=\"") + std::string(actors::status_name(status)) + "\"");
    }
    w.metric("ferry_draining", "gauge", "1 while shutting down", e.draining ? 1 : 0);
    w.metric("ferry_backend_failed", "gauge", "1 after the backend failed", e.failed ? 1 : 0);
    w.histogram("ferry_step_seconds", "time of one engine step at the stage", e.step_seconds);
    w.histogram("ferry_time_to_first_token_seconds", "request submitted to its first token", e.ttft_seconds);
    w.histogram("ferry_inter_token_latency_seconds", "time between consecutive tokens of a request", e.itl_seconds);
    w.histogram("ferry_queue_wait_seconds", "time a request waited for a slot", e.queue_seconds);
    // One sample per stage under one header.
    const auto per_stage = [&](const char* name, const char* type, const char* help, auto value) {
      w.header(name, type, help);
      for (const auto& s : e.stages) w.sample(name, static_cast<double>(value(s)), stage_label(s));
    };
    using Stage = actors::StageStatus;
    per_stage("ferry_stage_steps_total", "counter", "steps each pipeline stage ran", [](const Stage& s) { return s.steps; });
    per_stage("ferry_stage_rows_total", "counter", "rows each pipeline stage ran", [](const Stage& s) { return s.rows; });
    per_stage("ferry_stage_handoff_bytes_total", "counter", "bytes each stage handed to the next",
              [](const Stage& s) { return s.handoff_bytes; });
    // The resident KV window (gpu/kv_window.hpp): zero where a stage keeps every row on its device.
    per_stage("ferry_stage_kv_window_rows", "gauge", "device latent rows of the stage's resident KV windows",
              [](const Stage& s) { return s.kv.window_rows; });
    per_stage("ferry_stage_kv_resident_rows", "gauge", "window rows holding a row now",
              [](const Stage& s) { return s.kv.resident_rows; });
    per_stage("ferry_stage_kv_hits_total", "counter", "decode selections found in the resident window",
              [](const Stage& s) { return s.kv.hits; });
    per_stage("ferry_stage_kv_fetched_rows_total", "counter", "latent rows copied from the host KV tier into the window",
              [](const Stage& s) { return s.kv.fetched_rows; });
    per_stage("ferry_stage_kv_fetched_bytes_total", "counter", "bytes copied from the host KV tier into the window",
              [](const Stage& s) { return s.kv.fetched_bytes; });
    per_stage("ferry_stage_kv_last_step_fetched_rows", "gauge", "rows the last windowed step fetched",
              [](const Stage& s) { return s.kv.last_fetched_rows; });
    per_stage("ferry_stage_kv_last_step_fetched_bytes", "gauge", "bytes the last windowed step fetched",
              [](const Stage& s) { return s.kv.last_fetched_bytes; });
    w.header("ferry_stage_kv_hit_ratio", "gauge", "hits / (hits + fetched rows) of the window since start (1 before any)");
    for (const auto& s : e.stages) {
      const double all = static_cast<double>(s.kv.hits + s.kv.fetched_rows);
      w.sample("ferry_stage_kv_hit_ratio", all > 0 ? static_cast<double>(s.kv.hits) / all : 1.0, stage_label(s));
    }
    w.header("ferry_stage_kv_host_bytes", "gauge", "host KV tier bytes a slot's rows take on the stage");
    for (const auto& s : e.stages) {
      for (size_t i = 0; i < s.kv.host_slot_bytes.size(); ++i) {
        w.sample("ferry_stage_kv_host_bytes", static_cast<double>(s.kv.host_slot_bytes[i]),
                 stage_label(s) + ",slot=\"" + std::to_string(i) + "\"");
      }
    }
    per_stage("ferry_stage_failed", "gauge", "1 for a stage that a device error ended",
              [](const Stage& s) { return s.failed ? 1 : 0; });
    if (std::any_of(e.stages.begin(), e.stages.end(), [](const actors::StageStatus& s) { return s.tiered; })) {
      w.header("ferry_expert_routes_total", "counter", "routed (row, expert) pairs of tiered stages, by where the expert was");
      for (const auto& s : e.stages) {
        if (!s.tiered) continue;
        const auto& x = s.experts;
        w.sample("ferry_expert_routes_total", static_cast<double>(x.hits), stage_label(s) + ",place=\"pool\"");
        w.sample("ferry_expert_routes_total", static_cast<double>(x.misses_mapped), stage_label(s) + ",place=\"host_mapped\"");
        w.sample("ferry_expert_routes_total", static_cast<double>(x.misses_uploaded), stage_label(s) + ",place=\"host_uploaded\"");
      }
      w.header("ferry_expert_host_link_bytes_total", "counter", "expert bytes that crossed the host link, by miss path");
      for (const auto& s : e.stages) {
        if (!s.tiered) continue;
        w.sample("ferry_expert_host_link_bytes_total", static_cast<double>(s.experts.bytes_mapped), stage_label(s) + ",path=\"mapped\"");
        w.sample("ferry_expert_host_link_bytes_total", static_cast<double>(s.experts.bytes_uploaded), stage_label(s) + ",path=\"upload\"");
      }
      w.header("ferry_expert_promotions_total", "counter", "experts moved into a device pool");
      for (const auto& s : e.stages) {
        if (s.tiered) w.sample("ferry_expert_promotions_total", static_cast<double>(s.experts.promotions), stage_label(s));
      }
      w.header("ferry_expert_evictions_total", "counter", "experts moved out of a device pool");
      for (const auto& s : e.stages) {
        if (s.tiered) w.sample("ferry_expert_evictions_total", static_cast<double>(s.experts.evictions), stage_label(s));
      }
      w.header("ferry_expert_pool_slots", "gauge", "expert slots in each tiered stage's device pool");
      for (const auto& s : e.stages) {
        if (s.tiered) w.sample("ferry_expert_pool_slots", s.experts.pool_slots, stage_label(s));
      }
      w.header("ferry_expert_swaps_in_flight", "gauge", "expert swaps started whose table updates have not all run");
      for (const auto& s : e.stages) {
        if (s.tiered) w.sample("ferry_expert_swaps_in_flight", s.experts.swaps_in_flight, stage_label(s));
      }
    }
  }
  return w.take();
}

}  // namespace ferry::http
