#pragma once
// The text side of one request's output, as plain classes (no actors, no I/O): token ids in,
// OpenAI deltas out. Tokens go through the streaming detokenizer (valid UTF-8, special tokens
// whole), the stop-string matcher (holds back text that may begin a stop string), and, for chat, the
// output parser (reasoning_content, tool_calls). The bridge actor drives one per request.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/text/output_parser.hpp"
#include "model/text/streaming_detokenizer.hpp"
#include "model/text/tokenizer.hpp"

namespace ferry::http {

// Finds the first occurrence of any stop string in streamed text. Text that could still turn into a
// stop string is held back; the stop string itself and everything after it are dropped.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  // The text that is safe to emit now.
  std::string feed(std::string_view text);
  // The held text, at the end of the stream (nothing once a stop string matched).
  std::string flush();
  bool matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool matched_ = false;
};

struct StreamOptions {
  bool chat = true;                      // parse reasoning and tool calls; else raw text (completions)
  model::OutputParserOptions parser;     // chat only
  std::vector<std::string> stop;         // stop strings
  std::vector<int32_t> end_token_ids;    // counted, never shown as text
};

struct StreamDelta {
  std::string content;            // chat content, or completion text
  std::string reasoning_content;
  std::vector<model::ToolCallDelta> tool_calls;
  std::vector<int32_t> token_ids;  // the tokens this delta came from
  bool empty() const { return content.empty() && reasoning_content.empty() && tool_calls.empty(); }
};

class GenerationStream {
 public:
  // The tokenizer must outlive the stream.
  GenerationStream(const model::Tokenizer& tokenizer, StreamOptions options);

  // One generated token. After a stop string matched, tokens are ignored (empty delta).
  StreamDelta push(int32_t token);
  // End of generation: releases held bytes and text, closes an open tool call.
  StreamDelta finish();

  bool stopped_by_string() const { return stop_.matched(); }
  // Tokens that reached the client (those after a stop string match are not counted).
  uint32_t tokens() const { return tokens_; }
  // Everything emitted so far, accumulated.
  const model::ParsedMessage& message() const { return message_; }
  const std::vector<int32_t>& token_ids() const { return token_ids_; }

 private:
  void emit_text(const std::string& text, StreamDelta& out, bool final);

  StreamOptions options_;
  model::StreamingDetokenizer detokenizer_;
  StopMatcher stop_;
  std::optional<model::OutputParser> parser_;
  model::ParsedMessage message_;
  std::vector<int32_t> token_ids_;
  uint32_t tokens_ = 0;
  bool finished_ = false;
};

}  // namespace ferry::http
