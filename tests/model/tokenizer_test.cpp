// The tokenizer on the small GLM-style test vocabulary (tests/fixtures/tokenizer), its pre-tokenizers
// on their own, its GGUF and Hugging Face storage forms, and its errors. The comparison with Hugging
// Face `tokenizers` itself is tests/python/test_tokenizer_hf.py.
#include "model/text/tokenizer.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "model/formats/gguf.hpp"
#include "model/formats/gguf_writer.hpp"
#include "model/text/pre_tokenizer.hpp"
#include "model/text/tokenizer_gguf.hpp"

namespace ferry::model {
namespace {

const std::filesystem::path kFixture = std::filesystem::path(FERRY_SOURCE_DIR) / "tests" / "fixtures" / "tokenizer";

const Tokenizer& fixture() {
  static const Tokenizer tokenizer = [] {
    auto t = load_tokenizer(kFixture);
    if (!t) throw std::runtime_error(t.error().message);
    return std::move(*t);
  }();
  return tokenizer;
}

std::vector<std::string> pieces(PreTokenizerKind kind, std::string_view text) {
  PreTokenizer pre(kind);
  std::vector<ByteRange> ranges;
  pre.split(text, ranges);
  std::vector<std::string> out;
  for (const ByteRange& r : ranges) out.emplace_back(text.substr(r.begin, r.end - r.begin));
  return out;
}

using Pieces = std::vector<std::string>;

// Expected splits are what Hugging Face `tokenizers` gives with GLM-5.3's Split regex.
TEST(PreTokenizer, Glm4FollowsTheRegex) {
  EXPECT_EQ(pieces(PreTokenizerKind::glm4, "Hello, world!"), (Pieces{"Hello", ",", " world", "!"}));
  EXPECT_EQ(pieces(PreTokenizerKind::glm4, "1234567890 1234 12 1"),
            (Pieces{"123", "456", "789", "0", " ", "123", "4", " ", "12", " ", "1"}));
  EXPECT_EQ(pieces(PreTokenizerKind::glm4, "I'm I'M 'ſ 'ſtop"), (Pieces{"I", "'m", " I", "'M", " '", "ſ", " '", "ſtop"}));
  EXPECT_EQ(pieces(PreTokenizerKind::glm4, "'ſtop 'Stop"), (Pieces{"'ſ", "top", " '", "Stop"}));
  EXPECT_EQ(pieces(PreTokenizerKind::glm4, "cafe\xCC\x81 a\xCC\x81" "b"), (Pieces{"cafe", "\xCC\x81", " a", "\xCC\x81" "b"}));
  EXPECT_EQ(pieces(PreTokenizerKind::glm4, "  Hello\n\n  x  "), (Pieces{" ", " Hello", "\n\n", " ", " x", "  "}));
  EXPECT_EQ(pieces(PreTokenizerKind::glm4, "a \n\t b"), (Pieces{"a", " \n", "\t", " b"}));
  EXPECT_EQ(pieces(PreTokenizerKind::glm4, "x = {1};\n"), (Pieces{"x", " =", " {", "1", "};\n"}));
  EXPECT_EQ(pieces(PreTokenizerKind::glm4, "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C"),
            (Pieces{"\xE4\xBD\xA0\xE5\xA5\xBD", "\xEF\xBC\x8C"}));
  EXPECT_EQ(pieces(PreTokenizerKind::qwen2, "1234"), (Pieces{"1", "2", "3", "4"}));
}

TEST(PreTokenizer, NamesOfTheGlmPreTokenizer) {
  // The published files say glm4; mainline llama.cpp's converter (PR #27773) says glm5 for the same.
  EXPECT_EQ(pre_tokenizer_from_name("glm4"), PreTokenizerKind::glm4);
  EXPECT_EQ(pre_tokenizer_from_name("glm5"), PreTokenizerKind::glm4);
  EXPECT_FALSE(pre_tokenizer_from_name("glm6"));
}

TEST(PreTokenizer, Gpt2FollowsItsRegex) {
  EXPECT_EQ(pieces(PreTokenizerKind::gpt2, "Hello world's  end 42x\n"),
            (Pieces{"Hello", " world", "'s", " ", " end", " 42", "x", "\n"}));
  EXPECT_EQ(pieces(PreTokenizerKind::gpt2, "I'M ok"), (Pieces{"I", "'", "M", " ok"}));
  EXPECT_EQ(pieces(PreTokenizerKind::starcoder, "abc123 4"), (Pieces{"abc", "1", "2", "3", " ", "4"}));
}

TEST(PreTokenizer, InvalidBytesAreSymbolsOfTheirOwn) {
  EXPECT_EQ(pieces(PreTokenizerKind::glm4, "ab\xFF\xFE cd"), (Pieces{"ab", "\xFF\xFE", " cd"}));
  EXPECT_EQ(pieces(PreTokenizerKind::glm4, "\xE4\xBD"), (Pieces{"\xE4\xBD"}));
}

TEST(Tokenizer, FixtureHasGlmSpecialTokens) {
  const Tokenizer& t = fixture();
  EXPECT_EQ(t.vocab_size(), 4096u);
  EXPECT_EQ(t.pre_tokenizer(), PreTokenizerKind::glm4);
  EXPECT_TRUE(t.ignore_merges());
  EXPECT_EQ(t.find("<|endoftext|>"), 4060);
  EXPECT_EQ(t.find("<|user|>"), 4067);
  EXPECT_EQ(t.special_ids().bos, t.find("[gMASK]"));
  EXPECT_EQ(t.special_ids().eos, 4060);
  EXPECT_EQ(t.special_ids().pad, 4060);
  EXPECT_EQ(t.special_ids().eot, t.find("<|user|>"));
  EXPECT_EQ(t.special_ids().eom, t.find("<|observation|>"));
  EXPECT_EQ(t.end_of_generation_ids(), (std::vector<TokenId>{4060, 4067, 4069}));
  EXPECT_EQ(t.type(*t.find("<|user|>")), TokenType::control);
  EXPECT_EQ(t.type(*t.find("<think>")), TokenType::user_defined);
  // llama.cpp's converter makes added tokens named <|...|> control tokens even when not special.
  EXPECT_EQ(t.type(*t.find("<|image|>")), TokenType::control);
  EXPECT_EQ(t.type(0), TokenType::normal);
  EXPECT_FALSE(t.chat_template().empty());
}

TEST(Tokenizer, MatchesAddedTokensInsideText) {
  const Tokenizer& t = fixture();
  const TokenId user = *t.find("<|user|>");
  const TokenId think = *t.find("<think>");
  const auto with = t.encode("a<|user|>b<think>c", true);
  EXPECT_NE(std::find(with.begin(), with.end(), user), with.end());
  EXPECT_NE(std::find(with.begin(), with.end(), think), with.end());
  const auto without = t.encode("a<|user|>b<think>c", false);
  EXPECT_EQ(std::find(without.begin(), without.end(), user), without.end());
  EXPECT_NE(std::find(without.begin(), without.end(), think), without.end());
  EXPECT_EQ(t.decode(with), "a<|user|>b<think>c");
  EXPECT_EQ(t.decode(without), "a<|user|>b<think>c");
  EXPECT_EQ(t.decode(with, /*render_special=*/false), "ab<think>c");
  // Leftmost-longest: "<|user|>" is not cut short by a shorter added token.
  EXPECT_EQ(t.encode("<|user|><|user|>", true), (std::vector<TokenId>{user, user}));
}

TEST(Tokenizer, AnyBytesRoundTrip) {
  const Tokenizer& t = fixture();
  std::mt19937 rng(7);
  for (int n = 0; n < 300; ++n) {
    std::string bytes(rng() % 64, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() % 4 == 0 ? rng() % 256 : "ab <|>\n\xC3\xA9"[rng() % 10]);
    const auto ids = t.encode(bytes, true);
    EXPECT_EQ(t.decode(ids), bytes);
    for (TokenId id : ids) EXPECT_TRUE(t.valid_id(id));
  }
}

TEST(Tokenizer, RejectsBadSpecs) {
  TokenizerSpec spec;
  spec.pre = "nonesuch";
  spec.tokens = {"a"};
  auto r = Tokenizer::create(spec);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("nonesuch"), std::string::npos);
  EXPECT_EQ(r.error().code, ferry::ErrorCode::unsupported);

  auto hf = read_hf_tokenizer_dir(kFixture);
  ASSERT_TRUE(hf.ok()) << hf.error().message;
  TokenizerSpec bad_merge = *hf;
  bad_merge.merges.push_back("zzzq qqqz");
  r = Tokenizer::create(bad_merge);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("merges[3804]"), std::string::npos) << r.error().message;
  EXPECT_EQ(r.error().code, ferry::ErrorCode::invalid_input);

  TokenizerSpec bad_types = *hf;
  bad_types.token_types.pop_back();
  r = Tokenizer::create(bad_types);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("token_type"), std::string::npos);

  TokenizerSpec bad_id = *hf;
  bad_id.eos = 5000;
  r = Tokenizer::create(bad_id);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("eos_token_id = 5000"), std::string::npos) << r.error().message;
}

TEST(Tokenizer, HfDirectoryErrorsNameTheProblem) {
  const auto dir = std::filesystem::temp_directory_path() / "ferry_tokenizer_test_bad";
  std::filesystem::create_directories(dir);
  auto r = read_hf_tokenizer_dir(dir / "missing");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("tokenizer.json"), std::string::npos);
  EXPECT_EQ(r.error().code, ferry::ErrorCode::io);
  std::ofstream(dir / "tokenizer.json")
      << R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
            "pre_tokenizer": {"type": "Whitespace"}})";
  r = read_hf_tokenizer_dir(dir);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("pre_tokenizer"), std::string::npos) << r.error().message;
  EXPECT_EQ(r.error().code, ferry::ErrorCode::unsupported);
  std::ofstream(dir / "tokenizer.json") << R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [1]},)";
  r = read_hf_tokenizer_dir(dir);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("JSON"), std::string::npos) << r.error().message;
  EXPECT_EQ(r.error().code, ferry::ErrorCode::invalid_input);
  std::filesystem::remove_all(dir);
}

TEST(Tokenizer, GgufMetadataRoundTrip) {
  const auto path = std::filesystem::temp_directory_path() / "ferry_tokenizer_roundtrip.gguf";
  GgufWriter writer;
  ASSERT_FALSE(writer.set("general.architecture", std::string("glm5next")));
  ASSERT_FALSE(write_tokenizer_metadata(writer, kFixture, /*vocab_size=*/4100));
  auto written = writer.write_file(path);
  ASSERT_TRUE(written.ok()) << written.error().message;
  auto file = GgufFile::open(path);
  ASSERT_TRUE(file.ok()) << file.error().message;
  EXPECT_EQ(*file->get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(*file->get_string("tokenizer.ggml.pre"), "glm4");
  EXPECT_EQ(*file->get_u32("tokenizer.ggml.bos_token_id"), 4062u);
  EXPECT_EQ(*file->get_u32("tokenizer.ggml.eot_token_id"), 4067u);
  auto t = load_tokenizer(*file);
  ASSERT_TRUE(t.ok()) << t.error().message;
  // Padded to the model's rows: the extra ids are unused "[PADn]" tokens.
  EXPECT_EQ(t->vocab_size(), 4100u);
  EXPECT_EQ(t->piece(4099), "[PAD4099]");
  EXPECT_EQ(t->type(4099), TokenType::unused);
  const std::string text = "Hello <think>x</think><|user|> 12345 \xE4\xBD\xA0\xFF";
  EXPECT_EQ(t->encode(text, true), fixture().encode(text, true));
  EXPECT_EQ(t->chat_template(), fixture().chat_template());
  std::filesystem::remove(path);
}

TEST(Tokenizer, PlaceholderMapsBytesAndNamesTheOtherIds) {
  auto t = placeholder_tokenizer(300);
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->vocab_size(), 300u);
  EXPECT_EQ(t->encode("hi <|t257|>\xff", false), (std::vector<TokenId>{'h', 'i', ' ', 257, 0xff}));
  EXPECT_EQ(t->decode(std::vector<TokenId>{'o', 'k', 299}), "ok<|t299|>");
  EXPECT_TRUE(t->end_of_generation_ids().empty());
  auto glm = placeholder_tokenizer(154880);
  ASSERT_TRUE(glm.ok()) << glm.error().message;
  EXPECT_EQ(glm->decode(std::vector<TokenId>{154879}), "<|t154879|>");
}

}  // namespace
}  // namespace ferry::model
