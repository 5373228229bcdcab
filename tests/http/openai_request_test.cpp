// Request bodies: what is accepted, and that every rejection names the field and the problem.
#include "http/openai_request.hpp"

#include <gtest/gtest.h>

using namespace ferry::http;

namespace {

ApiError chat_error(std::string_view body) {
  auto r = parse_chat_request(body);
  EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << body;
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

ChatRequest chat_ok(std::string_view body) {
  auto r = parse_chat_request(body);
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << body << " -> " << e->message;
  return std::holds_alternative<ChatRequest>(r) ? std::get<ChatRequest>(r) : ChatRequest{};
}

const char* kUser = R"("messages": [{"role": "user", "content": "hi"}])";

std::string with(const std::string& fields) { return std::string("{") + kUser + ", " + fields + "}"; }

}  // namespace

TEST(OpenAiRequest, ParsesAChatRequestWithEveryOption) {
  const auto r = chat_ok(R"({
    "model": "glm-5.3-flash",
    "messages": [{"role": "system", "content": "be brief"},
                 {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                 {"role": "assistant", "content": null, "reasoning_content": "hm",
                  "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
                 {"role": "tool", "tool_call_id": "c1", "content": "42"}],
    "tools": [{"type": "function", "function": {"name": "f", "description": "d",
               "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}],
    "tool_choice": "auto", "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": -3,
    "max_tokens": 10, "max_completion_tokens": 20, "stop": ["\n\n", "END"], "n": 1, "stream": true,
    "stream_options": {"include_usage": true}, "chat_template_kwargs": {"enable_thinking": false},
    "reasoning_effort": "low", "return_token_ids": true, "user": "someone", "frequency_penalty": 0,
    "logprobs": false, "parallel_tool_calls": true, "response_format": {"type": "text"}
  })");
  EXPECT_EQ(r.options.model, "glm-5.3-flash");
  ASSERT_TRUE(r.messages.is_array());
  EXPECT_EQ(r.messages.as_array().size(), 4u);
  ASSERT_TRUE(r.tools.is_array());
  EXPECT_FLOAT_EQ(*r.options.temperature, 0.5f);
  EXPECT_FLOAT_EQ(*r.options.top_p, 0.9f);
  EXPECT_EQ(*r.options.top_k, 40u);
  EXPECT_FLOAT_EQ(*r.options.min_p, 0.05f);
  EXPECT_EQ(*r.options.seed, static_cast<uint64_t>(-3));
  EXPECT_EQ(*r.options.max_tokens, 20u);  // max_completion_tokens wins
  EXPECT_EQ(r.options.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_TRUE(r.options.stream);
  EXPECT_TRUE(r.options.include_usage);
  EXPECT_TRUE(r.options.return_token_ids);
  EXPECT_EQ(r.enable_thinking, false);
  EXPECT_EQ(r.reasoning_effort, "low");
}

TEST(OpenAiRequest, NumbersInMessagesKeepTheirText) {
  const auto r = chat_ok(R"({"messages": [{"role": "assistant", "content": "x", "tool_calls":
    [{"function": {"name": "f", "arguments": {"x": 1.50, "y": 1e3}}}]}]})");
  const auto* args = r.messages.as_array()[0].find("tool_calls")->as_array()[0].find("function")->find("arguments");
  EXPECT_EQ(args->find("x")->as_number().text, "1.50");
  EXPECT_EQ(args->find("y")->as_number().text, "1e3");
}

TEST(OpenAiRequest, ToolChoiceNoneDropsTheTools) {
  const auto r = chat_ok(with(R"("tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none")"));
  EXPECT_TRUE(r.tools.is_null());
}

TEST(OpenAiRequest, MalformedJsonIsAnError) {
  for (const char* body : {"", "{", "{\"messages\": [}", "[1]", "nul", "{\"messages\": tru}", "{} x", "{}}",
                           "{\"a\" 1}", "{\"temperature\": 1.2.3}", "{\"x\": [1, 2,]}", "{\"x\": 01}"}) {
    const ApiError e = chat_error(body);
    EXPECT_EQ(e.status, 400u) << body;
    EXPECT_FALSE(e.message.empty()) << body;
  }
}

TEST(OpenAiRequest, InvalidUtf8IsNamed) {
  const ApiError e = chat_error("{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}");
  EXPECT_NE(e.message.find("UTF-8"), std::string::npos) << e.message;
}

TEST(OpenAiRequest, WrongTypesAndValuesNameTheField) {
  struct Case {
    std::string body;
    std::string param;
    std::string says;
  };
  const std::vector<Case> cases = {
      {R"({"model": "m"})", "messages", "messages is required"},
      {R"({"messages": {}})", "messages", "array"},
      {R"({"messages": []})", "messages", "must not be empty"},
      {R"({"messages": [3]})", "messages[0]", "must be an object"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role", "required"},
      {R"({"messages": [{"role": "wizard", "content": "x"}]})", "messages[0].role", "'wizard'"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content", "required"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content", "string"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
       "messages[0].content[0].type", "only text"},
      {R"({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": ""}}]}]})",
       "messages[0].tool_calls[0].function.name", "non-empty"},
      {with(R"("temperature": "hot")"), "temperature", "must be a number"},
      {with(R"("temperature": 3)"), "temperature", "[0"},
      {with(R"("top_p": 0)"), "top_p", "(0"},
      {with(R"("top_k": 1.5)"), "top_k", "integer"},
      {with(R"("max_tokens": 0)"), "max_tokens", "[1"},
      {with(R"("seed": "x")"), "seed", "integer"},
      {with(R"("stop": 7)"), "stop", "string or an array"},
      {with(R"("stop": ["a", ""])"), "stop[1]", "non-empty"},
      {with(R"("n": 2)"), "n", "n = 1"},
      {with(R"("stream": "yes")"), "stream", "true or false"},
      {with(R"("stream_options": {"include_usage": 1})"), "stream_options.include_usage", "true or false"},
      {with(R"("tools": {})"), "tools", "array"},
      {with(R"("tools": [{"type": "function"}])"), "tools[0].function", "object"},
      {with(R"("tools": [{"type": "retrieval", "function": {"name": "f"}}])"), "tools[0].type", "function"},
      {with(R"("tools": [{"type": "function", "function": {"name": "bad name!"}}])"), "tools[0].function.name", "64"},
      {with(R"("tools": [{"type": "function", "function": {"name": "f", "parameters": []}}])"),
       "tools[0].function.parameters", "JSON Schema object"},
      {with(R"("tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}])"),
       "tools[0].function.parameters.type", "object"},
      {with(R"("tool_choice": "required")"), "tool_choice", "auto"},
      {with(R"("presence_penalty": 0.5)"), "presence_penalty", "not supported"},
      {with(R"("logprobs": true)"), "logprobs", "not supported"},
      {with(R"("chat_template_kwargs": {"enable_thinking": "no"})"), "chat_template_kwargs.enable_thinking", "true or false"},
      {with(R"("response_format": {"type": "json_object"})"), "response_format", "text"},
  };
  for (const auto& c : cases) {
    const ApiError e = chat_error(c.body);
    EXPECT_EQ(e.status, 400u) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_NE(e.message.find(c.says), std::string::npos) << c.body << " -> " << e.message;
  }
}

TEST(OpenAiRequest, CompletionPromptForms) {
  auto text = parse_completion_request(R"({"prompt": "hello", "max_tokens": 3})");
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(text));
  EXPECT_EQ(std::get<std::string>(std::get<CompletionRequest>(text).prompt), "hello");
  auto one = parse_completion_request(R"({"prompt": ["hello"]})");
  EXPECT_EQ(std::get<std::string>(std::get<CompletionRequest>(one).prompt), "hello");
  auto ids = parse_completion_request(R"({"prompt": [1, 2, 3]})");
  EXPECT_EQ(std::get<std::vector<int32_t>>(std::get<CompletionRequest>(ids).prompt), (std::vector<int32_t>{1, 2, 3}));

  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({"max_tokens": 3})", "prompt"},
           {R"({"prompt": 5})", "prompt"},
           {R"({"prompt": []})", "prompt"},
           {R"({"prompt": [1, -2]})", "prompt[1]"},
           {R"({"prompt": [1, 2.5]})", "prompt[1]"},
           {R"({"prompt": [[1], [2]]})", "prompt"},
           {R"({"prompt": "x", "echo": true})", "echo"},
           {R"({"prompt": "x", "best_of": 3})", "best_of"},
           {R"({"prompt": "x", "suffix": "y"})", "suffix"},
       }) {
    auto r = parse_completion_request(body);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << body;
    EXPECT_EQ(std::get<ApiError>(r).param, param) << body << " -> " << std::get<ApiError>(r).message;
  }
}

TEST(OpenAiRequest, DeepNestingIsRefusedNotOverflowed) {
  std::string nest;
  for (int i = 0; i < 200; ++i) nest += "[";
  for (int i = 0; i < 200; ++i) nest += "]";
  const ApiError e = chat_error(with("\"x\": " + nest));
  EXPECT_EQ(e.status, 400u);
}
