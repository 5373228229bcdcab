#pragma once
// Maps an HTTP request to its handler. Answers come through the request's ResponseChannel, at once
// (errors, /v1/models, /health while loading) or later from an actor (generation, /metrics, /slots).
//
//   POST /v1/chat/completions          chat, streamed (SSE) or whole
//   POST /v1/completions               raw prompt (text or token ids), streamed or whole
//   GET  /v1/models                    the served model
//   GET  /v1/models/{id}               the served model's object; 404 for another id
//   GET  /health                       200 serving; 503 + reason while loading, draining, failed
//   GET  /metrics                      Prometheus text
//   GET  /slots                        per-slot state
//   POST /slots/{id}?action=release    cancel what runs in the slot and free its cached state (with
//                                      several API keys: the --api-key key only)
//   POST /v1/requests/{id}/cancel      cancel a request by its response id (chatcmpl-N, cmpl-N or N):
//                                      202, also for one that ended recently; 404 for an id that is not
//                                      running (with several API keys: not one of the caller's key)
// Every endpoint but /health needs `Authorization: Bearer <api key>` (the scheme in any case) when
// API keys are configured. Request numbers are random (http/request_registry.hpp): not guessable.
#include <memory>
#include <string>

#include "http/response_channel.hpp"
#include "http/responses.hpp"
#include "http/server_context.hpp"

namespace ferry::http {

struct HttpRequest {
  std::string method;
  std::string target;         // path, possibly with a query
  std::string body;
  std::string authorization;  // the Authorization header
};

// Returns the endpoint (for the request counters); the answer goes through `channel`.
HttpMetrics::Endpoint route(const std::shared_ptr<ServerContext>& context, HttpRequest request,
                            const std::shared_ptr<ResponseChannel>& channel);

// The HealthReport of a server still loading its model (progress, rate, ETA).
HealthReport loading_report(const ServerContext& context);

}  // namespace ferry::http
