// `ferry run --model M.gguf --prompt-ids 1,2,3 -n 16`: generates tokens with the CPU backend and prints
// their ids, one line, space-separated (greedy unless --temperature is given). `--prompt TEXT` instead
// tokenizes with the file's tokenizer (tokenizer.ggml.*) and prints the decoded text on a second line.
// Without --model it runs the embedded default model, as `ferry serve` does.
#include <chrono>
#include <optional>
#include <cstdio>
#include <sstream>
#include <string>

#include "gpu/backend_factory.hpp"
#include "model/formats/gguf.hpp"
#include "model/text/tokenizer_gguf.hpp"
#include "tools/ferry/commands.hpp"
#include "tools/ferry/default_model.hpp"

namespace ferry::cli {
namespace {

struct RunOptions {
  std::string model, prompt_ids, prompt;
  uint32_t n = 16;
  unsigned threads = 0;
  std::string kv_type = "f32";
  model::SamplingParams sampling;
  bool timing = false;
};

// "1,2,3" -> ids; the error names the piece that is not an id.
Expected<std::vector<int32_t>> parse_ids(const std::string& text, uint32_t vocab) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string piece;
  while (std::getline(ss, piece, ',')) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(piece, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != piece.size() || piece.empty()) return Error("--prompt-ids: '" + piece + "' is not a token id");
    if (v < 0 || v >= vocab) {
      return Error("--prompt-ids: " + piece + " is outside the vocabulary (0.." + std::to_string(vocab - 1) + ")");
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) return Error("--prompt-ids: no ids given");
  return ids;
}

int run(RunOptions o) {
  if (o.model.empty()) {
    auto path = default_model_path("ferry run");
    if (!path) {
      std::fprintf(stderr, "ferry run: %s\n", path.error().message.c_str());
      return 2;
    }
    std::fprintf(stderr, "ferry run: the embedded default model (pass --model FILE.gguf for another)\n");
    o.model = *path;
  }
  gpu::BackendOptions bo;
  bo.kind = "cpu";
  bo.threads = o.threads;
  bo.max_slots = 1;
  if (auto e = gpu::parse_kv_type_option(o.kv_type, bo)) {
    std::fprintf(stderr, "ferry run: %s\n", e->message.c_str());
    return 2;
  }
  auto opened = gpu::open_pipeline(o.model, bo);
  if (!opened) {
    std::fprintf(stderr, "ferry run: %s\n", opened.error().message.c_str());
    return 2;
  }
  model::Pipeline& b = *opened->pipeline;
  std::optional<model::Tokenizer> tokenizer;
  Expected<std::vector<int32_t>> ids = std::vector<int32_t>();
  if (!o.prompt.empty()) {
    auto file = model::GgufFile::open(o.model);
    if (!file) {
      std::fprintf(stderr, "ferry run: %s\n", file.error().message.c_str());
      return 2;
    }
    auto t = model::load_tokenizer(*file);
    if (!t) {
      std::fprintf(stderr, "ferry run: --prompt needs the model file's tokenizer: %s\n", t.error().message.c_str());
      return 2;
    }
    tokenizer.emplace(std::move(t.value()));
    ids = tokenizer->encode(o.prompt, true);
    if (ids->empty()) ids = Error("--prompt: the text encodes to no tokens");
  } else {
    ids = parse_ids(o.prompt_ids, b.hparams().vocab_size);
  }
  if (!ids) {
    std::fprintf(stderr, "ferry run: %s\n", ids.error().message.c_str());
    return 2;
  }
  const std::vector<int32_t>& prompt = *ids;
  if (prompt.size() + o.n > b.max_context()) {
    std::fprintf(stderr, "ferry run: %zu prompt tokens + %u new ones exceed the context of %u\n", prompt.size(), o.n,
                 b.max_context());
    return 2;
  }
  using clock = std::chrono::steady_clock;
  model::SlotRows rows;
  rows.tokens = prompt;
  rows.sampling = o.sampling;
  std::vector<int32_t> out;
  const auto t0 = clock::now();
  auto t1 = t0;
  for (uint32_t i = 0; i < o.n; ++i) {
    auto step = b.step({rows});
    if (!step) {
      std::fprintf(stderr, "ferry run: %s\n", step.error().message.c_str());
      return 1;
    }
    const int32_t tok = (*step)[0].sampled;
    if (i == 0) t1 = clock::now();
    out.push_back(tok);
    rows.start += static_cast<uint32_t>(rows.tokens.size());
    rows.tokens = {tok};
  }
  const auto t2 = clock::now();
  for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? " " : "", out[i]);
  std::printf("\n");
  if (tokenizer) std::printf("%s\n", tokenizer->decode(out).c_str());
  if (o.timing) {
    const double pre = std::chrono::duration<double>(t1 - t0).count();
    const double dec = std::chrono::duration<double>(t2 - t1).count();
    std::fprintf(stderr, "ferry run: %s; prefill %zu tokens in %.3f s (%.1f tokens/s), decode %u tokens in %.3f s (%.1f tokens/s)\n",
                 b.describe().c_str(), prompt.size(), pre, double(prompt.size()) / std::max(pre, 1e-9),
                 o.n > 0 ? o.n - 1 : 0, dec, double(o.n > 0 ? o.n - 1 : 0) / std::max(dec, 1e-9));
  }
  return 0;
}

}  // namespace

CommandRun add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* sub = app.add_subcommand("run", "Generate tokens from a prompt on the CPU and print their ids");
  sub->add_option("--model", o->model, "GGUF model file (default: the small model embedded in ferry, as ferry serve's)")
      ->check(CLI::ExistingFile);
  auto* ids = sub->add_option("--prompt-ids", o->prompt_ids, "prompt token ids, comma-separated (1,2,3)");
  auto* text = sub->add_option("--prompt", o->prompt, "prompt text, tokenized with the model file's tokenizer");
  ids->excludes(text);
  sub->callback([ids, text] {
    if (ids->count() == 0 && text->count() == 0) throw CLI::RequiredError("--prompt-ids or --prompt");
  });
  sub->add_option("-n,--n-predict", o->n, "tokens to generate");
  sub->add_option("--threads", o->threads, "worker threads (0: every hardware thread)");
  sub->add_option("--kv-type", o->kv_type, "DSA latent rows: f32, f16 or int8")->capture_default_str();
  sub->add_option("--temperature", o->sampling.temperature, "0: greedy (argmax, ties to the lowest id)");
  sub->add_option("--top-k", o->sampling.top_k, "keep the k most likely tokens (0: off)");
  sub->add_option("--top-p", o->sampling.top_p, "keep the smallest set holding this probability mass");
  sub->add_option("--min-p", o->sampling.min_p, "drop tokens below min-p times the most likely one's probability");
  sub->add_option("--seed", o->sampling.seed, "sampling seed (with the position, fixes every draw)");
  sub->add_flag("--timing", o->timing, "print prefill and decode speed to stderr");
  return [o] { return run(*o); };
}

}  // namespace ferry::cli
