#include "http/generation_stream.hpp"

#include <algorithm>

namespace ferry::http {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

std::string StopMatcher::feed(std::string_view text) {
  if (matched_) return {};
  held_.append(text);
  size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    matched_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold the longest tail that is a proper prefix of a stop string. It starts where a stop string
  // would, at a character boundary, so the text given out stays valid UTF-8.
  size_t keep = 0;
  for (const auto& s : stops_) {
    for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n) {
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  if (!matched_) out.swap(held_);
  held_.clear();
  return out;
}

GenerationStream::GenerationStream(const model::Tokenizer& tokenizer, StreamOptions options)
    : options_(std::move(options)),
      // Completions return plain text (control tokens hidden, as vLLM's skip_special_tokens does);
      // chat needs the <think> and <tool_call> markers for the parser.
      detokenizer_(tokenizer, /*render_special=*/options_.chat),
      stop_(options_.stop) {
  if (options_.chat) parser_.emplace(options_.parser);
}

void GenerationStream::emit_text(const std::string& text, StreamDelta& out, bool final) {
  std::string safe = stop_.feed(text);
  if (final || stop_.matched()) safe += stop_.flush();
  if (!parser_) {
    out.content += safe;
    message_.content += safe;
    return;
  }
  model::OutputDelta delta = parser_->feed(safe);
  if (final || stop_.matched()) {
    model::OutputDelta tail = parser_->finish();
    delta.content += tail.content;
    delta.reasoning_content += tail.reasoning_content;
    delta.tool_calls.insert(delta.tool_calls.end(), tail.tool_calls.begin(), tail.tool_calls.end());
  }
  message_.append(delta);
  out.content += delta.content;
  out.reasoning_content += delta.reasoning_content;
  out.tool_calls.insert(out.tool_calls.end(), delta.tool_calls.begin(), delta.tool_calls.end());
}

StreamDelta GenerationStream::push(int32_t token) {
  StreamDelta out;
  if (stop_.matched() || finished_) return out;
  ++tokens_;
  token_ids_.push_back(token);
  out.token_ids.push_back(token);
  const auto& ends = options_.end_token_ids;
  if (std::find(ends.begin(), ends.end(), token) != ends.end()) return out;
  emit_text(detokenizer_.push(token), out, false);
  if (stop_.matched()) finished_ = true;
  return out;
}

StreamDelta GenerationStream::finish() {
  StreamDelta out;
  if (finished_) return out;
  finished_ = true;
  emit_text(detokenizer_.finish(), out, true);
  return out;
}

}  // namespace ferry::http
