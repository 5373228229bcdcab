// Tokenizing with a cap: the capped encoding is the full one when it fits and a refusal when it does
// not, and the work a huge text costs is bounded by the cap (a prompt of 16 MB is refused at once).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <random>

#include "model/text/tokenizer.hpp"
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

TEST(TokenizerCap, TheLongestTokenBoundsATextsTokenCount) {
  const Tokenizer& t = fixture();
  ASSERT_GT(t.max_token_bytes(), 1u);
  for (size_t id = 0; id < t.vocab_size(); ++id) {
    EXPECT_LE(t.token_bytes(static_cast<TokenId>(id)).size(), t.max_token_bytes());
  }
  // Of the longest token's text, repeated: every token covers at most max_token_bytes() bytes.
  const std::string text(100000, 'a');
  EXPECT_GE(t.encode(text, true).size() * t.max_token_bytes(), text.size());
}

TEST(TokenizerCap, CappedIsTheFullEncodingOrARefusal) {
  const Tokenizer& t = fixture();
  std::mt19937 rng(7);
  const std::string alphabet = "ab cd\n  éé<|user|>12345 xyz!?\t\xff";
  for (int round = 0; round < 300; ++round) {
    std::string text;
    const size_t n = rng() % 400;
    for (size_t i = 0; i < n; ++i) text += alphabet[rng() % alphabet.size()];
    const auto full = t.encode(text, true);
    for (size_t cap : {size_t{0}, full.size() ? full.size() - 1 : 0, full.size(), full.size() + 1, size_t{5}}) {
      std::vector<TokenId> out{42};  // appended to, never cleared
      const bool fits = t.encode(text, true, out, cap);
      EXPECT_EQ(fits, full.size() <= cap) << text << " cap " << cap;
      if (fits) {
        EXPECT_EQ(std::vector<TokenId>(out.begin() + 1, out.end()), full);
      }
      EXPECT_EQ(out.front(), 42);
    }
  }
}

TEST(TokenizerCap, AHugeTextIsRefusedWithoutBeingSplit) {
  const Tokenizer& t = fixture();
  const std::string huge(16u << 20, 'a');
  std::vector<TokenId> out;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(t.encode(huge, true, out, 4096));
  EXPECT_TRUE(out.empty());  // refused on its length alone
  // Within the length bound but over the cap: stopped at the first piece that cannot fit.
  const std::string long_words(4096 * t.max_token_bytes() - 1, 'a');
  EXPECT_FALSE(t.encode(long_words, true, out, 4096));
  std::string many_pieces;
  for (int i = 0; i < 200000; ++i) many_pieces += "x ";
  out.clear();
  EXPECT_FALSE(t.encode(many_pieces, true, out, 100));
  EXPECT_LE(out.size(), 101u + 8);  // stopped just past the cap, not after 400,000 tokens
  std::printf("refusing 16 MiB, %zu B and %zu B of text took %.1f ms\n", huge.size(), long_words.size(),
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
}

}  // namespace
}  // namespace ferry::model
