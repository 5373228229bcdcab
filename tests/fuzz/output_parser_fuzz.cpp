// libFuzzer target for the streaming reasoning / tool-call parser (model/text/output_parser; built
// and run by tools/fuzz.sh, not by CMake). The first byte picks the options (starting in reasoning,
// with or without known tools), the second seeds where the text is cut, the rest is the model's text
// (made valid UTF-8, as the streaming detokenizer hands it over). Checked: nothing crashes; fed in
// pieces cut at any character boundaries, the parser gives exactly what it gives for the text whole;
// every tool call's arguments are one JSON object; everything it returns is valid UTF-8.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/text/json.hpp"
#include "model/text/output_parser.hpp"
#include "model/text/unicode.hpp"

using namespace ferry::model;

namespace {

const char* const kTools = R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}, "note": {"type": ["string", "null"]}}}}},
  {"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {
      "code": {"type": "string"}, "options": {"type": "object"}}}}},
  {"name": "bare"}
])";

// The characters of `s` that decode; the offsets where each one starts (and the end).
std::string valid_text(std::string_view s, std::vector<size_t>& boundaries) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const auto d = unicode::decode_utf8(s, i);
    if (d.cp < unicode::kInvalidBase) {
      boundaries.push_back(out.size());
      out.append(s.substr(i, d.len));
    }
    i += d.len;
  }
  boundaries.push_back(out.size());
  return out;
}

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto d = unicode::decode_utf8(s, i);
    if (d.cp >= unicode::kInvalidBase) return false;
    i += d.len;
  }
  return true;
}

void check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  static const ToolSchemas tools = *ToolSchemas::from_tools(*parse_json(kTools));
  OutputParserOptions options;
  options.starts_in_reasoning = (data[0] & 1) != 0;
  if (data[0] & 2) options.tools = tools;
  uint32_t seed = data[1] * 2654435761u + 1;
  std::vector<size_t> boundaries;
  const std::string text = valid_text(std::string_view(reinterpret_cast<const char*>(data) + 2, size - 2), boundaries);

  const ParsedMessage whole = OutputParser::parse(text, options);

  OutputParser parser(options);
  ParsedMessage pieces;
  size_t at = 0;
  for (size_t k = 0; k + 1 < boundaries.size();) {
    seed = seed * 1103515245u + 12345u;
    k = std::min(boundaries.size() - 1, k + 1 + (seed >> 16) % 7);
    const OutputDelta delta = parser.feed(std::string_view(text).substr(at, boundaries[k] - at));
    check(is_valid_utf8(delta.content) && is_valid_utf8(delta.reasoning_content));
    pieces.append(delta);
    at = boundaries[k];
  }
  pieces.append(parser.finish());

  check(pieces.content == whole.content);
  check(pieces.reasoning_content == whole.reasoning_content);
  check(pieces.tool_calls.size() == whole.tool_calls.size());
  for (size_t i = 0; i < whole.tool_calls.size(); ++i) {
    check(pieces.tool_calls[i].name == whole.tool_calls[i].name);
    check(pieces.tool_calls[i].arguments == whole.tool_calls[i].arguments);
    auto arguments = parse_json(whole.tool_calls[i].arguments);
    check(arguments.ok() && arguments->is_object());
    check(is_valid_utf8(whole.tool_calls[i].name));
  }
  check(is_valid_utf8(whole.content) && is_valid_utf8(whole.reasoning_content));
  return 0;
}
