#include "model/text/output_parser.hpp"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace ferry::model {
namespace {

const char* const kTools = R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
      "note": {"type": ["string", "null"]}}}}},
  {"type": "function", "function": {"name": "run_code", "parameters": {"type": "object", "properties": {
      "code": {"type": "string"}, "options": {"type": "object"}, "args": {"type": "array"}}}}},
  {"name": "bare", "parameters": {"properties": {"x": {"type": "number"}}}}
])";

OutputParserOptions options(bool with_tools = true, bool in_reasoning = true) {
  OutputParserOptions o;
  o.starts_in_reasoning = in_reasoning;
  if (with_tools) {
    auto tools = ToolSchemas::from_tools(*parse_json(kTools));
    EXPECT_TRUE(tools.ok());
    o.tools = *tools;
  }
  return o;
}

ParsedMessage streamed(std::string_view text, const OutputParserOptions& o, const std::vector<size_t>& cuts) {
  OutputParser parser(o);
  ParsedMessage m;
  size_t at = 0;
  for (size_t cut : cuts) {
    m.append(parser.feed(text.substr(at, cut - at)));
    at = cut;
  }
  m.append(parser.feed(text.substr(at)));
  m.append(parser.finish());
  return m;
}

void expect_same(const ParsedMessage& a, const ParsedMessage& b, const std::string& why) {
  EXPECT_EQ(a.content, b.content) << why;
  EXPECT_EQ(a.reasoning_content, b.reasoning_content) << why;
  ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size()) << why;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    EXPECT_EQ(a.tool_calls[i].name, b.tool_calls[i].name) << why;
    EXPECT_EQ(a.tool_calls[i].arguments, b.tool_calls[i].arguments) << why;
  }
}

void expect_valid_arguments(const ParsedMessage& m) {
  for (const ParsedToolCall& c : m.tool_calls) {
    auto v = parse_json(c.arguments);
    ASSERT_TRUE(v.ok()) << c.arguments;
    EXPECT_TRUE(v->is_object()) << c.arguments;
  }
}

TEST(OutputParser, SplitsReasoningFromContent) {
  auto m = OutputParser::parse("Let me think.\n</think>The answer is 4.", options());
  EXPECT_EQ(m.reasoning_content, "Let me think.\n");
  EXPECT_EQ(m.content, "The answer is 4.");
  m = OutputParser::parse("Hello </think> there", options(true, /*in_reasoning=*/false));
  EXPECT_EQ(m.content, "Hello </think> there");
  EXPECT_EQ(m.reasoning_content, "");
  m = OutputParser::parse("<think>r</think>c", options(true, false));
  EXPECT_EQ(m.reasoning_content, "r");
  EXPECT_EQ(m.content, "c");
  m = OutputParser::parse("c<think>r</think>", options(true, false));
  EXPECT_EQ(m.content, "c<think>r</think>");
  m = OutputParser::parse("\n <think>r</think>c", options(true, false));
  EXPECT_EQ(m.content, "\n c");
  EXPECT_EQ(m.reasoning_content, "r");
  m = OutputParser::parse("unfinished reasoning", options());
  EXPECT_EQ(m.reasoning_content, "unfinished reasoning");
}

TEST(OutputParser, ToolCallArgumentsFollowTheSchema) {
  const auto m = OutputParser::parse(
      "Need weather.</think>Checking.<tool_call>get_weather<arg_key>city</arg_key><arg_value>123</arg_value>"
      "<arg_key>days</arg_key><arg_value>3</arg_value><arg_key>metric</arg_key><arg_value>true</arg_value>"
      "<arg_key>note</arg_key><arg_value>null</arg_value><arg_key>extra</arg_key><arg_value>{\"a\": [1, 2.50]}"
      "</arg_value></tool_call>",
      options());
  EXPECT_EQ(m.reasoning_content, "Need weather.");
  EXPECT_EQ(m.content, "Checking.");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "get_weather");
  EXPECT_EQ(m.tool_calls[0].arguments,
            R"({"city": "123", "days": 3, "metric": true, "note": "null", "extra": {"a": [1, 2.5]}})");
}

TEST(OutputParser, StringValuesKeepEveryByte) {
  const std::string code = "if a < b:\n    print(\"x\\n\", '</arg_')  # <tag> \xE6\x97\xA5\t";
  const auto m = OutputParser::parse(
      "</think><tool_call>run_code<arg_key>code</arg_key><arg_value>" + code +
          "</arg_value><arg_key>args</arg_key><arg_value>not json</arg_value></tool_call>",
      options());
  ASSERT_EQ(m.tool_calls.size(), 1u);
  auto args = parse_json(m.tool_calls[0].arguments);
  ASSERT_TRUE(args.ok()) << m.tool_calls[0].arguments;
  EXPECT_EQ(args->find("code")->as_string(), code);
  EXPECT_EQ(args->find("args")->as_string(), "not json");
}

// The fuzzer's find: a value nested as deep as parse_json allows, wrapped in the arguments object,
// was one level too deep for them to parse. Such a value goes out as a string.
TEST(OutputParser, AValueTooDeepForItsArgumentsObjectIsAString) {
  for (int depth : {kJsonMaxDepth, kJsonMaxDepth + 1}) {  // nested arrays; the innermost at depth - 1
    const std::string value = std::string(depth, '[') + std::string(depth, ']');
    const auto m = OutputParser::parse(
        "</think><tool_call>run_code<arg_key>args</arg_key><arg_value>" + value + "</arg_value></tool_call>", options());
    ASSERT_EQ(m.tool_calls.size(), 1u);
    auto args = parse_json(m.tool_calls[0].arguments);
    ASSERT_TRUE(args.ok()) << depth;
    EXPECT_EQ(args->find("args")->is_string(), depth == kJsonMaxDepth + 1) << depth;
  }
}

TEST(OutputParser, SeveralCallsAndTextAround) {
  const auto m = OutputParser::parse(
      "</think>A<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"
      "\n<tool_call>bare<arg_key>x</arg_key><arg_value> 1e-5 </arg_value></tool_call><tool_call>run_code</tool_call>after",
      options());
  EXPECT_EQ(m.content, "A\nafter");
  ASSERT_EQ(m.tool_calls.size(), 3u);
  EXPECT_EQ(m.tool_calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(m.tool_calls[1].name, "bare");
  EXPECT_EQ(m.tool_calls[1].arguments, R"({"x": 1e-05})");
  EXPECT_EQ(m.tool_calls[2].arguments, "{}");
}

TEST(OutputParser, WhatIsNotACallStaysContent) {
  // An unknown tool, a name that never ends, a '<' that starts no tag: all returned as written.
  for (const std::string& text : std::vector<std::string>{
           "<tool_call>unknown_tool<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>",
           "<tool_call>get_weath",
           "<tool_call>get_weather<b>",
           "x <tool_call> " + std::string(300, 'n') + "<arg_key>",
           "<tool_call></tool_call>",
       }) {
    const auto m = OutputParser::parse(text, options(true, false));
    EXPECT_EQ(m.content, text);
    EXPECT_TRUE(m.tool_calls.empty()) << text;
  }
  // Without known tools any name is accepted.
  EXPECT_EQ(OutputParser::parse("<tool_call>anything</tool_call>", options(false, false)).tool_calls.size(), 1u);
}

TEST(OutputParser, BrokenOrUnterminatedCallsCloseAndLoseNothing) {
  auto m = OutputParser::parse("<tool_call>get_weather<arg_key>city</arg_key>oops</tool_call>rest", options(true, false));
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, "{}");
  EXPECT_EQ(m.content, "<arg_key>city</arg_key>oops</tool_call>rest");

  m = OutputParser::parse("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Par", options(true, false));
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, R"({"city": "Par"})");
  EXPECT_EQ(m.content, "");

  m = OutputParser::parse("<tool_call>get_weather<arg_key>days</arg_key><arg_value>4</arg_valu", options(true, false));
  EXPECT_EQ(m.tool_calls[0].arguments, R"({"days": "4</arg_valu"})");

  m = OutputParser::parse("<tool_call>get_weather<arg_key>ci", options(true, false));
  EXPECT_EQ(m.tool_calls[0].arguments, "{}");
  EXPECT_EQ(m.content, "<arg_key>ci");

  m = OutputParser::parse("<tool_call>get_weather<arg_key>city</arg_key><arg_value>P</arg_value> junk", options(true, false));
  EXPECT_EQ(m.tool_calls[0].arguments, R"({"city": "P"})");
  EXPECT_EQ(m.content, " junk");
}

// Model outputs exercising every path; the property below runs over all of them.
std::vector<std::string> corpus() {
  return {
      "Plain reasoning.</think>Plain answer.",
      "r</think>x<tool_call>get_weather<arg_key>city</arg_key><arg_value>Zürich 日本</arg_value><arg_key>days</arg_key>"
      "<arg_value>2</arg_value></tool_call>",
      "</think><tool_call>run_code<arg_key>code</arg_key><arg_value>for i in range(3):\n  print(\"<\", i)\n</arg_value>"
      "<arg_key>options</arg_key><arg_value>{\"timeout\": 5, \"env\": {\"A\": \"b\"}}</arg_value></tool_call>"
      "<tool_call>bare<arg_key>x</arg_key><arg_value>3.0</arg_value></tool_call>done",
      "thinking about <tool_call> syntax </think>Use <tool_call>name</tool_call> tags.",
      "<<<</think>>>>< <tool_call <tool_call>>",
      "</think><tool_call>get_weather<arg_key>city</arg_key>broken",
      "</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>unterminated \"value\\",
      "</think><tool_call>nope</tool_call><tool_call>get_weather</tool_call>",
      "</think>\n\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>\n",
      "</think></arg_value></arg_key></tool_call><arg_key>",
      " \n<think>r</think>c<think>x",
      "a</thi</think>b<tool_cal<tool_call>get_weather<arg_key>city</arg_key><arg_value></arg_valu</arg_value></tool_call>",
  };
}

TEST(OutputParser, StreamingInAnySplitEqualsTheWholeText) {
  std::mt19937 rng(1234);
  for (bool in_reasoning : {true, false}) {
    for (bool with_tools : {true, false}) {
      const OutputParserOptions o = options(with_tools, in_reasoning);
      for (const std::string& text : corpus()) {
        const ParsedMessage whole = OutputParser::parse(text, o);
        expect_valid_arguments(whole);
        // Every byte on its own,
        std::vector<size_t> every;
        for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
        expect_same(streamed(text, o, every), whole, "byte by byte: " + text);
        // and random split points.
        for (int round = 0; round < 100; ++round) {
          std::vector<size_t> cuts;
          for (size_t i = 1; i < text.size(); ++i) {
            if (rng() % 4 == 0) cuts.push_back(i);
          }
          expect_same(streamed(text, o, cuts), whole, "random split: " + text);
        }
      }
    }
  }
}

TEST(OutputParser, EveryDeltaSequenceBuildsValidJson) {
  const OutputParserOptions o = options();
  for (const std::string& text : corpus()) {
    OutputParser parser(o);
    std::vector<std::string> args;
    const auto take = [&](const OutputDelta& d) {
      for (const ToolCallDelta& c : d.tool_calls) {
        if (c.index >= args.size()) {
          EXPECT_FALSE(c.name.empty()) << "the first delta of a call names it";
          args.resize(c.index + 1);
        }
        args[c.index] += c.arguments;
      }
    };
    for (char c : text) take(parser.feed(std::string_view(&c, 1)));
    take(parser.finish());
    for (const std::string& a : args) EXPECT_TRUE(parse_json(a).ok()) << a;
  }
}

// The parser inverts the template: what GLM-5.3's template writes for an assistant turn (strings raw,
// other values as JSON) parses back into the same message.
TEST(OutputParser, InvertsTheTemplatesToolCallFormat) {
  struct Call {
    std::string name;
    std::string arguments;  // a JSON object
  };
  const std::vector<Call> calls = {
      {"get_weather", R"({"city": "New York, \"NY\"", "days": 10, "metric": false, "note": "x"})"},
      {"run_code", R"({"code": "a <b> c\n\td", "options": {"k": [1, 2.5, null, true]}, "args": ["x"]})"},
      {"bare", R"({"x": -0.5})"},
  };
  std::string text = "reasoning</think>Answer.";
  for (const Call& c : calls) {
    text += "<tool_call>" + c.name;
    const auto args = parse_json(c.arguments);
    for (const auto& [k, v] : args->as_object()) {
      text += "<arg_key>" + k + "</arg_key><arg_value>" + (v.is_string() ? v.as_string() : to_python_json(v)) +
              "</arg_value>";
    }
    text += "</tool_call>";
  }
  const auto m = OutputParser::parse(text, options());
  EXPECT_EQ(m.reasoning_content, "reasoning");
  EXPECT_EQ(m.content, "Answer.");
  ASSERT_EQ(m.tool_calls.size(), calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(m.tool_calls[i].name, calls[i].name);
    EXPECT_EQ(m.tool_calls[i].arguments, calls[i].arguments);
  }
}

TEST(ToolSchemas, ReadsOpenAiAndBareTools) {
  auto t = ToolSchemas::from_tools(*parse_json(kTools));
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->has_tool("get_weather"));
  EXPECT_TRUE(t->has_tool("bare"));
  EXPECT_TRUE(t->is_string_parameter("get_weather", "city"));
  EXPECT_TRUE(t->is_string_parameter("get_weather", "note"));
  EXPECT_FALSE(t->is_string_parameter("get_weather", "days"));
  EXPECT_FALSE(t->is_string_parameter("get_weather", "unknown"));
  EXPECT_FALSE(t->is_string_parameter("nope", "city"));
  EXPECT_FALSE(ToolSchemas::from_tools(*parse_json(R"([{"function": {}}])")).ok());
  EXPECT_FALSE(ToolSchemas::from_tools(*parse_json(R"({"a": 1})")).ok());
  EXPECT_TRUE(ToolSchemas::from_tools(JsonValue()).ok());
}

}  // namespace
}  // namespace ferry::model
