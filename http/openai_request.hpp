#pragma once
// The OpenAI request bodies ferry accepts, parsed with simdjson (on-demand, error codes, no
// exceptions) and validated field by field. Every rejection names the field (`param`) and says what
// was expected. Unknown fields are ignored, as OpenAI-compatible servers do; known fields with a
// wrong type or value, and features ferry does not implement (n > 1, logprobs, penalties, forced
// tool choice), are errors. Role "developer" is read as "system".
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "http/api_error.hpp"
#include "model/text/json.hpp"

namespace ferry::http {

// What chat and completions share: sampling, limits, streaming, stop conditions.
struct GenerationOptions {
  std::string model;
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<float> min_p;
  std::optional<uint32_t> top_k;       // 0 (or -1 in the request) = off
  std::optional<uint64_t> seed;
  std::optional<uint32_t> max_tokens;  // max_completion_tokens wins over max_tokens
  uint32_t min_tokens = 0;
  std::vector<std::string> stop;       // stop strings, not included in the output
  bool stream = false;
  bool include_usage = false;          // stream_options.include_usage
  bool return_token_ids = false;       // token ids in every choice (vLLM's extension)
  bool ignore_eos = false;             // keep going past end-of-generation tokens
  bool cache_prompt = true;            // false: never reuse a slot's cached prefix
  bool max_completion_tokens_seen = false;
};

struct ChatRequest {
  GenerationOptions options;
  model::JsonValue messages;  // validated: an array of message objects
  model::JsonValue tools;     // null when none (or tool_choice "none")
  std::optional<bool> enable_thinking;          // chat_template_kwargs.enable_thinking; false for effort none/minimal
  std::optional<std::string> reasoning_effort;  // top level or chat_template_kwargs: none, minimal, low, medium,
                                                // high, xhigh or max
  bool clear_thinking = false;                  // chat_template_kwargs.clear_thinking
};

struct CompletionRequest {
  GenerationOptions options;
  std::variant<std::string, std::vector<int32_t>> prompt;  // text, or token ids
};

// `body` is the raw request body; parsing copies it into a padded buffer.
std::variant<ChatRequest, ApiError> parse_chat_request(std::string_view body);
std::variant<CompletionRequest, ApiError> parse_completion_request(std::string_view body);

}  // namespace ferry::http
