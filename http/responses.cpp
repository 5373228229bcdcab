#include "http/responses.hpp"

#include <boost/json.hpp>

#include <charconv>
#include <cmath>
#include <string>

#include "http/safe_text.hpp"

namespace ferry::http {
namespace {

namespace bj = boost::json;

bj::array ids_json(const std::vector<int32_t>& ids) {
  bj::array out;
  out.reserve(ids.size());
  for (int32_t id : ids) out.emplace_back(id);
  return out;
}

double per_second(double count, double ms) { return ms > 0 ? count * 1000.0 / ms : 0.0; }

// Milliseconds to three decimals: readable, and what llama.cpp's timings carry.
double round_ms(double ms) { return std::round(ms * 1000.0) / 1000.0; }

bj::object usage_json(const Usage& u) {
  bj::object usage;
  usage["prompt_tokens"] = u.usage.prompt_tokens;
  usage["completion_tokens"] = u.usage.completion_tokens;
  usage["total_tokens"] = u.usage.prompt_tokens + u.usage.completion_tokens;
  usage["prompt_tokens_details"] = bj::object{{"cached_tokens", u.usage.cached_tokens}};
  return usage;
}

// llama.cpp's per-request timings (llama-benchy and others read them), plus queue time and TTFT.
bj::object timings_json(const Usage& u) {
  const double prompt_n = u.usage.prompt_tokens - u.usage.cached_tokens;
  const double predicted_n = u.usage.completion_tokens;
  const auto& t = u.timings;
  bj::object out;
  out["cache_n"] = u.usage.cached_tokens;
  out["prompt_n"] = static_cast<uint64_t>(prompt_n);
  out["prompt_ms"] = round_ms(t.prompt_ms);
  out["prompt_per_token_ms"] = round_ms(prompt_n > 0 ? t.prompt_ms / prompt_n : 0);
  out["prompt_per_second"] = per_second(prompt_n, t.prompt_ms);
  out["predicted_n"] = u.usage.completion_tokens;
  out["predicted_ms"] = round_ms(t.predicted_ms);
  out["predicted_per_token_ms"] = round_ms(predicted_n > 1 ? t.predicted_ms / (predicted_n - 1) : 0);
  // The first token comes out of the prefill: decode speed counts the tokens after it.
  out["predicted_per_second"] = per_second(predicted_n > 1 ? predicted_n - 1 : 0, t.predicted_ms);
  out["queue_ms"] = round_ms(t.queue_ms);
  out["ttft_ms"] = round_ms(t.ttft_ms);
  out["draft_n"] = t.draft_n;
  out["draft_n_accepted"] = t.draft_n_accepted;
  return out;
}

// A stream's usage chunk carries usage and timings; its finishing chunk, timings alone.
void add_chunk_usage(bj::object& out, const std::optional<Usage>& usage, const std::optional<Usage>& timings) {
  if (usage) {
    out["usage"] = usage_json(*usage);
    out["timings"] = timings_json(*usage);
  } else if (timings) {
    out["timings"] = timings_json(*timings);
  }
}

bj::value finish_json(const std::optional<std::string>& reason) {
  if (!reason) return nullptr;
  return bj::value(*reason);
}

bj::object histogram_json(const actors::HistogramSnapshot& h) {
  return bj::object{{"count", h.count}, {"sum", h.sum}};
}

// Boost.JSON writes doubles in scientific form ("2.977E0"); clients and people read plain
// decimals: the shortest positional digits that read back as the same double ("2.977", "200").
// A non-finite double, which JSON cannot carry, is written as null.
void append_json(std::string& out, const bj::value& v) {
  switch (v.kind()) {
    case bj::kind::object: {
      out += '{';
      bool first = true;
      for (const auto& kv : v.get_object()) {
        if (!first) out += ',';
        first = false;
        out += bj::serialize(bj::string_view(kv.key()));
        out += ':';
        append_json(out, kv.value());
      }
      out += '}';
      return;
    }
    case bj::kind::array: {
      out += '[';
      bool first = true;
      for (const auto& item : v.get_array()) {
        if (!first) out += ',';
        first = false;
        append_json(out, item);
      }
      out += ']';
      return;
    }
    case bj::kind::double_: {
      const double d = v.get_double();
      if (!std::isfinite(d)) {
        out += "null";
        return;
      }
      char buf[400];  // fixed notation of the largest double: 309 digits
      const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::fixed);
      out.append(buf, r.ptr);
      return;
    }
    default:
      out += bj::serialize(v);  // strings, integers, booleans, null
  }
}

std::string dump(const bj::value& v) {
  std::string out;
  append_json(out, v);
  return out;
}

}  // namespace

std::string to_json(const ChatCompletion& x) {
  bj::object message;
  message["role"] = "assistant";
  message["content"] = x.content.empty() && !x.tool_calls.empty() ? bj::value(nullptr) : bj::value(x.content);
  if (!x.reasoning_content.empty()) message["reasoning_content"] = x.reasoning_content;
  if (!x.tool_calls.empty()) {
    bj::array calls;
    for (const auto& c : x.tool_calls) {
      calls.push_back(bj::object{{"id", c.id},
                                 {"type", "function"},
                                 {"function", bj::object{{"name", c.name}, {"arguments", c.arguments}}}});
    }
    message["tool_calls"] = std::move(calls);
  }
  bj::object choice{{"index", 0}, {"message", std::move(message)}, {"finish_reason", x.finish_reason}, {"logprobs", nullptr}};
  if (x.token_ids) choice["token_ids"] = ids_json(*x.token_ids);
  bj::object out{{"id", x.id}, {"object", "chat.completion"}, {"created", x.created}, {"model", x.model}};
  out["choices"] = bj::array{std::move(choice)};
  out["usage"] = usage_json(x.usage);
  out["timings"] = timings_json(x.usage);
  if (x.prompt_token_ids) out["prompt_token_ids"] = ids_json(*x.prompt_token_ids);
  return dump(out);
}

std::string to_json(const ChatChunk& x) {
  bj::object out{{"id", x.id}, {"object", "chat.completion.chunk"}, {"created", x.created}, {"model", x.model}};
  bj::array choices;
  if (x.has_choice) {
    bj::object delta;
    if (x.role) delta["role"] = "assistant";
    if (!x.content.empty() || x.role) delta["content"] = x.content;
    if (!x.reasoning_content.empty()) delta["reasoning_content"] = x.reasoning_content;
    if (!x.tool_calls.empty()) {
      bj::array calls;
      for (const auto& c : x.tool_calls) {
        bj::object call{{"index", c.index}};
        bj::object fn;
        if (!c.id.empty()) {
          call["id"] = c.id;
          call["type"] = "function";
          fn["name"] = c.name;
        }
        fn["arguments"] = c.arguments;
        call["function"] = std::move(fn);
        calls.push_back(std::move(call));
      }
      delta["tool_calls"] = std::move(calls);
    }
    bj::object choice{{"index", 0}, {"delta", std::move(delta)}, {"finish_reason", finish_json(x.finish_reason)},
                      {"logprobs", nullptr}};
    if (x.token_ids) choice["token_ids"] = ids_json(*x.token_ids);
    choices.push_back(std::move(choice));
  }
  out["choices"] = std::move(choices);
  add_chunk_usage(out, x.usage, x.timings);
  return dump(out);
}

std::string to_json(const Completion& x) {
  bj::object choice{{"index", 0}, {"text", x.text}, {"finish_reason", x.finish_reason}, {"logprobs", nullptr}};
  if (x.token_ids) choice["token_ids"] = ids_json(*x.token_ids);
  if (x.prompt_token_ids) choice["prompt_token_ids"] = ids_json(*x.prompt_token_ids);
  bj::object out{{"id", x.id}, {"object", "text_completion"}, {"created", x.created}, {"model", x.model}};
  out["choices"] = bj::array{std::move(choice)};
  out["usage"] = usage_json(x.usage);
  out["timings"] = timings_json(x.usage);
  return dump(out);
}

std::string to_json(const CompletionChunk& x) {
  bj::object out{{"id", x.id}, {"object", "text_completion"}, {"created", x.created}, {"model", x.model}};
  bj::array choices;
  if (x.has_choice) {
    bj::object choice{{"index", 0}, {"text", x.text}, {"finish_reason", finish_json(x.finish_reason)},
                      {"logprobs", nullptr}};
    if (x.token_ids) choice["token_ids"] = ids_json(*x.token_ids);
    choices.push_back(std::move(choice));
  }
  out["choices"] = std::move(choices);
  add_chunk_usage(out, x.usage, x.timings);
  return dump(out);
}

namespace {

bj::object model_json(const Model& x) {
  bj::object model{{"id", valid_utf8(x.id)},         {"object", "model"},
                   {"created", x.created}, {"owned_by", "ferry"},
                   {"max_model_len", x.max_model_len}, {"synthetic", !x.synthetic_config.empty()}};
  if (!x.synthetic_config.empty()) {
    model["synthetic_config"] = valid_utf8(x.synthetic_config);
    model["synthetic_type"] = valid_utf8(x.synthetic_type);
  }
  return model;
}

}  // namespace

std::string to_json(const Model& x) { return dump(model_json(x)); }

std::string to_json(const ModelList& x) {
  return dump(bj::object{{"object", "list"}, {"data", bj::array{model_json(x.model)}}});
}

std::string to_json(const HealthReport& x) {
  bj::object out{{"status", x.status}};
  if (!x.reason.empty()) out["reason"] = valid_utf8(x.reason);  // may name a file path
  if (x.status == "loading") {
    const double percent = x.bytes_total > 0 ? 100.0 * static_cast<double>(x.bytes_done) / static_cast<double>(x.bytes_total) : 0;
    out["loading"] = bj::object{{"bytes_done", x.bytes_done},
                                {"bytes_total", x.bytes_total},
                                {"percent", std::round(percent * 10) / 10},
                                {"rate_bytes_per_s", std::round(x.rate_bytes_per_s)},
                                {"eta_s", std::round(x.eta_s * 10) / 10}};
  }
  if (x.synthetic) out["synthetic"] = true;
  if (!x.backend.empty()) {
    out["backend"] = valid_utf8(x.backend);
    out["slots_idle"] = x.slots_idle;
    out["slots_total"] = x.slots_total;
    out["queued"] = x.queued;
  }
  if (!x.stages.empty()) {
    bj::array stages;
    for (const actors::StageStatus& s : x.stages) {
      bj::object stage{{"index", s.index}, {"layers", s.layers}, {"backend", s.backend},
                       {"status", s.failed ? "failed" : "ok"}, {"steps", s.steps}};
      if (s.failed) stage["reason"] = s.failure;
      if (s.tiered) {
        const auto& x = s.experts;
        stage["experts"] = bj::object{{"pool_slots", x.pool_slots}, {"routes", x.routes}, {"pool_hits", x.hits},
                                      {"host_mapped", x.misses_mapped}, {"host_uploaded", x.misses_uploaded},
                                      {"promotions", x.promotions}};
      }
      stages.push_back(std::move(stage));
    }
    out["stages"] = std::move(stages);
  }
  return dump(out);
}

std::string to_json(const SlotsReport& x) {
  bj::array slots;
  for (const auto& s : x.engine.slots) {
    // Host KV tier bytes the slot's rows take over the stages (0 where every row is on a device).
    uint64_t host_kv = 0;
    for (const auto& st : x.engine.stages) {
      if (s.index < st.kv.host_slot_bytes.size()) host_kv += st.kv.host_slot_bytes[s.index];
    }
    bj::object slot{{"id", s.index}, {"state", s.busy ? std::string(actors::status_name(s.status)) : "idle"},
                    {"held_tokens", s.held_tokens}, {"host_kv_bytes", host_kv}};
    if (s.busy) {
      slot["request"] = s.request;
      slot["prompt_tokens"] = s.prompt_tokens;
      slot["prefilled_tokens"] = s.prefilled_tokens;
      slot["cached_tokens"] = s.cached_tokens;
      slot["generated_tokens"] = s.generated_tokens;
    }
    slots.push_back(std::move(slot));
  }
  bj::object out{{"slots", std::move(slots)},
                 {"queued", x.engine.queued},
                 {"queue_limit", x.engine.queue_limit},
                 {"draining", x.engine.draining},
                 {"steps", x.engine.steps},
                 {"ttft_seconds", histogram_json(x.engine.ttft_seconds)}};
  // The resident KV windows over the stages (all zero where every row stays on a device).
  actors::KvWindowStatus kv;
  for (const auto& st : x.engine.stages) {
    kv.window_rows += st.kv.window_rows;
    kv.resident_rows += st.kv.resident_rows;
    kv.hits += st.kv.hits;
    kv.fetched_rows += st.kv.fetched_rows;
    kv.fetched_bytes += st.kv.fetched_bytes;
    kv.last_fetched_rows += st.kv.last_fetched_rows;
    kv.last_fetched_bytes += st.kv.last_fetched_bytes;
  }
  const uint64_t looked = kv.hits + kv.fetched_rows;
  out["kv_window"] = bj::object{{"window_rows", kv.window_rows},
                                {"resident_rows", kv.resident_rows},
                                {"hits", kv.hits},
                                {"fetched_rows", kv.fetched_rows},
                                {"fetched_bytes", kv.fetched_bytes},
                                {"last_step_fetched_rows", kv.last_fetched_rows},
                                {"last_step_fetched_bytes", kv.last_fetched_bytes},
                                {"hit_rate", looked > 0 ? static_cast<double>(kv.hits) / static_cast<double>(looked) : 1.0}};
  if (x.engine.failed) out["failure"] = x.engine.failure;
  return dump(out);
}

std::string to_json(const CancelReport& x) {
  return dump(bj::object{{"id", x.id}, {"object", "request.cancel"}, {"accepted", x.accepted}});
}

std::string to_json(const ReleaseReport& x) {
  bj::object out{{"id", x.slot}, {"released", x.result.ok}};
  if (x.result.cancelled != 0) out["cancelled_request"] = x.result.cancelled;  // the number in its response id
  if (!x.result.ok) out["message"] = x.result.message;
  return dump(out);
}

std::string to_json(const ApiError& x) {
  // Messages and params quote what the client sent (a path, a key, a value): the body must stay valid
  // JSON whatever those bytes were, and short whatever their length.
  bj::object error{{"message", excerpt(x.message, 1024)}, {"type", valid_utf8(x.type)}};
  error["param"] = x.param.empty() ? bj::value(nullptr) : bj::value(excerpt(x.param, 256));
  error["code"] = x.code.empty() ? bj::value(nullptr) : bj::value(valid_utf8(x.code));
  return dump(bj::object{{"error", std::move(error)}});
}

void send_error(ResponseChannel& channel, const ApiError& error) {
  HeaderList headers;
  if (error.retry_after_s > 0) headers.emplace_back("Retry-After", std::to_string(error.retry_after_s));
  channel.send_json(error.status, to_json(error), std::move(headers));
}

}  // namespace ferry::http
