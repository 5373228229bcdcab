#pragma once
// One bridge actor per generation request (ARCHITECTURE: http bridge). It renders and tokenizes the
// request, submits token ids to the scheduler, turns the tokens it gets back into OpenAI responses
// (SSE chunks or one JSON body) through a GenerationStream, asks the scheduler to stop when a stop
// string matched or the client went away, and quits after the request's terminal event.
#include <chrono>
#include <memory>
#include <optional>
#include <variant>

#include "actors/protocol.hpp"
#include "actors/telemetry.hpp"
#include "http/generation_stream.hpp"
#include "http/openai_request.hpp"
#include "http/response_channel.hpp"
#include "http/server_context.hpp"

namespace ferry::http {

struct BridgeJob {
  std::variant<ChatRequest, CompletionRequest> request;
  actors::RequestId id = 0;
  int64_t created = 0;  // unix seconds, for the response's `created`
  std::shared_ptr<ResponseChannel> channel;
  std::shared_ptr<const ServerContext> context;
  size_t body_bytes = 0;  // of the HTTP request: a large one's memory is released when the bridge ends
};

struct BridgeState {
  BridgeJob job;
  bool chat = true;
  GenerationOptions options;
  std::string response_id;
  std::vector<int32_t> prompt;
  std::optional<GenerationStream> stream;
  bool events_started = false;  // SSE headers sent
  bool role_sent = false;       // the chat stream's first event (with the first token)
  bool client_gone = false;
  bool cancel_sent = false;
  // Telemetry to the admin actor, and the request's log line:
  actors::TelemetryPublisher telemetry;
  std::chrono::steady_clock::time_point arrived = std::chrono::steady_clock::now();
  int64_t slot = -1;
  uint32_t cached_tokens = 0;
  std::string doing = "rendering the prompt";
};

using bridge_pointer = actors::bridge_actor::stateful_pointer<BridgeState>;

actors::bridge_actor::behavior_type bridge(bridge_pointer self, BridgeJob job);

// The prompt, rendered and tokenized, and the engine request; or the client's error.
std::variant<actors::GenerateRequest, ApiError> prepare_request(BridgeState& state);

// The bridge's telemetry while it runs; `done` makes it the last one (ended), with the request's figures.
actors::ActorReport bridge_report(const BridgeState& state, uint64_t mailbox,
                                  const actors::RequestFinished* done = nullptr, const std::string& finish = {});

}  // namespace ferry::http
