// Real vocabularies: the vocab-only GGUF files of ../shared/vocab-tests with the ids their original
// Hugging Face tokenizers gave for each test string (llama.cpp's tokenizer test data).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "model/formats/gguf.hpp"
#include "model/text/tokenizer_gguf.hpp"

namespace ferry::model {
namespace {

const std::filesystem::path kVocabDir = std::filesystem::path(FERRY_SOURCE_DIR) / ".." / "shared" / "vocab-tests";

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The .inp file: strings separated by "\n__ggml_vocab_test__\n" (the last one is followed by it).
std::vector<std::string> read_inputs(const std::filesystem::path& path) {
  const std::string text = read_file(path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t pos; (pos = text.find(sep, start)) != std::string::npos; start = pos + sep.size()) {
    out.push_back(text.substr(start, pos - start));
  }
  return out;
}

std::vector<std::vector<TokenId>> read_outputs(const std::filesystem::path& path) {
  std::istringstream in(read_file(path));
  std::vector<std::vector<TokenId>> out;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::vector<TokenId> ids;
    for (TokenId id; ls >> id;) ids.push_back(id);
    out.push_back(std::move(ids));
  }
  return out;
}

class VocabTest : public ::testing::TestWithParam<const char*> {};

TEST_P(VocabTest, EveryTestStringGivesTheReferenceIds) {
  const std::string name = GetParam();
  const auto gguf_path = kVocabDir / ("ggml-vocab-" + name + ".gguf");
  if (!std::filesystem::exists(gguf_path)) {
    GTEST_SKIP() << "no " << gguf_path << " (the vocab tests live in ../shared/vocab-tests next to the repository)";
  }
  auto file = GgufFile::open(gguf_path);
  ASSERT_TRUE(file.ok()) << file.error().message;
  auto tokenizer = load_tokenizer(*file);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.error().message;

  const auto inputs = read_inputs(kVocabDir / ("ggml-vocab-" + name + ".gguf.inp"));
  const auto outputs = read_outputs(kVocabDir / ("ggml-vocab-" + name + ".gguf.out"));
  ASSERT_EQ(inputs.size(), outputs.size());
  ASSERT_GT(inputs.size(), 30u);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto ids = tokenizer->encode(inputs[i], /*parse_special=*/true);
    EXPECT_EQ(ids, outputs[i]) << name << " string " << i << ": '" << inputs[i] << "'";
    EXPECT_EQ(tokenizer->decode(ids), inputs[i]) << name << " string " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(SharedVocabTests, VocabTest,
                         ::testing::Values("gpt-2", "deepseek-coder", "falcon", "mpt", "starcoder"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) {
                             if (c == '-') c = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace ferry::model
