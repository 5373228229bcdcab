#include "model/text/output_parser.hpp"

#include <algorithm>
#include <initializer_list>

namespace ferry::model {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kKeyOpen = "<arg_key>";
constexpr std::string_view kKeyClose = "</arg_key>";
constexpr std::string_view kValueOpen = "<arg_value>";
constexpr std::string_view kValueClose = "</arg_value>";
// A tool name or an argument key longer than this is not one: the text is returned as content.
constexpr size_t kMaxNameBytes = 256;

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Length of the longest suffix of `s` that is a proper prefix of one of `tags`: bytes that must be
// held back because the next feed may complete a tag.
size_t partial_tag_suffix(std::string_view s, std::initializer_list<std::string_view> tags) {
  size_t best = 0;
  for (std::string_view tag : tags) {
    for (size_t n = std::min(s.size(), tag.size() - 1); n > best; --n) {
      if (s.substr(s.size() - n) == tag.substr(0, n)) {
        best = n;
        break;
      }
    }
  }
  return best;
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// `s` is a proper prefix of `tag` (more input may complete it).
bool is_partial(std::string_view s, std::string_view tag) { return s.size() < tag.size() && starts_with(tag, s); }

bool json_type_is_string(const JsonValue* type) {
  if (!type) return false;
  if (type->is_string()) return type->as_string() == "string";
  if (type->is_array()) {
    for (const JsonValue& t : type->as_array()) {
      if (t.is_string() && t.as_string() == "string") return true;
    }
  }
  return false;
}

}  // namespace

Expected<ToolSchemas> ToolSchemas::from_tools(const JsonValue& tools) {
  ToolSchemas out;
  if (tools.is_null()) return out;
  if (!tools.is_array()) return Error("tools: expected an array");
  for (size_t i = 0; i < tools.as_array().size(); ++i) {
    const JsonValue& tool = tools.as_array()[i];
    const JsonValue* fn = tool.find("function");
    if (!fn) fn = &tool;
    const JsonValue* name = fn->find("name");
    if (!name || !name->is_string()) return Error("tools[" + std::to_string(i) + "]: missing function name");
    Tool& t = out.tools_[name->as_string()];
    const JsonValue* params = fn->find("parameters");
    const JsonValue* props = params ? params->find("properties") : nullptr;
    if (props && props->is_object()) {
      for (const auto& [param, schema] : props->as_object()) {
        t.string_parameters[param] = json_type_is_string(schema.find("type"));
      }
    }
  }
  return out;
}

bool ToolSchemas::has_tool(std::string_view name) const { return tools_.find(name) != tools_.end(); }

bool ToolSchemas::is_string_parameter(std::string_view tool, std::string_view parameter) const {
  const auto t = tools_.find(tool);
  if (t == tools_.end()) return false;
  const auto p = t->second.string_parameters.find(parameter);
  return p != t->second.string_parameters.end() && p->second;
}

void ParsedMessage::append(const OutputDelta& delta) {
  content += delta.content;
  reasoning_content += delta.reasoning_content;
  for (const ToolCallDelta& d : delta.tool_calls) {
    if (d.index >= tool_calls.size()) tool_calls.resize(d.index + 1);
    if (!d.name.empty()) tool_calls[d.index].name = d.name;
    tool_calls[d.index].arguments += d.arguments;
  }
}

OutputParser::OutputParser(OutputParserOptions options)
    : options_(std::move(options)), state_(options_.starts_in_reasoning ? State::reasoning : State::content) {}

OutputDelta OutputParser::feed(std::string_view text) {
  OutputDelta out;
  buffer_.append(text);
  run(out, /*final=*/false);
  return out;
}

OutputDelta OutputParser::finish() {
  OutputDelta out;
  run(out, /*final=*/true);
  return out;
}

ParsedMessage OutputParser::parse(std::string_view text, OutputParserOptions options) {
  OutputParser parser(std::move(options));
  ParsedMessage message;
  message.append(parser.feed(text));
  message.append(parser.finish());
  return message;
}

// Each step consumes what it can from the front of buffer_ and may change state; it returns having
// consumed nothing only when it must wait for more text (or, when final, when nothing is left).
void OutputParser::run(OutputDelta& out, bool final) {
  while (true) {
    const size_t before = buffer_.size();
    const State state = state_;
    switch (state_) {
      case State::content: step_content(out, final); break;
      case State::reasoning: step_reasoning(out, final); break;
      case State::call_name: step_call_name(out, final); break;
      case State::call_between: step_call_between(out, final); break;
      case State::call_key: step_call_key(out, final); break;
      case State::call_value: step_call_value(out, final); break;
    }
    if (buffer_.size() == before && state_ == state) break;
  }
}

// A <think> opens reasoning only before any output but whitespace (a model whose prompt did not
// open it may start with it); later it is text like any other.
void OutputParser::step_content(OutputDelta& out, bool final) {
  const auto emit = [&](size_t n) {
    const std::string_view text = std::string_view(buffer_).substr(0, n);
    if (!trim(text).empty()) seen_output_ = true;
    out.content.append(text);
    buffer_.erase(0, n);
  };
  size_t at = buffer_.find(kCallOpen);
  bool think = false;
  if (!seen_output_) {
    const size_t t = buffer_.find(kThinkOpen);
    if (t < at && trim(std::string_view(buffer_).substr(0, t)).empty()) at = t, think = true;
  }
  if (at != std::string::npos) {
    emit(at);
    buffer_.erase(0, think ? kThinkOpen.size() : kCallOpen.size());
    state_ = think ? State::reasoning : State::call_name;
    return;
  }
  const size_t hold = final          ? 0
                      : seen_output_ ? partial_tag_suffix(buffer_, {kCallOpen})
                                     : partial_tag_suffix(buffer_, {kCallOpen, kThinkOpen});
  emit(buffer_.size() - hold);
}

void OutputParser::step_reasoning(OutputDelta& out, bool final) {
  if (const size_t at = buffer_.find(kThinkClose); at != std::string::npos) {
    out.reasoning_content.append(buffer_, 0, at);
    buffer_.erase(0, at + kThinkClose.size());
    state_ = State::content;
    return;
  }
  const size_t hold = final ? 0 : partial_tag_suffix(buffer_, {kThinkClose});
  out.reasoning_content.append(buffer_, 0, buffer_.size() - hold);
  buffer_.erase(0, buffer_.size() - hold);
}

// After <tool_call>: the name runs to <arg_key> or </tool_call>. Until then nothing is emitted, so
// that text which is not a call (no delimiter, a '<' that starts no delimiter, an unknown tool) can
// go back to content whole.
void OutputParser::step_call_name(OutputDelta& out, bool final) {
  const size_t lt = buffer_.find('<');
  const auto not_a_call = [&](size_t upto) {
    out.content += kCallOpen;
    out.content.append(buffer_, 0, upto);
    buffer_.erase(0, upto);
    seen_output_ = true;
    state_ = State::content;
  };
  if (lt == std::string::npos || lt > kMaxNameBytes) {
    if (final || buffer_.size() > kMaxNameBytes) not_a_call(std::min(buffer_.size(), lt));
    return;
  }
  const std::string_view rest = std::string_view(buffer_).substr(lt);
  const bool key = starts_with(rest, kKeyOpen);
  const bool close = starts_with(rest, kCallClose);
  if (!key && !close) {
    if (!final && (is_partial(rest, kKeyOpen) || is_partial(rest, kCallClose))) return;
    not_a_call(lt);
    return;
  }
  const std::string_view name = trim(std::string_view(buffer_).substr(0, lt));
  if (name.empty() || (!options_.tools.empty() && !options_.tools.has_tool(name))) {
    not_a_call(lt);
    return;
  }
  call_name_ = std::string(name);
  call_args_ = 0;
  seen_output_ = true;
  out.tool_calls.push_back({call_count_++, call_name_, ""});
  buffer_.erase(0, lt + (key ? kKeyOpen.size() : kCallClose.size()));
  call_raw_.assign(key ? kKeyOpen : std::string_view());
  if (key) {
    state_ = State::call_key;
  } else {
    close_call(out);
  }
}

// Between tags: after </arg_key> (a key waiting for its value) expect <arg_value>; after
// </arg_value> expect <arg_key> or </tool_call>. Whitespace may come first. Anything else breaks the call: it is closed and the text goes back to content.
void OutputParser::step_call_between(OutputDelta& out, bool final) {
  size_t ws = 0;
  while (ws < buffer_.size() && is_space(buffer_[ws])) ++ws;
  const std::string_view rest = std::string_view(buffer_).substr(ws);
  const bool expect_value = !key_.empty();
  const auto take = [&](std::string_view tag) {
    call_raw_.append(buffer_, 0, ws + tag.size());
    buffer_.erase(0, ws + tag.size());
  };
  if (expect_value) {
    if (starts_with(rest, kValueOpen)) {
      take(kValueOpen);
      open_value(out);
      return;
    }
    if (!final && (rest.empty() || is_partial(rest, kValueOpen))) return;
  } else {
    if (starts_with(rest, kKeyOpen)) {
      take(kKeyOpen);
      state_ = State::call_key;
      return;
    }
    if (starts_with(rest, kCallClose)) {
      buffer_.erase(0, ws + kCallClose.size());
      call_raw_.clear();
      close_call(out);
      return;
    }
    if (!final && (rest.empty() || is_partial(rest, kKeyOpen) || is_partial(rest, kCallClose))) return;
  }
  // Malformed, or the end of the stream inside the call: the call is closed and the raw text since
  // the last emitted argument goes back to content with the rest.
  std::string raw = std::move(call_raw_);
  call_raw_.clear();
  key_.clear();
  close_call(out);
  out.content += raw;
  state_ = State::content;
}

void OutputParser::step_call_key(OutputDelta& out, bool final) {
  if (const size_t at = buffer_.find(kKeyClose); at != std::string::npos && at <= kMaxNameBytes) {
    const std::string_view key = trim(std::string_view(buffer_).substr(0, at));
    if (!key.empty() && key.find('<') == std::string_view::npos) {
      key_ = std::string(key);
      call_raw_.append(buffer_, 0, at + kKeyClose.size());
      buffer_.erase(0, at + kKeyClose.size());
      state_ = State::call_between;
      return;
    }
  } else {
    const size_t lt = buffer_.find('<');
    const bool may_continue = buffer_.size() <= kMaxNameBytes + kKeyClose.size() &&
                              (lt == std::string::npos || is_partial(std::string_view(buffer_).substr(lt), kKeyClose));
    if (!final && may_continue) return;
  }
  std::string raw = std::move(call_raw_);
  call_raw_.clear();
  key_.clear();
  close_call(out);
  out.content += raw;
  state_ = State::content;
}

void OutputParser::open_value(OutputDelta& out) {
  std::string fragment = call_args_ == 0 ? "{" : ", ";
  append_json_string(fragment, key_);
  fragment += ": ";
  value_is_string_ = options_.tools.is_string_parameter(call_name_, key_);
  if (value_is_string_) fragment += '"';
  arguments(out, fragment);
  ++call_args_;
  key_.clear();
  call_raw_.clear();
  value_.clear();
  state_ = State::call_value;
}

void OutputParser::step_call_value(OutputDelta& out, bool final) {
  const size_t at = buffer_.find(kValueClose);
  const size_t take = at != std::string::npos ? at
                      : final                 ? buffer_.size()
                                              : buffer_.size() - partial_tag_suffix(buffer_, {kValueClose});
  if (take > 0) {
    if (value_is_string_) {
      std::string quoted;
      append_json_string(quoted, std::string_view(buffer_).substr(0, take));
      arguments(out, std::string_view(quoted).substr(1, quoted.size() - 2));
    } else {
      value_.append(buffer_, 0, take);
    }
    buffer_.erase(0, take);
  }
  if (at != std::string::npos) {
    buffer_.erase(0, kValueClose.size());
    close_value(out);
    state_ = State::call_between;
  } else if (final) {
    close_value(out);
    state_ = State::call_between;
  }
}

// Ends the open value: the closing quote of a string, or a non-string value as JSON when it is
// valid JSON (numbers, booleans, null, objects, arrays) one level shallower than parse_json allows
// (the arguments object holds it, and must parse too), else as a string.
void OutputParser::close_value(OutputDelta& out) {
  if (value_is_string_) {
    arguments(out, "\"");
    return;
  }
  std::string fragment;
  if (auto parsed = parse_json(trim(value_), kJsonMaxDepth - 1); parsed.ok()) {
    append_python_json(fragment, *parsed);
  } else {
    append_json_string(fragment, value_);
  }
  value_.clear();
  arguments(out, fragment);
}

void OutputParser::close_call(OutputDelta& out) {
  if (state_ == State::call_value) close_value(out);
  arguments(out, call_args_ == 0 ? "{}" : "}");
  call_args_ = 0;
  key_.clear();
  call_raw_.clear();
  state_ = State::content;
}

void OutputParser::arguments(OutputDelta& out, std::string_view fragment) {
  if (fragment.empty()) return;
  const size_t index = call_count_ - 1;
  if (out.tool_calls.empty() || out.tool_calls.back().index != index) out.tool_calls.push_back({index, "", ""});
  out.tool_calls.back().arguments.append(fragment);
}

}  // namespace ferry::model
