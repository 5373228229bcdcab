#include "config/serve_config.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "config/kv_type.hpp"

namespace ferry::config {
namespace {

template <class T>
std::string bad(const char* option, const T& value, const char* expected) {
  std::ostringstream out;
  out << "--" << option << " = " << value << ": expected " << expected;
  return out.str();
}

}  // namespace

Expected<InjectedFault> parse_fault(const std::string& text) {
  const auto bad = [&] {
    return Error("--inject-fault '" + text + "': expected STEP:STAGE:CODE, CODE one of invalid_plan, out_of_memory, "
                 "device_error, device_lost, internal");
  };
  InjectedFault f;
  const size_t a = text.find(':'), b = a == std::string::npos ? a : text.find(':', a + 1);
  if (b == std::string::npos) return bad();
  const char* s = text.data();
  if (std::from_chars(s, s + a, f.step).ptr != s + a || std::from_chars(s + a + 1, s + b, f.stage).ptr != s + b) {
    return bad();
  }
  std::string code = text.substr(b + 1);
  std::replace(code.begin(), code.end(), '_', ' ');
  for (ErrorCode c : {ErrorCode::invalid_plan, ErrorCode::out_of_memory, ErrorCode::device_error,
                      ErrorCode::device_lost, ErrorCode::internal}) {
    if (error_code_name(c) == code) {
      f.code = c;
      return f;
    }
  }
  return bad();
}

std::vector<std::string> validate(const ServeConfig& c) {
  std::vector<std::string> errors;
  auto check = [&](bool ok, std::string message) {
    if (!ok) errors.push_back(std::move(message));
  };
  std::error_code ec;
  check(c.model.path.empty() || std::filesystem::is_regular_file(c.model.path, ec),
        bad("model", c.model.path, "an existing GGUF file"));
  check(c.devices.backend == "cpu" || c.devices.backend == "cuda" || c.devices.backend == "auto", bad("backend", c.devices.backend, "cpu, cuda or auto"));
  const bool synthetic = !c.model.synthetic_config.empty();
  check(!synthetic || std::filesystem::is_regular_file(c.model.synthetic_config, ec),
        bad("synthetic", c.model.synthetic_config, "an existing config.json of a glm5_next shape"));
  check(!synthetic || c.model.path.empty(),
        bad("model", c.model.path, "no --model with --synthetic (the weights are made, not read)"));
  check(!synthetic || c.devices.backend != "cpu",
        bad("backend", c.devices.backend, "cuda or auto with --synthetic, which makes its weights on the GPU"));
  check(c.model.tokenizer_path.empty() || synthetic,
        bad("tokenizer", c.model.tokenizer_path, "only with --synthetic (a model file brings its own tokenizer)"));
  check(c.model.synthetic_recipe.empty() || synthetic,
        bad("recipe", c.model.synthetic_recipe, "only with --synthetic (a model file's types are in the file)"));
  check(c.model.tokenizer_path.empty() || std::filesystem::exists(c.model.tokenizer_path, ec),
        bad("tokenizer", c.model.tokenizer_path, "an existing GGUF file or Hugging Face tokenizer directory"));
  check(c.devices.threads <= 4096, bad("threads", c.devices.threads, "0 (every core) or a thread count up to 4096"));
  check(!c.model.id.empty(), bad("model-id", "''", "a non-empty model name"));
  check(!c.server.host.empty(), bad("host", "''", "an IP address or host name to listen on"));
  check(c.server.http_threads >= 1 && c.server.http_threads <= 256, bad("http-threads", c.server.http_threads, "1 to 256"));
  check(c.server.max_body_bytes >= 1024 && c.server.max_body_bytes <= (1ull << 32),
        bad("max-body", c.server.max_body_bytes, "a size between 1KiB and 4GiB"));
  check(c.server.sse_queue_limit >= 16, bad("sse-queue-limit", c.server.sse_queue_limit, "at least 16 events"));
  check(c.server.idle_timeout_s > 0 && c.server.idle_timeout_s <= 86400,
        bad("idle-timeout", c.server.idle_timeout_s, "seconds in (0, 86400]"));
  check(c.server.read_timeout_s > 0 && c.server.read_timeout_s <= 3600,
        bad("read-timeout", c.server.read_timeout_s, "seconds in (0, 3600]"));
  check(c.server.max_connections <= 1000000,
        bad("max-connections", c.server.max_connections, "0 (auto) to 1000000 connections"));
  check(c.slots.count >= 1 && c.slots.count <= 256, bad("slots", c.slots.count, "1 to 256"));
  check(c.slots.ctx >= 16, bad("ctx", c.slots.ctx, "at least 16 tokens per slot"));
  check(c.slots.kv_type == "auto" || parse_kv_type(c.slots.kv_type).ok(),
        bad("kv-type", c.slots.kv_type, "f32, f16, int8 or auto"));
  check(std::isfinite(c.slots.kv_host_budget_gib) && c.slots.kv_host_budget_gib >= 0 &&
            c.slots.kv_host_budget_gib <= 65536,
        bad("kv-host-budget", c.slots.kv_host_budget_gib, "GiB in [0, 65536]"));
  check(c.slots.prefill_chunk >= 1, bad("prefill-chunk", c.slots.prefill_chunk, "at least 1 token"));
  check(c.slots.mtp == "auto" || c.slots.mtp == "off" || c.slots.mtp == "1" || c.slots.mtp == "2" || c.slots.mtp == "3",
        bad("mtp", c.slots.mtp, "auto, off or a draft count 1 to 3"));
  check(c.slots.queue_limit <= 1000000, bad("queue-limit", c.slots.queue_limit, "0 to 1000000 waiting requests"));
  check(c.slots.retry_after_s >= 1 && c.slots.retry_after_s <= 3600, bad("retry-after", c.slots.retry_after_s, "1 to 3600 seconds"));
  check(std::isfinite(c.slots.checkpoint_budget_gib) && c.slots.checkpoint_budget_gib >= 0 &&
            c.slots.checkpoint_budget_gib <= 65536,
        bad("checkpoint-budget", c.slots.checkpoint_budget_gib, "GiB in [0, 65536]"));
  check(c.slots.checkpoint_every >= 64, bad("checkpoint-every", c.slots.checkpoint_every, "at least 64 tokens"));
  check(c.server.drain_timeout_s >= 0 && c.server.drain_timeout_s <= 86400,
        bad("drain-timeout", c.server.drain_timeout_s, "seconds in [0, 86400]"));
  check(c.server.admin_port == 0 || c.server.admin_port != c.server.port,
        bad("admin-port", c.server.admin_port, "a port other than --port (0: the console on the API's port)"));
  check(!c.server.admin_host.empty(), bad("admin-host", "''", "an IP address for the admin console to listen on"));
  check(c.server.admin_queue_limit >= 4 && c.server.admin_queue_limit <= 65536,
        bad("admin-queue-limit", c.server.admin_queue_limit, "4 to 65536 messages"));
  check(std::isfinite(c.server.telemetry_interval_ms) && c.server.telemetry_interval_ms >= 1 &&
            c.server.telemetry_interval_ms <= 10000,
        bad("telemetry-interval", c.server.telemetry_interval_ms, "milliseconds in [1, 10000]"));
  check(c.server.log_format == "text" || c.server.log_format == "json",
        bad("log-format", c.server.log_format, "text or json"));
  {
    const std::string& e = c.sampling.reasoning_effort;
    check(e.empty() || e == "low" || e == "medium" || e == "high" || e == "xhigh" || e == "max",
          bad("reasoning-effort", e, "low, medium, high, xhigh or max"));
  }
  check(c.devices.split.micro_batches <= 64,
        bad("micro-batches", c.devices.split.micro_batches, "0 (one per device) to 64"));
  check(std::isfinite(c.model.route_skew) && c.model.route_skew >= 0 && c.model.route_skew <= 10,
        bad("route-skew", c.model.route_skew, "a number in [0, 10]"));
  check(c.model.route_skew == 0 || !c.model.synthetic_config.empty(),
        bad("route-skew", c.model.route_skew, "0 without --synthetic (a model file routes as it was trained)"));
  const SamplingDefaults& s = c.sampling;
  check(std::isfinite(s.temperature) && s.temperature >= 0 && s.temperature <= 2,
        bad("temperature", s.temperature, "a number in [0, 2]"));
  check(std::isfinite(s.top_p) && s.top_p > 0 && s.top_p <= 1, bad("top-p", s.top_p, "a number in (0, 1]"));
  check(std::isfinite(s.min_p) && s.min_p >= 0 && s.min_p <= 1, bad("min-p", s.min_p, "a number in [0, 1]"));
  check(s.max_tokens >= 1, bad("max-tokens", s.max_tokens, "at least 1 token"));
  return errors;
}

}  // namespace ferry::config
