#include "model/text/streaming_detokenizer.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "model/formats/gguf.hpp"
#include "model/text/tokenizer_gguf.hpp"

namespace ferry::model {
namespace {

const Tokenizer& fixture() {
  static const Tokenizer tokenizer = [] {
    auto t = load_tokenizer(std::filesystem::path(FERRY_SOURCE_DIR) / "tests" / "fixtures" / "tokenizer");
    if (!t) throw std::runtime_error(t.error().message);
    return std::move(*t);
  }();
  return tokenizer;
}

std::string lossy(std::string_view bytes) {
  std::string out;
  EXPECT_EQ(append_valid_utf8(out, bytes, /*final=*/true), 0u);
  return out;
}

const std::string kFffd = "\xEF\xBF\xBD";

// Expected values are Python's bytes.decode("utf-8", errors="replace").
TEST(AppendValidUtf8, ReplacesMaximalSubpartsLikePython) {
  EXPECT_EQ(lossy("\xE2\x82("), kFffd + "(");
  EXPECT_EQ(lossy("\xF0\x9F\x98"), kFffd);
  EXPECT_EQ(lossy("\xC0\xAF"), kFffd + kFffd);
  EXPECT_EQ(lossy("\xED\xA0\x80"), kFffd + kFffd + kFffd);
  EXPECT_EQ(lossy("a\xFF" "b"), "a" + kFffd + "b");
  EXPECT_EQ(lossy("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);
  EXPECT_EQ(lossy("\xE0\x80\x80"), kFffd + kFffd + kFffd);
  EXPECT_EQ(lossy("\xF0\x80"), kFffd + kFffd);
  EXPECT_EQ(lossy("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"), "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
  EXPECT_EQ(lossy("\x80" "abc"), kFffd + "abc");
}

TEST(AppendValidUtf8, HoldsAnUnfinishedCharacterUnlessFinal) {
  std::string out;
  EXPECT_EQ(append_valid_utf8(out, "ab\xF0\x9F\x98", false), 3u);
  EXPECT_EQ(out, "ab");
  out.clear();
  EXPECT_EQ(append_valid_utf8(out, "ab\xF0\x80", false), 0u);  // F0 80 can never become a character
  EXPECT_EQ(out, "ab" + kFffd + kFffd);
}

TEST(StreamingDetokenizer, NeverEmitsBrokenUtf8AndEqualsTheWholeDecode) {
  const Tokenizer& t = fixture();
  // The small vocabulary has no token for these characters: they arrive one byte token at a time.
  const std::string text = "Grüße 🚀 日本語 <think>x</think> ok 👨\u200d👩\u200d👧!";
  const auto ids = t.encode(text, true);
  StreamingDetokenizer stream(t);
  std::string all;
  for (TokenId id : ids) {
    const std::string piece = stream.push(id);
    EXPECT_TRUE(is_valid_utf8(piece)) << id;
    all += piece;
  }
  all += stream.finish();
  EXPECT_EQ(all, text);
}

TEST(StreamingDetokenizer, ReplacesWhatCanNeverBeComplete) {
  const Tokenizer& t = fixture();
  const auto ids = t.encode("a\xF0\x9F\xFF" "b\xE4\xBD", true);
  StreamingDetokenizer stream(t);
  std::string all;
  for (TokenId id : ids) all += stream.push(id);
  EXPECT_EQ(stream.pending_bytes(), 2u);
  all += stream.finish();
  EXPECT_EQ(all, "a" + kFffd + kFffd + "b" + kFffd);
}

TEST(StreamingDetokenizer, SpecialTokensComeWholeAndEndAHeldCharacter) {
  const Tokenizer& t = fixture();
  std::vector<TokenId> ids = t.encode("\xE4\xBD", true);  // the first two bytes of 你
  ids.push_back(*t.find("<|user|>"));
  ids.push_back(*t.find("<think>"));
  StreamingDetokenizer stream(t);
  std::vector<std::string> pieces;
  for (TokenId id : ids) pieces.push_back(stream.push(id));
  EXPECT_EQ(pieces[0], "");
  EXPECT_EQ(pieces[1], "");
  EXPECT_EQ(pieces[2], kFffd + "<|user|>");
  EXPECT_EQ(pieces[3], "<think>");
  StreamingDetokenizer quiet(t, /*render_special=*/false);
  EXPECT_EQ(quiet.push(*t.find("<|user|>")), "");
  EXPECT_EQ(quiet.push(*t.find("<think>")), "<think>");  // user-defined tokens are text
  EXPECT_EQ(quiet.push(-1), "");
  EXPECT_EQ(quiet.push(999999), "");
}

TEST(StreamingDetokenizer, RandomTokenStreamsStayValid) {
  const Tokenizer& t = fixture();
  std::mt19937 rng(11);
  for (int round = 0; round < 200; ++round) {
    StreamingDetokenizer stream(t);
    std::string all;
    std::vector<TokenId> ids;
    for (int i = 0; i < 40; ++i) ids.push_back(static_cast<TokenId>(rng() % t.vocab_size()));
    for (TokenId id : ids) {
      const std::string piece = stream.push(id);
      ASSERT_TRUE(is_valid_utf8(piece));
      all += piece;
    }
    all += stream.finish();
    EXPECT_EQ(all, lossy(t.decode(ids)));
  }
}

}  // namespace
}  // namespace ferry::model
