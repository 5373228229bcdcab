#pragma once
// GLM-5.3-Flash's chat template, rendered natively: the prompt is byte for byte what the model's own
// chat_template.jinja (zai-org/GLM-5.3-Flash, sha256 0c4099f3…, kept as
// tests/fixtures/chat_template/glm-5.3-flash.jinja) yields under transformers' Jinja settings
// (trim_blocks, lstrip_blocks, tojson = json.dumps(ensure_ascii=False)), for OpenAI-style messages:
// system, user, assistant (content, reasoning_content, tool_calls), tool results, tool definitions,
// reasoning_effort, clear_thinking.
//
// One addition: the official template always opens a reasoning block. `enable_thinking = false`
// renders what GLM-5.2's official template does for it (no "Reasoning Effort" line, generation
// prompt `<|assistant|><think></think>`); unset or true renders the official template exactly.
//
// Encode the prompt with Tokenizer::encode(prompt, /*parse_special=*/true): the markers the
// template writes are added tokens, and so is marker-like text inside messages (as with the
// reference tokenizer), so the count the API admits is the count of this encoding.
#include <optional>
#include <string>
#include <string_view>

#include "model/text/json.hpp"
#include "config/expected.hpp"

namespace ferry::model {

struct ChatOptions {
  bool add_generation_prompt = true;
  // "low" or "high"; anything else, or unset, is "max" (as the template does).
  std::optional<std::string> reasoning_effort;
  // Unset or true: thinking on (the official template). False: see above.
  std::optional<bool> enable_thinking;
  // Drop the reasoning of assistant turns at or before the last user message.
  bool clear_thinking = false;
};

struct RenderedChat {
  std::string prompt;
  // The prompt ends inside an open <think>: the model's output starts with reasoning
  // (OutputParserOptions::starts_in_reasoning).
  bool generation_starts_in_reasoning = false;
};

class ChatTemplate {
 public:
  // `messages`: the OpenAI messages array. `tools`: the tools array, or nullptr / null / [] for none.
  // Tool call `arguments` may be a JSON object or a string holding one (OpenAI sends a string).
  // Errors name the message index and field: a message that is not an object, content of an
  // unsupported type, arguments that are not a JSON object, a tool_reference result without tools.
  Expected<RenderedChat> render(const JsonValue& messages, const JsonValue* tools,
                                const ChatOptions& options) const;
  // The same from JSON text; `tools_json` may be empty.
  Expected<RenderedChat> render(std::string_view messages_json, std::string_view tools_json,
                                const ChatOptions& options) const;
};

}  // namespace ferry::model
