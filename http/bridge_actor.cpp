#include "http/bridge_actor.hpp"

#include <algorithm>
#include <random>

#include "http/memory_release.hpp"
#include "http/request_log.hpp"
#include "http/request_registry.hpp"
#include "http/responses.hpp"

namespace ferry::http {
namespace {

using actors::RequestFinished;
using actors::RequestStatus;

uint64_t random_seed() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

ApiError too_long(const std::string& param, std::string message) {
  ApiError e = invalid_field(param, std::move(message), "context_length_exceeded");
  return e;
}

// Whether the messages' own text proves the prompt longer than `cap` tokens: the template writes every
// user and system message's content whole, and no token covers more than `max_token_bytes` bytes. A
// cheap look before rendering and tokenizing a body of megabytes.
bool prompt_exceeds(const model::JsonValue& messages, size_t max_token_bytes, size_t cap) {
  if (max_token_bytes == 0 || !messages.is_array()) return false;
  size_t bytes = 0;
  for (const model::JsonValue& m : messages.as_array()) {
    const model::JsonValue* role = m.find("role");
    const model::JsonValue* content = m.find("content");
    if (!role || !role->is_string() || !content) continue;
    if (role->as_string() != "user" && role->as_string() != "system") continue;
    if (content->is_string()) bytes += content->as_string().size();
    if (content->is_array()) {
      for (const model::JsonValue& part : content->as_array()) {
        if (const model::JsonValue* text = part.find("text"); text && text->is_string()) bytes += text->as_string().size();
      }
    }
  }
  return bytes > 0 && (bytes - 1) / max_token_bytes + 1 > cap;
}

std::string tool_call_id(actors::RequestId id, size_t index) {
  return "call_" + std::to_string(id) + "_" + std::to_string(index);
}

// Asks the scheduler to end this request, at most once (later causes change nothing).
void cancel_once(bridge_pointer self, actors::EndCause cause) {
  BridgeState& st = self->state;
  if (st.cancel_sent) return;
  st.cancel_sent = true;
  self->send(st.job.context->engine.scheduler, actors::CancelRequest{st.job.id, cause});
}

// Sends one SSE event; a client that is gone or not reading ends the generation for it.
void send_event(bridge_pointer self, std::string payload) {
  BridgeState& st = self->state;
  if (st.client_gone) return;
  if (!st.job.channel->send_event(std::move(payload))) {
    st.client_gone = true;
    cancel_once(self, actors::EndCause::client_cancelled);
  }
}

// Ends the exchange with an error: an error response before the stream started, else an error
// event and [DONE] (unless the client is already gone).
void end_with_error(bridge_pointer self, const ApiError& e) {
  BridgeState& st = self->state;
  if (!st.events_started) return send_error(*st.job.channel, e);
  if (st.client_gone) return;
  send_event(self, to_json(e));
  send_event(self, "[DONE]");
  st.job.channel->end_events();
}

// The SSE headers go out when the request gets a slot, so a client knows it was admitted; the first
// event waits for the first token (see announce_role).
void start_events(bridge_pointer self) {
  BridgeState& st = self->state;
  if (st.events_started || st.client_gone) return;
  st.events_started = true;
  st.job.channel->start_events();
}

// A chat stream's first event announces role "assistant". It is sent with the first token, not at
// admission: clients time the first event as the end of prefill (llama-benchy's prompt speed is
// prompt tokens / time to the first chunk with a choice), and vLLM (on the engine's first output)
// and llama.cpp (with the first decoded token) send it then too. Sent before prefill, it made
// prompt processing look 200 times faster than it is.
void announce_role(bridge_pointer self) {
  BridgeState& st = self->state;
  if (!st.chat || !st.options.stream || st.role_sent || st.client_gone) return;
  start_events(self);
  st.role_sent = true;
  ChatChunk first;
  first.id = st.response_id;
  first.created = st.job.created;
  first.model = st.options.model;
  first.role = true;
  send_event(self, to_json(first));
}

std::vector<ToolCallDeltaOut> tool_deltas(const BridgeState& st, const std::vector<model::ToolCallDelta>& deltas) {
  std::vector<ToolCallDeltaOut> out;
  for (const auto& d : deltas) {
    ToolCallDeltaOut o;
    o.index = d.index;
    if (!d.name.empty()) {
      o.id = tool_call_id(st.job.id, d.index);
      o.name = d.name;
    }
    o.arguments = d.arguments;
    out.push_back(std::move(o));
  }
  return out;
}

// One streamed chunk for `delta`; skipped when it carries nothing the client asked for. The
// finishing chunk (with `timings`) is always sent.
void send_delta(bridge_pointer self, const StreamDelta& delta, std::optional<std::string> finish_reason,
                const std::optional<Usage>& timings = std::nullopt) {
  BridgeState& st = self->state;
  const bool ids = st.options.return_token_ids && !delta.token_ids.empty();
  if (delta.empty() && !ids && !finish_reason) return;
  if (st.chat) {
    announce_role(self);
    ChatChunk c;
    c.id = st.response_id;
    c.created = st.job.created;
    c.model = st.options.model;
    c.content = delta.content;
    c.reasoning_content = delta.reasoning_content;
    c.tool_calls = tool_deltas(st, delta.tool_calls);
    c.finish_reason = std::move(finish_reason);
    c.timings = timings;
    if (st.options.return_token_ids) c.token_ids = delta.token_ids;
    send_event(self, to_json(c));
  } else {
    CompletionChunk c;
    c.id = st.response_id;
    c.created = st.job.created;
    c.model = st.options.model;
    c.text = delta.content;
    c.finish_reason = std::move(finish_reason);
    c.timings = timings;
    if (st.options.return_token_ids) c.token_ids = delta.token_ids;
    send_event(self, to_json(c));
  }
}

std::string finish_reason(const BridgeState& st, const RequestFinished& done) {
  if (st.chat && !st.stream->message().tool_calls.empty()) return "tool_calls";
  if (st.stream->stopped_by_string() || done.status == RequestStatus::finished_stop) return "stop";
  return "length";
}

void send_usage_chunk(bridge_pointer self, const Usage& usage) {
  BridgeState& st = self->state;
  if (st.chat) {
    ChatChunk c;
    c.id = st.response_id;
    c.created = st.job.created;
    c.model = st.options.model;
    c.has_choice = false;
    c.usage = usage;
    send_event(self, to_json(c));
  } else {
    CompletionChunk c;
    c.id = st.response_id;
    c.created = st.job.created;
    c.model = st.options.model;
    c.has_choice = false;
    c.usage = usage;
    send_event(self, to_json(c));
  }
}

void send_whole_response(bridge_pointer self, const std::string& reason, const Usage& usage) {
  BridgeState& st = self->state;
  const model::ParsedMessage& m = st.stream->message();
  std::optional<std::vector<int32_t>> ids, prompt_ids;
  if (st.options.return_token_ids) {
    ids = st.stream->token_ids();
    prompt_ids = st.prompt;
  }
  if (st.chat) {
    ChatCompletion c;
    c.id = st.response_id;
    c.created = st.job.created;
    c.model = st.options.model;
    c.content = m.content;
    c.reasoning_content = m.reasoning_content;
    for (size_t i = 0; i < m.tool_calls.size(); ++i) {
      c.tool_calls.push_back(ToolCallOut{tool_call_id(st.job.id, i), m.tool_calls[i].name, m.tool_calls[i].arguments});
    }
    c.finish_reason = reason;
    c.token_ids = std::move(ids);
    c.prompt_token_ids = std::move(prompt_ids);
    c.usage = usage;
    st.job.channel->send_json(200, to_json(c));
  } else {
    Completion c;
    c.id = st.response_id;
    c.created = st.job.created;
    c.model = st.options.model;
    c.text = m.content;
    c.finish_reason = reason;
    c.token_ids = std::move(ids);
    c.prompt_token_ids = std::move(prompt_ids);
    c.usage = usage;
    st.job.channel->send_json(200, to_json(c));
  }
}

void on_finished(bridge_pointer self, const RequestFinished& done) {
  BridgeState& st = self->state;
  const ServerContext& ctx = *st.job.context;
  const bool stopped = st.stream->stopped_by_string();
  const bool ok = stopped || done.status == RequestStatus::finished_stop || done.status == RequestStatus::finished_length;
  const StreamDelta tail = st.stream->finish();
  Usage usage{done.usage, done.timings};
  usage.usage.completion_tokens = st.stream->tokens();  // what the client saw, up to a stop string
  if (st.client_gone) return;
  if (!ok && !st.events_started) {
    send_error(*self->state.job.channel, error_for(done.cause, done.message, ctx.config.slots.retry_after_s));
    return;
  }
  if (!st.options.stream) {
    send_whole_response(self, finish_reason(st, done), usage);
    return;
  }
  start_events(self);
  if (ok) {
    send_delta(self, tail, finish_reason(st, done), usage);
    if (st.options.include_usage) send_usage_chunk(self, usage);
  } else {
    send_delta(self, tail, std::nullopt);
    // The stream already said 200: the error travels as an event, as OpenAI's API does mid-stream.
    send_event(self, to_json(error_for(done.cause, done.message, 0)));
  }
  send_event(self, "[DONE]");
  if (!st.client_gone) st.job.channel->end_events();
}

void publish(bridge_pointer self) {
  const actors::ActorReport report = bridge_report(self->state, actors::own_mailbox_depth(self));
  for (const auto& sink : self->state.telemetry.subscribers) self->send(sink, report);
}

void telemetry_changed(bridge_pointer self, std::string doing = {}) {
  if (!doing.empty()) self->state.doing = std::move(doing);
  actors::telemetry_changed(self, self->state.telemetry, [self] { publish(self); });
}

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// The request's end: its last report to the admin actor (unthrottled) and its log line.
void report_end(bridge_pointer self, const RequestFinished& done) {
  BridgeState& st = self->state;
  const bool ok = st.stream->stopped_by_string() || done.status == RequestStatus::finished_stop ||
                  done.status == RequestStatus::finished_length;
  const std::string reason = ok ? finish_reason(st, done) : std::string(actors::finish_reason(done.status));
  const actors::ActorReport report = bridge_report(st, actors::own_mailbox_depth(self), &done, reason);
  for (const auto& sink : st.telemetry.subscribers) self->send(sink, report);
  RequestLogEntry entry;
  entry.id = st.response_id;
  entry.endpoint = st.chat ? "chat" : "completions";
  entry.slot = st.slot;
  entry.prompt_tokens = done.usage.prompt_tokens;
  entry.cached_tokens = done.usage.cached_tokens;
  entry.completion_tokens = st.stream->tokens();
  entry.queue_ms = done.timings.queue_ms;
  entry.prompt_ms = done.timings.prompt_ms;
  entry.predicted_ms = done.timings.predicted_ms;
  entry.ttft_ms = done.timings.ttft_ms;
  entry.total_ms = ms_since(st.arrived);
  entry.finish_reason = reason;
  entry.status = std::string(actors::status_name(done.status));
  entry.message = done.message;
  entry.client_gone = st.client_gone;
  log_request(entry);
}

}  // namespace

actors::ActorReport bridge_report(const BridgeState& st, uint64_t mailbox, const actors::RequestFinished* done,
                                  const std::string& finish) {
  actors::ActorReport r;
  r.name = actors::bridge_name(st.job.id);
  r.kind = actors::ActorKind::bridge;
  r.links = {"scheduler"};
  r.mailbox = mailbox;
  r.request = st.job.id;
  r.doing = st.doing;
  const double tokens = st.stream ? static_cast<double>(st.stream->tokens()) : 0;
  r.counters = {
      {"slot", static_cast<double>(st.slot)},
      {"prompt_tokens", static_cast<double>(st.prompt.size())},
      {"cached_tokens", static_cast<double>(st.cached_tokens)},
      {"completion_tokens", tokens},
  };
  if (done != nullptr) {
    r.ended = true;
    const bool normal = done->status == RequestStatus::finished_stop || done->status == RequestStatus::finished_length;
    r.doing = normal ? "finished: " + finish
                     : std::string(actors::status_name(done->status)) + ": " + (done->message.empty() ? finish : done->message);
    const auto& t = done->timings;
    r.counters.push_back({"queue_ms", t.queue_ms});
    r.counters.push_back({"prompt_ms", t.prompt_ms});
    r.counters.push_back({"predicted_ms", t.predicted_ms});
    r.counters.push_back({"ttft_ms", t.ttft_ms});
    r.counters.push_back({"decode_tokens_per_s", tokens > 1 && t.predicted_ms > 0 ? (tokens - 1) * 1000.0 / t.predicted_ms : 0});
  }
  return r;
}

std::variant<actors::GenerateRequest, ApiError> prepare_request(BridgeState& st) {
  const ServerContext& ctx = *st.job.context;
  const model::Tokenizer& tokenizer = *ctx.tokenizer;
  const uint32_t context = ctx.engine.limits.ctx;
  StreamOptions stream;
  std::string prompt_field = "messages";
  // A prompt of `context` tokens leaves no room for the first generated one. The checks before the
  // work (what the text's length alone proves, then tokenizing with a cap) keep a huge prompt from
  // costing more than a prompt at the limit does.
  const size_t cap = context - 1;
  auto over = [&](const std::string& field) {
    return too_long(field, "the prompt has more than " + std::to_string(cap) + " tokens; a slot holds " +
                               std::to_string(context) + " tokens (prompt + completion)");
  };
  if (const auto* chat = std::get_if<ChatRequest>(&st.job.request)) {
    if (prompt_exceeds(chat->messages, tokenizer.max_token_bytes(), cap)) return over(prompt_field);
    model::ChatOptions options;
    options.reasoning_effort = chat->reasoning_effort;
    if (!options.reasoning_effort && !ctx.config.sampling.reasoning_effort.empty()) {
      options.reasoning_effort = ctx.config.sampling.reasoning_effort;
    }
    options.enable_thinking = chat->enable_thinking;
    options.clear_thinking = chat->clear_thinking;
    const model::JsonValue* tools = chat->tools.is_null() ? nullptr : &chat->tools;
    auto rendered = ctx.chat_template.render(chat->messages, tools, options);
    if (!rendered) return invalid_field("messages", rendered.error().message);
    if (!tokenizer.encode(rendered->prompt, /*parse_special=*/true, st.prompt, cap)) return over(prompt_field);
    stream.parser.starts_in_reasoning = rendered->generation_starts_in_reasoning;
    if (tools != nullptr) {
      auto schemas = model::ToolSchemas::from_tools(*tools);
      if (!schemas) return invalid_field("tools", schemas.error().message);
      stream.parser.tools = std::move(schemas.value());
    }
  } else {
    const auto& completion = std::get<CompletionRequest>(st.job.request);
    prompt_field = "prompt";
    stream.chat = false;
    if (const auto* text = std::get_if<std::string>(&completion.prompt)) {
      if (!tokenizer.encode(*text, /*parse_special=*/true, st.prompt, cap)) return over(prompt_field);
    } else {
      st.prompt = std::get<std::vector<int32_t>>(completion.prompt);
      for (size_t i = 0; i < st.prompt.size() && st.prompt.size() < context; ++i) {
        if (!tokenizer.valid_id(st.prompt[i])) {
          const std::string at = "prompt[" + std::to_string(i) + "]";
          return invalid_field(at, at + " = " + std::to_string(st.prompt[i]) + " is not in the vocabulary of " +
                                       std::to_string(tokenizer.vocab_size()) + " tokens");
        }
      }
    }
  }
  const auto n = static_cast<uint32_t>(std::min<size_t>(st.prompt.size(), UINT32_MAX));
  if (n == 0) return invalid_field(prompt_field, prompt_field + " encodes to no tokens");
  if (n >= context) {
    return too_long(prompt_field, "the prompt has " + std::to_string(n) + " tokens; a slot holds " +
                                      std::to_string(context) + " tokens (prompt + completion)");
  }
  const GenerationOptions& o = st.options;
  uint32_t max_tokens = std::min(ctx.config.sampling.max_tokens, context - n);
  if (o.max_tokens) {
    if (static_cast<uint64_t>(n) + *o.max_tokens > context) {
      return too_long("max_tokens", "the prompt has " + std::to_string(n) + " tokens and max_tokens is " +
                                        std::to_string(*o.max_tokens) + ": more than the " + std::to_string(context) +
                                        " tokens a slot holds");
    }
    max_tokens = *o.max_tokens;
  }
  actors::GenerateRequest r;
  r.id = st.job.id;
  r.prompt = st.prompt;
  const auto& defaults = ctx.config.sampling;
  r.sampling.temperature = o.temperature.value_or(defaults.temperature);
  r.sampling.top_p = o.top_p.value_or(defaults.top_p);
  r.sampling.top_k = o.top_k.value_or(defaults.top_k);
  r.sampling.min_p = o.min_p.value_or(defaults.min_p);
  r.sampling.seed = o.seed ? *o.seed : random_seed();
  if (!o.ignore_eos) r.stop_token_ids = ctx.end_token_ids;
  r.max_tokens = max_tokens;
  r.min_tokens = std::min(o.min_tokens, max_tokens);
  r.reuse_prefix = o.cache_prompt;
  stream.stop = o.stop;
  stream.end_token_ids = ctx.end_token_ids;
  st.stream.emplace(tokenizer, std::move(stream));
  return r;
}

actors::bridge_actor::behavior_type bridge(bridge_pointer self, BridgeJob job) {
  BridgeState& st = self->state;
  st.job = std::move(job);
  st.chat = std::holds_alternative<ChatRequest>(st.job.request);
  st.options = st.chat ? std::get<ChatRequest>(st.job.request).options
                       : std::get<CompletionRequest>(st.job.request).options;
  st.response_id = (st.chat ? "chatcmpl-" : "cmpl-") + std::to_string(st.job.id);
  if (st.options.model.empty()) st.options.model = st.job.context->config.model.id;
  if (auto registry = st.job.context->requests) {
    // Whichever way the bridge ends, its request is no longer live (a late cancel is then a no-op).
    self->attach_functor([registry, id = st.job.id] { registry->end(id); });
  }
  if (st.job.body_bytes >= kLargeBodyBytes) {
    // The request's text (and its rendering) is freed with the bridge's state, before this runs.
    self->attach_functor([] { release_free_memory(); });
  }

  // A bug or an allocation failure while handling this request must still answer its client; the
  // scheduler sees the bridge go down and cancels the request.
  self->set_exception_handler([self](std::exception_ptr& eptr) -> caf::error {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(eptr);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    end_with_error(self, make_error(500, "server_error", "internal_error",
                                    "internal error while serving this request: " + what));
    return caf::exit_reason::unhandled_exception;
  });
  auto prepared = prepare_request(st);
  if (auto* error = std::get_if<ApiError>(&prepared)) {
    send_error(*self->state.job.channel, *error);
    RequestLogEntry entry;  // never submitted: no slot, no tokens, no telemetry
    entry.id = st.response_id;
    entry.endpoint = st.chat ? "chat" : "completions";
    entry.prompt_tokens = static_cast<uint32_t>(st.prompt.size());
    entry.total_ms = ms_since(st.arrived);
    entry.finish_reason = "error";
    entry.status = "invalid_request";
    entry.message = error->message;
    log_request(entry);
    self->quit();  // never submitted: there is no terminal event to wait for
  } else {
    const actors::scheduler_actor scheduler = st.job.context->engine.scheduler;
    self->monitor(scheduler);
    self->set_down_handler([self](const caf::down_msg&) {
      // The engine is gone (shutdown): nothing will finish this request any more.
      end_with_error(self, make_error(503, "server_error", "shutting_down", "the engine stopped"));
      self->quit();
    });
    self->send(scheduler, actors::submit_atom_v, std::move(std::get<actors::GenerateRequest>(prepared)),
               caf::actor_cast<actors::request_sink_actor>(self));
    const ServerContext& ctx = *st.job.context;
    if (ctx.engine.admin) {
      st.telemetry.throttle = actors::PublishThrottle(std::chrono::duration_cast<actors::PublishThrottle::Duration>(
          std::chrono::duration<double, std::milli>(ctx.config.server.telemetry_interval_ms)));
      st.telemetry.subscribe(ctx.engine.admin);
    }
    telemetry_changed(self, "waiting for a slot");
  }
  return {
      [self](const actors::RequestStarted& started) {
        BridgeState& st = self->state;
        st.slot = started.slot;
        st.cached_tokens = started.cached_tokens;
        if (st.options.stream) start_events(self);
        telemetry_changed(self, "prefilling in slot " + std::to_string(started.slot));
      },
      [self](const actors::TokensGenerated& generated) {
        BridgeState& st = self->state;
        announce_role(self);  // even when the first token shows no text yet (held bytes, a marker)
        for (int32_t token : generated.tokens) {
          const bool was_stopped = st.stream->stopped_by_string();
          StreamDelta delta = st.stream->push(token);
          if (st.options.stream && !was_stopped) send_delta(self, delta, std::nullopt);
          if (st.stream->stopped_by_string()) cancel_once(self, actors::EndCause::stop_string);
        }
        telemetry_changed(self, st.client_gone ? std::string() : "streaming in slot " + std::to_string(st.slot));
      },
      [self](const RequestFinished& done) {
        on_finished(self, done);
        report_end(self, done);
        self->quit();
      },
      [self](actors::client_gone_atom) {
        self->state.client_gone = true;
        cancel_once(self, actors::EndCause::client_cancelled);
        telemetry_changed(self, "client gone: cancelling");
      },
      [self](actors::telemetry_flush_atom) {
        actors::telemetry_flush(self, self->state.telemetry, [self] { publish(self); });
      },
  };
}

}  // namespace ferry::http
