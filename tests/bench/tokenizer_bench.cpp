// Tokenizer speed (Google Benchmark; run by hand: build-*/tests/ferry_tokenizer_bench). The target in
// issue 4: a 500K-token prompt encodes in well under a second on one core.
//
// Text: the English licence texts every Debian system ships (/usr/share/common-licenses), repeated
// until the test tokenizer (tests/fixtures/tokenizer) gives 500K tokens, and a mixed text (code,
// CJK, emoji, Cyrillic, digits, whitespace runs) of the same size. The gpt-2 vocabulary of
// ../shared/vocab-tests (50K tokens, no ignore_merges) is measured too when that folder is there.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "model/formats/gguf.hpp"
#include "model/text/chat_template.hpp"
#include "model/text/output_parser.hpp"
#include "model/text/streaming_detokenizer.hpp"
#include "model/text/tokenizer_gguf.hpp"

namespace ferry::model {
namespace {

constexpr size_t kTargetTokens = 500'000;
const std::filesystem::path kSource(FERRY_SOURCE_DIR);

const Tokenizer* fixture() {
  static const auto tokenizer = load_tokenizer(kSource / "tests" / "fixtures" / "tokenizer");
  return tokenizer.ok() ? &*tokenizer : nullptr;
}

const Tokenizer* gpt2() {
  static const auto tokenizer = [] {
    auto file = GgufFile::open(kSource / ".." / "shared" / "vocab-tests" / "ggml-vocab-gpt-2.gguf");
    return file.ok() ? load_tokenizer(*file) : Expected<Tokenizer>(file.error());
  }();
  return tokenizer.ok() ? &*tokenizer : nullptr;
}

std::string licences() {
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/usr/share/common-licenses", ec)) {
    if (e.is_regular_file() && !e.is_symlink()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  std::string text;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    text += ss.str();
  }
  return text;
}

const std::string kMixed =
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # 1234567890\n\n"
    "你好世界，今天天气很好。日本語のテキスト「こんにちは」！한국어 텍스트입니다. "
    "Привет, мир! Ёлка 🚀😶‍🌫️ ✅ 👨‍👩‍👧   \t\t    indented\n\n\n"
    "The quick brown fox jumps over the lazy dog; it's 3.14159 and I'M sure they'll agree. ";

// Repeats `unit` until the fixture tokenizer gives at least kTargetTokens tokens.
std::string scaled(const std::string& unit) {
  const size_t per_unit = std::max<size_t>(1, fixture()->encode(unit, false).size());
  std::string text;
  for (size_t n = (kTargetTokens + per_unit - 1) / per_unit; n > 0; --n) text += unit;
  return text;
}

void encode_bench(benchmark::State& state, const Tokenizer* tokenizer, const std::string& text) {
  if (!tokenizer || text.empty()) {
    state.SkipWithError("tokenizer or text not available");
    return;
  }
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = tokenizer->encode(text, true);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens) * state.iterations(),
                                                  benchmark::Counter::kIsRate);
  state.SetBytesProcessed(static_cast<int64_t>(text.size()) * state.iterations());
}

void BM_EncodeEnglish500K(benchmark::State& state) {
  static const std::string text = fixture() ? scaled(licences()) : "";
  encode_bench(state, fixture(), text);
}
void BM_EncodeMixed500K(benchmark::State& state) {
  static const std::string text = fixture() ? scaled(kMixed) : "";
  encode_bench(state, fixture(), text);
}
void BM_EncodeEnglishGpt2Vocab(benchmark::State& state) {
  static const std::string text = fixture() ? scaled(licences()) : "";
  encode_bench(state, gpt2(), text);
}

void BM_DecodeStreaming(benchmark::State& state) {
  static const std::string text = fixture() ? scaled(kMixed) : "";
  if (!fixture()) {
    state.SkipWithError("tokenizer not available");
    return;
  }
  static const std::vector<TokenId> ids = fixture()->encode(text, true);
  for (auto _ : state) {
    StreamingDetokenizer stream(*fixture());
    size_t bytes = 0;
    for (TokenId id : ids) bytes += stream.push(id).size();
    benchmark::DoNotOptimize(bytes);
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(ids.size()) * state.iterations(),
                                                  benchmark::Counter::kIsRate);
}

void BM_OutputParserStreaming(benchmark::State& state) {
  std::string text = "Reasoning about the weather for a while. ";
  for (int i = 0; i < 12; ++i) text += text;
  text += "</think>Calling.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>";
  for (auto _ : state) {
    OutputParser parser;
    size_t n = 0;
    for (size_t i = 0; i < text.size(); i += 4) n += parser.feed(std::string_view(text).substr(i, 4)).reasoning_content.size();
    benchmark::DoNotOptimize(n);
  }
  state.SetBytesProcessed(static_cast<int64_t>(text.size()) * state.iterations());
}

BENCHMARK(BM_EncodeEnglish500K)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeMixed500K)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeEnglishGpt2Vocab)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DecodeStreaming)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_OutputParserStreaming)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ferry::model
