// What current OpenAI clients send: the developer role, reasoning_effort levels (none and minimal
// turn thinking off), and limits that only make sense together (min_tokens <= max_tokens).
#include <gtest/gtest.h>

#include "http/openai_request.hpp"

using namespace ferry::http;

namespace {

std::variant<ChatRequest, ApiError> chat(const std::string& fields) {
  return parse_chat_request(R"({"messages": [{"role": "user", "content": "hi"}])" + fields + "}");
}

}  // namespace

TEST(OpenAiConformance, DeveloperIsReadAsSystem) {
  auto r = parse_chat_request(
      R"({"messages": [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}]})");
  ASSERT_TRUE(std::holds_alternative<ChatRequest>(r)) << std::get<ApiError>(r).message;
  const auto& messages = std::get<ChatRequest>(r).messages.as_array();
  EXPECT_EQ(messages[0].find("role")->as_string(), "system");
  EXPECT_EQ(messages[1].find("role")->as_string(), "user");
}

TEST(OpenAiConformance, ReasoningEffortIsOneOfTheLevels) {
  for (const char* level : {"low", "medium", "high", "xhigh", "max"}) {
    auto r = chat(std::string(R"(, "reasoning_effort": ")") + level + "\"");
    ASSERT_TRUE(std::holds_alternative<ChatRequest>(r)) << level;
    EXPECT_EQ(std::get<ChatRequest>(r).reasoning_effort, level);
    EXPECT_EQ(std::get<ChatRequest>(r).enable_thinking, std::nullopt) << level;
  }
  for (const char* off : {"none", "minimal"}) {
    auto r = chat(std::string(R"(, "reasoning_effort": ")") + off + "\"");
    ASSERT_TRUE(std::holds_alternative<ChatRequest>(r)) << off;
    EXPECT_EQ(std::get<ChatRequest>(r).enable_thinking, false) << off;
    r = chat(std::string(R"(, "chat_template_kwargs": {"reasoning_effort": ")") + off + "\"}");
    ASSERT_TRUE(std::holds_alternative<ChatRequest>(r)) << off;
    EXPECT_EQ(std::get<ChatRequest>(r).enable_thinking, false) << off;
  }
  for (const char* bad : {R"(, "reasoning_effort": "extreme")", R"(, "reasoning_effort": "HIGH")",
                          R"(, "chat_template_kwargs": {"reasoning_effort": "lots"})"}) {
    auto r = chat(bad);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << bad;
    EXPECT_NE(std::get<ApiError>(r).param.find("reasoning_effort"), std::string::npos);
    EXPECT_NE(std::get<ApiError>(r).message.find("expected none, minimal, low"), std::string::npos);
  }
  auto contradiction = chat(R"(, "reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": true})");
  ASSERT_TRUE(std::holds_alternative<ApiError>(contradiction));
  EXPECT_EQ(std::get<ApiError>(contradiction).param, "reasoning_effort");
}

TEST(OpenAiConformance, MinTokensMayNotExceedMaxTokens) {
  auto r = chat(R"(, "min_tokens": 10, "max_tokens": 5)");
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_EQ(std::get<ApiError>(r).param, "min_tokens");
  EXPECT_EQ(std::get<ApiError>(r).message, "min_tokens = 10 is more than max_tokens = 5");
  EXPECT_TRUE(std::holds_alternative<ChatRequest>(chat(R"(, "min_tokens": 5, "max_tokens": 5)")));
  EXPECT_TRUE(std::holds_alternative<ChatRequest>(chat(R"(, "min_tokens": 5)")));  // capped at the limit later
  auto completion = parse_completion_request(R"({"prompt": "x", "max_completion_tokens": 2, "min_tokens": 3})");
  ASSERT_TRUE(std::holds_alternative<ApiError>(completion));
  EXPECT_EQ(std::get<ApiError>(completion).param, "min_tokens");
}
