#pragma once
// The log line every generation request ends with, and the log's format. With --log-format json
// every line is one JSON object, {"time": ISO 8601 UTC, "level": ..., "msg": ...}; a request's line
// carries its fields at the top level instead of "msg":
//   {"time":"2025-01-01T12:00:00.123Z","level":"info","event":"request","id":"chatcmpl-42",
//    "endpoint":"chat","slot":1,"prompt_tokens":32786,"cached_tokens":32785,"completion_tokens":12,
//    "queue_ms":0.1,"prompt_ms":82.0,"predicted_ms":300.5,"ttft_ms":82.2,"total_ms":385.0,
//    "decode_tokens_per_s":36.6,"finish_reason":"stop","status":"finished_stop"}
// ("message" is added when the request ended with an error, "client_gone" when its client left).
// With text (the default) the same fields read as one sentence.
#include <cstdint>
#include <string>

namespace ferry::http {

struct RequestLogEntry {
  std::string id;        // the response id, chatcmpl-N or cmpl-N
  std::string endpoint;  // chat or completions
  int64_t slot = -1;     // -1: it never got a slot
  uint32_t prompt_tokens = 0;
  uint32_t cached_tokens = 0;
  uint32_t completion_tokens = 0;
  double queue_ms = 0;
  double prompt_ms = 0;
  double predicted_ms = 0;
  double ttft_ms = 0;
  double total_ms = 0;           // from the request's arrival at the bridge to its end
  std::string finish_reason;     // stop, length, tool_calls, cancelled, error
  std::string status;            // the engine's RequestStatus name
  std::string message;           // the error, when there was one
  bool client_gone = false;
};

// The request's fields as a JSON object (the json format's line without time and level).
std::string request_log_json(const RequestLogEntry& entry);
// The text format's line.
std::string request_log_text(const RequestLogEntry& entry);

// Sets the format of every log line (spdlog's default logger and the request logger); `json` false:
// spdlog's default text pattern. Call once at start-up, before other threads log.
void configure_logging(bool json);
// Writes the request's line (in the configured format).
void log_request(const RequestLogEntry& entry);

}  // namespace ferry::http
