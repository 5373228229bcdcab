#include "http/router.hpp"

#include <charconv>
#include <chrono>
#include <ctime>

#include "http/admin_page.hpp"
#include "http/auth.hpp"
#include "http/bridge_actor.hpp"
#include "http/metrics_text.hpp"
#include "http/openai_request.hpp"
#include "http/request_log.hpp"
#include "http/request_registry.hpp"
#include "http/responses.hpp"
#include "http/safe_text.hpp"

namespace ferry::http {
namespace {

using Endpoint = HttpMetrics::Endpoint;
using Channel = std::shared_ptr<ResponseChannel>;
using Context = std::shared_ptr<ServerContext>;

constexpr auto kAskTimeout = std::chrono::seconds(10);


ApiError engine_unavailable(const std::string& why) {
  return make_error(503, "server_error", "engine_unavailable", "the engine did not answer: " + why);
}

// 503 while the server cannot take generation work; nullopt when it can.
std::optional<ApiError> not_serving(const ServerContext& ctx) {
  switch (ctx.current_phase()) {
    case ServerPhase::ready: return std::nullopt;
    case ServerPhase::loading: {
      ApiError e = make_error(503, "server_error", "model_loading", "the model is still loading (GET /health shows progress)");
      e.retry_after_s = ctx.config.slots.retry_after_s;
      return e;
    }
    case ServerPhase::draining: {
      ApiError e = make_error(503, "server_error", "shutting_down", "the server is shutting down");
      e.retry_after_s = ctx.config.slots.retry_after_s;
      return e;
    }
    case ServerPhase::load_failed:
      return make_error(503, "server_error", "model_load_failed", "the model failed to load: " + ctx.load_failure);
  }
  return std::nullopt;
}

bool has_engine(const ServerContext& ctx) {
  const ServerPhase p = ctx.current_phase();
  return p == ServerPhase::ready || p == ServerPhase::draining;
}

std::optional<uint64_t> parse_number(std::string_view s) {
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

std::string query_value(std::string_view query, std::string_view name) {
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    const size_t eq = pair.find('=');
    if (pair.substr(0, eq) == name) return eq == std::string_view::npos ? "" : std::string(pair.substr(eq + 1));
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return {};
}

// %XX escapes decoded; a malformed escape is kept as it is.
std::string percent_decoded(std::string_view s) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2])));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

int64_t unix_now() { return static_cast<int64_t>(std::time(nullptr)); }

// A generation request refused before it reaches a bridge still gets its line in the request log.
void refuse(ResponseChannel& channel, const ApiError& error, bool chat, std::string_view status) {
  send_error(channel, error);
  RequestLogEntry entry;
  entry.endpoint = chat ? "chat" : "completions";
  entry.finish_reason = "error";
  entry.status = status;
  entry.message = error.message;
  log_request(entry);
}

void generate(const Context& ctx, const HttpRequest& req, KeyIndex caller, const Channel& channel, bool chat) {
  if (auto e = not_serving(*ctx)) return refuse(*channel, *e, chat, "unavailable");
  std::variant<ChatRequest, CompletionRequest> request;
  if (chat) {
    auto parsed = parse_chat_request(req.body);
    if (auto* e = std::get_if<ApiError>(&parsed)) return refuse(*channel, *e, chat, "invalid_request");
    request = std::move(std::get<ChatRequest>(parsed));
  } else {
    auto parsed = parse_completion_request(req.body);
    if (auto* e = std::get_if<ApiError>(&parsed)) return refuse(*channel, *e, chat, "invalid_request");
    request = std::move(std::get<CompletionRequest>(parsed));
  }
  const std::string& model = std::visit([](const auto& r) -> const std::string& { return r.options.model; }, request);
  if (!model.empty() && model != ctx->config.model.id) {
    ApiError e = make_error(404, "invalid_request_error", "model_not_found",
                       "model '" + excerpt(model) + "' is not served here; this server serves '" + ctx->config.model.id + "'");
    e.param = "model";
    return refuse(*channel, e, chat, "invalid_request");
  }
  // Checked before any work on the prompt: no prompt fits beside such a completion.
  const auto& options = std::visit([](const auto& r) -> const GenerationOptions& { return r.options; }, request);
  if (options.max_tokens && *options.max_tokens >= ctx->engine.limits.ctx) {
    ApiError e = invalid_field("max_tokens",
                               "max_tokens = " + std::to_string(*options.max_tokens) + " leaves no room for a prompt: a slot "
                               "holds " + std::to_string(ctx->engine.limits.ctx) + " tokens (prompt + completion)",
                               "context_length_exceeded");
    return refuse(*channel, e, chat, "invalid_request");
  }
  BridgeJob job;
  job.request = std::move(request);
  job.id = random_request_number();
  if (ctx->requests) ctx->requests->add(job.id, caller);  // before the bridge runs: its exit ends the entry
  job.created = unix_now();
  job.channel = channel;
  job.context = ctx;
  job.body_bytes = req.body.size();
  const auto bridge_handle = ctx->system->spawn(bridge, std::move(job));
  // A weak address: the bridge holds the channel, so a strong handle here would make a cycle.
  channel->on_client_gone([address = bridge_handle.address()] {
    if (auto strong = caf::actor_cast<caf::strong_actor_ptr>(address)) {
      caf::anon_send(caf::actor_cast<actors::bridge_actor>(strong), actors::client_gone_atom_v);
    }
  });
}

void health(const Context& ctx, const Channel& channel) {
  HealthReport report;
  switch (ctx->current_phase()) {
    case ServerPhase::loading:
      return channel->send_json(503, to_json(loading_report(*ctx)));
    case ServerPhase::load_failed:
      report.status = "failed";
      report.reason = "the model failed to load: " + ctx->load_failure;
      return channel->send_json(503, to_json(report));
    case ServerPhase::draining:
      report.status = "draining";
      report.reason = "the server is shutting down";
      return channel->send_json(503, to_json(report));
    case ServerPhase::ready:
      break;
  }
  ctx->system->spawn([ctx, channel](caf::event_based_actor* self) {
    self->request(ctx->engine.scheduler, kAskTimeout, actors::snapshot_atom_v)
        .then(
            [ctx, channel](actors::EngineSnapshot& snap) {
              HealthReport r;
              r.backend = ctx->backend_name;
              r.synthetic = !ctx->config.model.synthetic_config.empty();
              r.slots_total = static_cast<uint32_t>(snap.slots.size());
              r.stages = snap.stages;
              for (const auto& s : snap.slots) r.slots_idle += s.busy ? 0 : 1;
              r.queued = snap.queued;
              if (snap.failed) {
                r.status = "failed";
                r.reason = "the backend failed: " + snap.failure;
                return channel->send_json(503, to_json(r));
              }
              r.status = snap.draining ? "draining" : "ok";
              if (snap.draining) r.reason = "the server is shutting down";
              channel->send_json(snap.draining ? 503 : 200, to_json(r));
            },
            [ctx, channel](caf::error& err) { send_error(*channel, engine_unavailable(ctx->system->render(err))); });
  });
}

void metrics(const Context& ctx, const Channel& channel) {
  const HeaderList text{{"Content-Type", "text/plain; version=0.0.4; charset=utf-8"}};
  if (!has_engine(*ctx)) return channel->send_json(200, render_metrics(*ctx, std::nullopt), text);
  ctx->system->spawn([ctx, channel, text](caf::event_based_actor* self) {
    self->request(ctx->engine.scheduler, kAskTimeout, actors::snapshot_atom_v)
        .then(
            [ctx, channel, text](actors::EngineSnapshot& snap) {
              channel->send_json(200, render_metrics(*ctx, snap), text);
            },
            [ctx, channel](caf::error& err) { send_error(*channel, engine_unavailable(ctx->system->render(err))); });
  });
}

void slots(const Context& ctx, const Channel& channel) {
  if (!has_engine(*ctx)) return send_error(*channel, *not_serving(*ctx));
  ctx->system->spawn([ctx, channel](caf::event_based_actor* self) {
    self->request(ctx->engine.scheduler, kAskTimeout, actors::snapshot_atom_v)
        .then([channel](actors::EngineSnapshot& snap) { channel->send_json(200, to_json(SlotsReport{snap})); },
              [ctx, channel](caf::error& err) { send_error(*channel, engine_unavailable(ctx->system->render(err))); });
  });
}

void release(const Context& ctx, std::string_view id_text, std::string_view query, KeyIndex caller,
             const Channel& channel) {
  if (!has_engine(*ctx)) return send_error(*channel, *not_serving(*ctx));
  // Releasing a busy slot cancels its request, whoever made it: with several keys that is for the
  // operator's key (--api-key) alone, as cancelling is for each request's own key.
  const auto& server = ctx->config.server;
  if (key_count(server) > 1 && !(!server.api_key.empty() && caller == 0)) {
    return send_error(*channel, make_error(403, "permission_error", "forbidden",
                                           "releasing a slot cancels the request in it: with several API keys "
                                           "only the --api-key key may"));
  }
  const auto id = parse_number(id_text);
  if (!id || *id > UINT32_MAX) {
    return send_error(*channel, invalid_field("id", "slot id '" + excerpt(id_text) + "' is not a number"));
  }
  const std::string action = query_value(query, "action");
  if (action != "release") {
    return send_error(*channel, invalid_field("action", "action = '" + excerpt(action) + "': the slot action is 'release'"));
  }
  const auto slot = static_cast<uint32_t>(*id);
  ctx->system->spawn([ctx, channel, slot](caf::event_based_actor* self) {
    self->request(ctx->engine.scheduler, kAskTimeout, actors::ReleaseSlot{slot})
        .then(
            [channel, slot](actors::ReleaseResult& result) {
              channel->send_json(result.ok ? 200 : 404, to_json(ReleaseReport{slot, result}));
            },
            [ctx, channel](caf::error& err) { send_error(*channel, engine_unavailable(ctx->system->render(err))); });
  });
}

void cancel(const Context& ctx, std::string_view id_text, KeyIndex caller, const Channel& channel) {
  if (!has_engine(*ctx)) return send_error(*channel, *not_serving(*ctx));
  std::string_view digits = id_text;
  for (std::string_view prefix : {"chatcmpl-", "cmpl-"}) {
    if (digits.substr(0, prefix.size()) == prefix) digits.remove_prefix(prefix.size());
  }
  const auto id = parse_number(digits);
  if (!id) {
    return send_error(*channel, invalid_field("id", "request id '" + excerpt(id_text) +
                                                         "': expected a response id such as chatcmpl-42"));
  }
  auto accept = [ctx, channel, id = *id, text = valid_utf8(id_text)] {
    // Cancel is idempotent (STYLE rule 9): the scheduler leaves a request that has ended alone.
    caf::anon_send(ctx->engine.scheduler, actors::CancelRequest{id, actors::EndCause::admin_cancelled});
    channel->send_json(202, to_json(CancelReport{text, true}));
  };
  if (!ctx->requests) return accept();
  // With several keys a request belongs to the one that made it: to any other it does not exist.
  const bool several_keys = key_count(ctx->config.server) > 1;
  ctx->requests->find(*id, caller, !several_keys,
                      [accept, channel, several_keys, text = excerpt(id_text)](RequestIndex::Found found) {
                        if (found != RequestIndex::Found::unknown) return accept();
                        ApiError e = make_error(404, "invalid_request_error", "request_not_found",
                                                "no request '" + text + "'" + (several_keys ? " made with this API key" : "") +
                                                    " is running or ended recently");
                        e.param = "id";
                        send_error(*channel, e);
                      });
}

}  // namespace

HealthReport loading_report(const ServerContext& ctx) {
  HealthReport r;
  r.status = "loading";
  r.synthetic = !ctx.config.model.synthetic_config.empty();
  r.bytes_done = ctx.progress.bytes_done.load();
  r.bytes_total = ctx.progress.bytes_total.load();
  const int64_t started = ctx.progress.started_ns.load();
  const double elapsed =
      started == 0 ? 0
                   : static_cast<double>(std::chrono::steady_clock::now().time_since_epoch().count() - started) / 1e9;
  r.rate_bytes_per_s = elapsed > 0 ? static_cast<double>(r.bytes_done) / elapsed : 0;
  r.eta_s = r.rate_bytes_per_s > 0 && r.bytes_total > r.bytes_done
                ? static_cast<double>(r.bytes_total - r.bytes_done) / r.rate_bytes_per_s
                : 0;
  const double percent = r.bytes_total ? 100.0 * static_cast<double>(r.bytes_done) / static_cast<double>(r.bytes_total) : 0;
  r.reason = "loading the model: " + std::to_string(static_cast<int>(percent)) + "%";
  return r;
}

Endpoint route(const Context& ctx, HttpRequest req, const Channel& channel) {
  const size_t q = req.target.find('?');
  const std::string path = req.target.substr(0, q);
  const std::string query = q == std::string::npos ? "" : req.target.substr(q + 1);
  const bool get = req.method == "GET";
  const bool post = req.method == "POST";
  auto method_not_allowed = [&](const char* allowed) {
    send_error(*channel, make_error(405, "invalid_request_error", "method_not_allowed",
                                excerpt(req.method) + " " + excerpt(path, 256) + ": use " + allowed));
  };

  if (path == "/health") {
    if (!get) method_not_allowed("GET");
    else health(ctx, channel);
    return Endpoint::health;
  }
  // The admin console's page holds no data (that comes over /admin/ws with the admin token), so it
  // needs no API key; with --admin-port it is served there instead.
  if ((path == "/admin" || path == "/admin/ws") && ctx->config.server.admin_port == 0) {
    if (!get) method_not_allowed("GET");
    else if (path == "/admin") channel->send_json(200, std::string(admin_page_html()), admin_page_headers());
    else send_error(*channel, make_error(426, "invalid_request_error", "upgrade_required",
                                         "/admin/ws is the admin console's WebSocket: connect with a WebSocket client"));
    return Endpoint::other;
  }
  Endpoint endpoint = Endpoint::other;
  if (path == "/v1/chat/completions") endpoint = Endpoint::chat;
  else if (path == "/v1/completions") endpoint = Endpoint::completions;
  else if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0) endpoint = Endpoint::models;
  else if (path == "/metrics") endpoint = Endpoint::metrics;
  else if (path == "/slots" || path.rfind("/slots/", 0) == 0) endpoint = Endpoint::slots;
  else if (path.rfind("/v1/requests/", 0) == 0) endpoint = Endpoint::admin;

  const std::optional<KeyIndex> caller = authenticate(ctx->config.server, req.authorization);
  if (!caller) {
    const ApiError e = make_error(401, "authentication_error", "invalid_api_key",
                                  "a valid API key is required: send 'Authorization: Bearer <key>'");
    channel->send_json(e.status, to_json(e), {{"WWW-Authenticate", www_authenticate(req.authorization)}});
    return endpoint;
  }
  switch (endpoint) {
    case Endpoint::chat:
    case Endpoint::completions:
      if (!post) method_not_allowed("POST");
      else generate(ctx, req, *caller, channel, endpoint == Endpoint::chat);
      return endpoint;
    case Endpoint::models: {
      if (!get) {
        method_not_allowed("GET");
        return endpoint;
      }
      const Model model{ctx->config.model.id, ctx->started_unix,
                        has_engine(*ctx) ? ctx->engine.limits.ctx : ctx->config.slots.ctx,
                        ctx->config.model.synthetic_config, ctx->config.model.synthetic_type};
      if (path == "/v1/models") {
        channel->send_json(200, to_json(ModelList{model}));
        return endpoint;
      }
      // GET /v1/models/{id} (client.models.retrieve): the id may hold '/' and arrive percent-encoded.
      const std::string id = percent_decoded(std::string_view(path).substr(11));
      if (id != model.id) {
        ApiError e = make_error(404, "invalid_request_error", "model_not_found",
                                "model '" + excerpt(id) + "' is not served here; this server serves '" + model.id + "'");
        e.param = "model";
        send_error(*channel, e);
        return endpoint;
      }
      channel->send_json(200, to_json(model));
      return endpoint;
    }
    case Endpoint::metrics:
      if (!get) method_not_allowed("GET");
      else metrics(ctx, channel);
      return endpoint;
    case Endpoint::slots:
      if (path == "/slots") {
        if (!get) method_not_allowed("GET");
        else slots(ctx, channel);
      } else if (!post) {
        method_not_allowed("POST");
      } else {
        release(ctx, std::string_view(path).substr(7), query, *caller, channel);
      }
      return endpoint;
    case Endpoint::admin: {
      const std::string_view rest = std::string_view(path).substr(13);
      const size_t slash = rest.find('/');
      if (slash == std::string_view::npos || rest.substr(slash) != "/cancel") break;
      if (!post) method_not_allowed("POST");
      else cancel(ctx, rest.substr(0, slash), *caller, channel);
      return endpoint;
    }
    default:
      break;
  }
  send_error(*channel, make_error(404, "invalid_request_error", "not_found", "no endpoint " + excerpt(req.method) + " " + excerpt(path, 256)));
  return Endpoint::other;
}

}  // namespace ferry::http
