#pragma once
// Every response body ferry writes, as plain structs; each serialises itself with one to_json
// (STYLE rule 14), all of them in responses.cpp (Boost.JSON).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "http/api_error.hpp"
#include "http/response_channel.hpp"

namespace ferry::http {

struct ToolCallOut {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text of the arguments object
};

// A piece of a streamed tool call: the first piece of a call carries id and name.
struct ToolCallDeltaOut {
  size_t index = 0;
  std::string id;
  std::string name;
  std::string arguments;
};

struct Usage {
  actors::RequestUsage usage;
  actors::RequestTimings timings;
};

struct ChatCompletion {
  std::string id;
  int64_t created = 0;
  std::string model;
  std::string content;
  std::string reasoning_content;
  std::vector<ToolCallOut> tool_calls;
  std::string finish_reason;
  std::optional<std::vector<int32_t>> prompt_token_ids, token_ids;  // when return_token_ids
  Usage usage;
};

struct ChatChunk {
  std::string id;
  int64_t created = 0;
  std::string model;
  // The choice: absent in the final usage-only chunk (choices is then []).
  bool has_choice = true;
  bool role = false;  // the first chunk announces role "assistant"
  std::string content;
  std::string reasoning_content;
  std::vector<ToolCallDeltaOut> tool_calls;
  std::optional<std::string> finish_reason;
  std::optional<std::vector<int32_t>> token_ids;
  std::optional<Usage> usage;    // the usage chunk (stream_options.include_usage): usage + timings
  std::optional<Usage> timings;  // the finishing chunk: timings only (as llama.cpp sends them)
};

struct Completion {
  std::string id;
  int64_t created = 0;
  std::string model;
  std::string text;
  std::string finish_reason;
  std::optional<std::vector<int32_t>> prompt_token_ids, token_ids;
  Usage usage;
};

struct CompletionChunk {
  std::string id;
  int64_t created = 0;
  std::string model;
  bool has_choice = true;
  std::string text;
  std::optional<std::string> finish_reason;
  std::optional<std::vector<int32_t>> token_ids;
  std::optional<Usage> usage;
  std::optional<Usage> timings;
};

// GET /v1/models/{id}: the served model's object.
struct Model {
  std::string id;
  int64_t created = 0;
  uint32_t max_model_len = 0;  // tokens per slot
  std::string synthetic_config;  // non-empty: synthetic weights of this config's shape, of this type
  std::string synthetic_type;
};

// GET /v1/models: a list of the one model.
struct ModelList {
  Model model;
};

// GET /health: 200 when serving; 503 with the reason while loading, draining or failed.
struct HealthReport {
  std::string status;  // "ok", "loading", "draining", "failed"
  std::string reason;  // why not ok
  // While loading:
  uint64_t bytes_done = 0, bytes_total = 0;
  double rate_bytes_per_s = 0, eta_s = 0;
  // When serving:
  std::string backend;
  uint32_t slots_idle = 0, slots_total = 0, queued = 0;
  bool synthetic = false;  // the weights are pseudo-random (ferry serve --synthetic)
  std::vector<actors::StageStatus> stages;  // the pipeline's stages, a failed one with its error
};

// GET /slots: one entry per slot. A busy slot names its request by the number in the response id
// ("chatcmpl-42" and "cmpl-42" are request 42).
struct SlotsReport {
  actors::EngineSnapshot engine;
};

struct CancelReport {
  std::string id;
  bool accepted = true;
};

struct ReleaseReport {
  uint32_t slot = 0;
  actors::ReleaseResult result;
};

std::string to_json(const ChatCompletion& x);
std::string to_json(const ChatChunk& x);
std::string to_json(const Completion& x);
std::string to_json(const CompletionChunk& x);
std::string to_json(const Model& x);
std::string to_json(const ModelList& x);
std::string to_json(const HealthReport& x);
std::string to_json(const SlotsReport& x);
std::string to_json(const CancelReport& x);
std::string to_json(const ReleaseReport& x);
std::string to_json(const ApiError& x);

// Answers with the error object (and Retry-After when the error carries one).
void send_error(ResponseChannel& channel, const ApiError& error);

}  // namespace ferry::http
