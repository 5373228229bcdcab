// Error bodies are valid JSON whatever the client sent: invalid UTF-8 is replaced, long echoes are
// cut, and numbers are written short.
#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "http/openai_request.hpp"
#include "http/responses.hpp"
#include "http/safe_text.hpp"

using namespace ferry::http;
namespace bj = boost::json;

namespace {

// Boost.JSON's parser rejects invalid UTF-8 in strings, so parsing is the check.
bj::object parse_error(const std::string& body) {
  bj::error_code ec;
  const bj::value v = bj::parse(body, ec);
  EXPECT_FALSE(ec) << ec.message() << ": " << body;
  return ec ? bj::object{} : v.at("error").as_object();
}

}  // namespace

TEST(ErrorBody, InvalidUtf8IsReplacedSoTheBodyParses) {
  EXPECT_EQ(valid_utf8("ok \xff\xfe end"), "ok \xEF\xBF\xBD\xEF\xBF\xBD end");
  EXPECT_EQ(valid_utf8("caf\xC3\xA9"), "caf\xC3\xA9");  // valid text is kept
  EXPECT_EQ(valid_utf8("\xC3"), "\xEF\xBF\xBD");        // a truncated character
  EXPECT_EQ(valid_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
  ApiError e = make_error(404, "invalid_request_error", "not_found", "no endpoint GET /\xff\xfe");
  e.param = "id\xff";
  const auto error = parse_error(to_json(e));
  EXPECT_EQ(error.at("message"), "no endpoint GET /\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(error.at("param"), "id\xEF\xBF\xBD");
}

TEST(ErrorBody, LongEchoesAreCutAtACharacterBoundary) {
  EXPECT_EQ(excerpt("short"), "short");
  const std::string long_text(100000, 'x');
  EXPECT_EQ(excerpt(long_text, 10), "xxxxxxxxxx...");
  EXPECT_EQ(excerpt("\xC3\xA9\xC3\xA9", 3), "\xC3\xA9...");  // never half a character
  ApiError e = invalid_field(std::string(5000, 'k'), "value: " + long_text);
  const auto error = parse_error(to_json(e));
  EXPECT_LE(error.at("message").as_string().size(), 1024u + 3);
  EXPECT_LE(error.at("param").as_string().size(), 256u + 3);
}

TEST(ErrorBody, AbsurdNumbersGetShortMessages) {
  EXPECT_EQ(short_number(1e300), "1e+300");
  EXPECT_EQ(short_number(0.7), "0.7");
  EXPECT_EQ(short_number(2), "2");
  auto parsed = parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "temperature": 1e300})");
  ASSERT_TRUE(std::holds_alternative<ApiError>(parsed));
  const ApiError& e = std::get<ApiError>(parsed);
  EXPECT_EQ(e.param, "temperature");
  EXPECT_EQ(e.message, "temperature = 1e+300: expected a number in [0, 2]");
  const std::string digits(100000, '9');
  auto completion = parse_completion_request(R"({"prompt": [)" + digits + "]}");
  ASSERT_TRUE(std::holds_alternative<ApiError>(completion));
  EXPECT_LT(std::get<ApiError>(completion).message.size(), 200u) << std::get<ApiError>(completion).message;
}
