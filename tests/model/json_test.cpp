#include "model/text/json.hpp"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace ferry::model {
namespace {

std::string dumps(std::string_view text) {
  auto v = parse_json(text);
  EXPECT_TRUE(v.ok()) << text << ": " << (v.ok() ? "" : v.error().message);
  return v.ok() ? to_python_json(*v) : "";
}

// Expected values are what Python prints for json.dumps(json.loads(text)).
TEST(Json, NumbersPrintAsPythonDoes) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"1.0", "1.0"},         {"1e-5", "1e-05"},        {"1e16", "1e+16"},
      {"1e15", "1000000000000000.0"},                   {"0.0001", "0.0001"},
      {"123.456", "123.456"}, {"-0.0", "-0.0"},         {"1E400", "Infinity"},
      {"-1e400", "-Infinity"}, {"1e-400", "0.0"},       {"0.1", "0.1"},
      {"2.5e-7", "2.5e-07"},  {"12345678901234567890.0", "1.2345678901234567e+19"},
      {"1e22", "1e+22"},      {"5e-324", "5e-324"},     {"1.7976931348623157e308", "1.7976931348623157e+308"},
      {"100", "100"},         {"-0", "0"},              {"123456789012345678901234567890", "123456789012345678901234567890"},
      {"0.30000000000000004", "0.30000000000000004"},  {"9007199254740993.0", "9007199254740992.0"},
  };
  for (const auto& [in, want] : cases) EXPECT_EQ(dumps(in), want) << in;
}

TEST(Json, StringsEscapeAsPythonDoesWithoutEnsureAscii) {
  EXPECT_EQ(dumps(R"({"k":"x\n\u00e9\u001f\u007f\"\\ \u2028\b\f\r\t\/"})"),
            "{\"k\": \"x\\n\xC3\xA9\\u001f\x7F\\\"\\\\ \xE2\x80\xA8\\b\\f\\r\\t/\"}");
  EXPECT_EQ(dumps(R"("\ud83d\ude00")"), "\"\xF0\x9F\x98\x80\"");
}

TEST(Json, KeepsKeyOrderAndTakesTheLastOfARepeatedKey) {
  EXPECT_EQ(dumps(R"({"b":1,"a":[true,false,null,{}],"c":{"z":1,"y":2}})"),
            R"({"b": 1, "a": [true, false, null, {}], "c": {"z": 1, "y": 2}})");
  EXPECT_EQ(dumps(R"({"a":1,"b":2,"a":3})"), R"({"a": 3, "b": 2})");
  // Large objects take the indexed path for repeated keys.
  std::string big = "{";
  for (int i = 0; i < 40; ++i) big += "\"k" + std::to_string(i) + "\":" + std::to_string(i) + ",";
  big += "\"k3\":\"again\"}";
  const std::string out = dumps(big);
  EXPECT_NE(out.find("\"k3\": \"again\", \"k4\": 4"), std::string::npos) << out;
}

TEST(Json, RejectsInvalidDocumentsWithTheOffset) {
  const std::vector<std::string> bad = {
      "",        "{",        "[1,]",       "{\"a\":1,}",   "01",     "1.",        "-",         "nul",
      "\"abc",   "\"\\x\"",  "\"\\ud800\"", "\"\\udc00x\"", "[1] 2",  "\"\x01\"",  "\"\xff\"",  "{1:2}",
      "\"\xC3\"", "[\"a\" \"b\"]",
  };
  for (const std::string& text : bad) {
    auto v = parse_json(text);
    ASSERT_FALSE(v.ok()) << "accepted: " << text;
    EXPECT_NE(v.error().message.find("at byte"), std::string::npos) << v.error().message;
  }
  std::string deep(600, '[');
  deep += std::string(600, ']');
  auto v = parse_json(deep);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.error().message.find("nesting"), std::string::npos);
}

TEST(Json, TruthinessFollowsPython) {
  for (const char* falsy : {"null", "false", "0", "-0", "0.0", "0e10", "\"\"", "[]", "{}"}) {
    EXPECT_FALSE(parse_json(falsy)->truthy()) << falsy;
  }
  for (const char* truthy : {"true", "1", "0.5", "-2e-3", "\"0\"", "[0]", "{\"a\":null}"}) {
    EXPECT_TRUE(parse_json(truthy)->truthy()) << truthy;
  }
}

TEST(Json, FindLooksUpObjectMembers) {
  auto v = parse_json(R"({"a":{"b":"c"}})");
  ASSERT_TRUE(v.ok());
  ASSERT_NE(v->find("a"), nullptr);
  EXPECT_EQ(v->find("a")->find("b")->as_string(), "c");
  EXPECT_EQ(v->find("b"), nullptr);
  EXPECT_EQ(v->find("a")->find("b")->find("x"), nullptr);
}

}  // namespace
}  // namespace ferry::model
