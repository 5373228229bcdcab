#pragma once
// Splits GLM-5.3's generated text, incrementally, into what the OpenAI API returns:
//   - reasoning: text inside <think>…</think> (the generation prompt usually opens <think>, so the
//     output starts in reasoning: OutputParserOptions::starts_in_reasoning);
//   - tool calls: `<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value>…</tool_call>` become
//     OpenAI tool_calls whose `arguments` stream as JSON text fragments that concatenate to one JSON
//     object. Values are converted by the tool's JSON schema, the inverse of the template (which
//     writes strings raw and everything else as JSON): a parameter typed "string" stays a string and
//     streams as it arrives; other values are parsed as JSON when they are valid JSON, else kept as
//     strings, and are emitted when complete;
//   - content: everything else.
// Tags may arrive split across any number of feed() calls. Nothing is lost: text that does not
// form a call (an unknown tool name, an unterminated or malformed header) is returned as content.
// Once a call's name is complete the call is committed: if the text then breaks the call grammar,
// or the stream ends inside the call, the arguments are closed as valid JSON with what arrived
// (an unfinished string value keeps its text) and the text from the breaking point on is content.
//
// Feeding a text in any split gives the same concatenated result as feeding it whole (a tested
// property), so the HTTP layer can feed the detokenizer's output token by token.
#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "model/text/json.hpp"
#include "config/expected.hpp"

namespace ferry::model {

// What a parser needs to know of the request's tools: for each tool, which parameters are strings.
class ToolSchemas {
 public:
  ToolSchemas() = default;
  // From the OpenAI `tools` array (`{"type": "function", "function": {...}}` or a bare function).
  // A parameter is a string when its schema's "type" is "string" (or a list holding "string").
  static Expected<ToolSchemas> from_tools(const JsonValue& tools);

  bool empty() const { return tools_.empty(); }
  bool has_tool(std::string_view name) const;
  // False for an unknown tool or parameter: its value is then read as JSON when it is valid JSON.
  bool is_string_parameter(std::string_view tool, std::string_view parameter) const;

 private:
  struct Tool {
    std::map<std::string, bool, std::less<>> string_parameters;  // parameter -> is string typed
  };
  std::map<std::string, Tool, std::less<>> tools_;
};

struct OutputParserOptions {
  // The prompt ended with an open <think> (RenderedChat::generation_starts_in_reasoning).
  bool starts_in_reasoning = true;
  // Known tools. When non-empty, a call naming another tool is returned as content.
  ToolSchemas tools;
};

// One piece of a tool call: the first delta of a call carries its name; later ones carry argument
// text. The HTTP layer gives the call its id when it sees a new index.
struct ToolCallDelta {
  size_t index = 0;
  std::string name;       // non-empty only in the first delta of the call
  std::string arguments;  // a fragment of the arguments JSON text
};

struct OutputDelta {
  std::string content;
  std::string reasoning_content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return content.empty() && reasoning_content.empty() && tool_calls.empty(); }
};

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // a complete JSON object
};

// The whole message, accumulated from deltas.
struct ParsedMessage {
  std::string content;
  std::string reasoning_content;
  std::vector<ParsedToolCall> tool_calls;
  void append(const OutputDelta& delta);
};

class OutputParser {
 public:
  explicit OutputParser(OutputParserOptions options = {});

  // Text that arrived (valid UTF-8 from the StreamingDetokenizer, in any split).
  OutputDelta feed(std::string_view text);
  // End of the stream: releases held text and closes an open tool call.
  OutputDelta finish();

  // feed(text) then finish() on a fresh parser.
  static ParsedMessage parse(std::string_view text, OutputParserOptions options = {});

 private:
  enum class State { content, reasoning, call_name, call_between, call_key, call_value };

  void run(OutputDelta& out, bool final);
  void step_content(OutputDelta& out, bool final);
  void step_reasoning(OutputDelta& out, bool final);
  void step_call_name(OutputDelta& out, bool final);
  void step_call_between(OutputDelta& out, bool final);
  void step_call_key(OutputDelta& out, bool final);
  void step_call_value(OutputDelta& out, bool final);
  void open_value(OutputDelta& out);
  void close_value(OutputDelta& out);
  void close_call(OutputDelta& out);
  void arguments(OutputDelta& out, std::string_view fragment);

  OutputParserOptions options_;
  State state_;
  std::string buffer_;        // text received and not yet consumed
  bool seen_output_ = false;  // non-space content or a call was emitted: <think> no longer opens reasoning
  size_t call_count_ = 0;     // calls committed so far; the open one is call_count_ - 1
  std::string call_name_;
  std::string call_raw_;      // raw text of a call whose name is not complete yet
  size_t call_args_ = 0;      // arguments emitted in the open call
  std::string key_;
  bool value_is_string_ = false;
  std::string value_;         // a non-string value, held until </arg_value>
};

}  // namespace ferry::model
