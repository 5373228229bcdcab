// The CUDA backend against the CPU reference backend on random models written with GgufWriter: the
// same logits (f32 weights: max |delta| <= 5e-3; quantized weights: top-1 agreement) for a whole
// prefill (the cuBLAS path), chunked prefill and one-token decode (the matvec path), several slots in
// one step, decode replayed from CUDA graphs (greedy and sampled rows), and the step contract.
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <random>
#include <set>

#include "gpu/cuda_backend.hpp"
#include "model/cpu/cpu_backend.hpp"
#include "model/cpu/sampler.hpp"
#include "model/formats/gguf_writer.hpp"
#include "model/formats/quant.hpp"
#include "model/glm5/glm5_gguf.hpp"
#include "model/glm5/glm5_tensors.hpp"
#include "model/glm5/glm5_weights.hpp"

namespace ferry::gpu {
namespace {

using model::FfnKind;
using model::GgmlType;
using model::Glm5Hparams;
using model::Glm5Tensor;
using model::LayerKind;
using model::SlotRows;

bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

Glm5Hparams tiny(uint32_t hidden) {
  Glm5Hparams hp;
  hp.vocab_size = 97;
  hp.hidden_size = hidden;
  hp.n_layers = 5;
  hp.n_nextn_layers = 0;
  hp.dense_ffn = 48;
  hp.moe_ffn = 32;
  hp.n_experts = 6;
  hp.n_experts_used = 2;
  hp.n_group = 3;
  hp.topk_group = 2;
  hp.n_heads = 2;
  hp.q_lora_rank = 64;
  hp.kv_lora_rank = 32;
  hp.qk_nope_head_dim = 16;
  hp.v_head_dim = 24;
  hp.index_n_heads = 16;
  hp.index_head_dim = 16;
  hp.index_topk = 8;
  hp.index_kpool = 4;
  hp.kda_heads = 2;
  hp.kda_head_dim = 16;
  hp.hc_mult = 4;
  hp.context_length = 4096;
  hp.routed_scaling = 2.5f;
  hp.swiglu_limit = 1.5f;
  hp.layer_kinds = {LayerKind::kda, LayerKind::dsa, LayerKind::kda, LayerKind::dsa, LayerKind::dsa};
  hp.ffn_kinds = {FfnKind::dense, FfnKind::moe, FfnKind::moe, FfnKind::moe, FfnKind::moe};
  hp.indexer_full = {true, true, true, true, false};  // layer 4 reuses layer 3's selection
  return hp;
}

std::vector<float> random_values(const model::Glm5TensorSpec& s, std::mt19937& rng) {
  using T = Glm5Tensor;
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> v(s.n_elements());
  const float fan_in = static_cast<float>(s.dims[0]);
  for (float& x : v) {
    switch (s.role) {
      case T::token_embd: x = n(rng); break;
      case T::ssm_a: x = -std::exp(0.5f * n(rng)); break;
      case T::ssm_dt_bias: x = n(rng) - 1.0f; break;
      case T::hc_attn_base: case T::hc_ffn_base: case T::indexer_compressor_ape: x = 0.5f * n(rng); break;
      case T::hc_attn_scale: case T::hc_ffn_scale: x = 0.5f + u(rng); break;
      case T::indexer_k_norm_bias: case T::ffn_exp_probs_b: x = 0.1f * n(rng); break;
      case T::ssm_conv1d_q: case T::ssm_conv1d_k: case T::ssm_conv1d_v: x = 0.5f * n(rng); break;
      default: x = s.dims.size() == 1 ? 0.7f + 0.6f * u(rng) : n(rng) / std::sqrt(fan_in);
    }
  }
  return v;
}

// Writes a random model; matrices of `type` where their rows are whole blocks, else Q8_0 / F32.
std::filesystem::path write_model(const Glm5Hparams& hp, GgmlType type, const std::string& tag) {
  const auto path = std::filesystem::temp_directory_path() / ("cuda_backend_test_" + tag + "_" + std::to_string(::getpid()) + ".gguf");
  model::GgufWriter w;
  EXPECT_FALSE(model::write_glm5_hparams(w, hp));
  std::mt19937 rng(11);
  for (const model::Glm5TensorSpec& s : model::glm5_all_tensors(hp)) {
    if (s.optional) continue;
    GgmlType t = s.keep_f32 || s.dims.size() == 1 ? GgmlType::F32 : type;
    if (s.dims[0] % model::ggml_type_traits(t).block_elems != 0) t = s.dims[0] % 32 == 0 ? GgmlType::Q8_0 : GgmlType::F32;
    auto values = std::make_shared<std::vector<float>>(random_values(s, rng));
    EXPECT_FALSE(w.add_tensor(s.name, s.dims, t, [values, t](model::GgufSink& out) {
      std::vector<uint8_t> bytes(*model::ggml_bytes(t, values->size()));
      model::quantize_row(t, values->data(), bytes.data(), values->size());
      out.write(bytes.data(), bytes.size());
    }));
  }
  EXPECT_TRUE(w.write_file(path));
  return path;
}

class CudaBackendTest : public ::testing::Test {
 protected:
  void open(GgmlType type, uint32_t hidden, bool graphs = true) {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
    hp_ = tiny(hidden);
    ASSERT_TRUE(hp_.validate().empty());
    path_ = write_model(hp_, type, model::ggml_type_traits(type).name.data());
    model::CpuBackendOptions co;
    co.threads = 2;
    co.max_slots = 3;
    co.max_context = 512;
    auto cpu = model::CpuBackend::open(path_, co);
    ASSERT_TRUE(cpu) << cpu.error().message;
    cpu_ = std::move(cpu.value());
    auto w = model::Glm5Weights::load(path_);
    ASSERT_TRUE(w) << w.error().message;
    CudaBackendOptions go;
    go.max_slots = 3;
    go.max_context = 512;
    go.max_step_rows = 96;
    go.graphs = graphs;
    gpu_ = CudaBackend::from_weights(*w.value(), go);
    std::mt19937 rng(5);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(hp_.vocab_size) - 1);
    for (int i = 0; i < 150; ++i) prompt_.push_back(tok(rng));
  }
  void TearDown() override {
    gpu_.reset();
    cpu_.reset();
    if (!path_.empty()) std::filesystem::remove(path_);
  }

  static std::vector<float> run(model::Backend& b, uint32_t slot, const std::vector<int32_t>& tokens, size_t chunk) {
    std::vector<float> all;
    for (size_t at = 0; at < tokens.size(); at += chunk) {
      SlotRows r;
      r.slot = slot;
      r.start = static_cast<uint32_t>(at);
      r.tokens.assign(tokens.begin() + at, tokens.begin() + std::min(tokens.size(), at + chunk));
      r.logits_all = true;
      r.sample = false;
      auto res = b.step({r});
      all.insert(all.end(), res[0].logits.begin(), res[0].logits.end());
    }
    return all;
  }

  struct Agreement {
    double max_abs = 0;
    size_t top1 = 0, rows = 0;
  };
  Agreement agree(const std::vector<float>& a, const std::vector<float>& b) const {
    Agreement g;
    const size_t V = hp_.vocab_size;
    EXPECT_EQ(a.size(), b.size());
    g.rows = a.size() / V;
    for (size_t r = 0; r < g.rows; ++r) {
      for (size_t i = 0; i < V; ++i) {
        EXPECT_TRUE(std::isfinite(b[r * V + i]));
        g.max_abs = std::max(g.max_abs, std::abs(double(a[r * V + i]) - b[r * V + i]));
      }
      g.top1 += model::argmax_token({a.data() + r * V, V}) == model::argmax_token({b.data() + r * V, V});
    }
    return g;
  }

  Glm5Hparams hp_;
  std::filesystem::path path_;
  std::unique_ptr<model::CpuBackend> cpu_;
  std::unique_ptr<CudaBackend> gpu_;
  std::vector<int32_t> prompt_;
};

TEST_F(CudaBackendTest, F32WeightsGiveTheCpuLogitsForEveryChunking) {
  open(GgmlType::F32, 32);
  if (!gpu_) return;
  const std::vector<float> ref = run(*cpu_, 0, prompt_, prompt_.size());
  for (size_t chunk : {prompt_.size(), size_t{64}, size_t{7}, size_t{1}}) {
    const Agreement g = agree(ref, run(*gpu_, 1, prompt_, chunk));
    EXPECT_LE(g.max_abs, 5e-3) << "chunk " << chunk;
    EXPECT_EQ(g.top1, g.rows) << "chunk " << chunk;
  }
}

TEST_F(CudaBackendTest, QuantizedWeightsAgreeWithTheCpuOnTheTopToken) {
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::F16}) {
    TearDown();
    prompt_.clear();
    open(t, 256);
    if (!gpu_) return;
    const std::vector<float> ref = run(*cpu_, 0, prompt_, 40);
    const Agreement whole = agree(ref, run(*gpu_, 0, prompt_, 40));
    const Agreement decode = agree(ref, run(*gpu_, 2, prompt_, 1));
    const std::string_view name = model::ggml_type_traits(t).name;
    std::cout << name << ": top-1 " << whole.top1 << "/" << whole.rows << " (chunks of 40), " << decode.top1 << "/"
              << decode.rows << " (decode), max|delta| " << whole.max_abs << " / " << decode.max_abs << "\n";
    EXPECT_GE(double(whole.top1), 0.97 * double(whole.rows)) << name;
    EXPECT_GE(double(decode.top1), 0.97 * double(decode.rows)) << name;
    EXPECT_LE(decode.max_abs, 0.05) << name;
  }
}

TEST_F(CudaBackendTest, SlotsInOneStepGiveWhatEachGivesAlone) {
  open(GgmlType::F32, 32);
  if (!gpu_) return;
  std::vector<int32_t> a(prompt_.begin(), prompt_.begin() + 30), b(prompt_.begin() + 30, prompt_.begin() + 53);
  const std::vector<float> ra = run(*cpu_, 0, a, a.size()), rb = run(*cpu_, 1, b, b.size());
  SlotRows x{0, 0, {a.begin(), a.end() - 1}, true, false, {}}, y{2, 0, {b.begin(), b.end() - 1}, true, false, {}};
  auto first = gpu_->step({x, y});
  SlotRows xd{0, static_cast<uint32_t>(a.size() - 1), {a.back()}, true, false, {}};
  SlotRows yd{2, static_cast<uint32_t>(b.size() - 1), {b.back()}, true, false, {}};
  auto second = gpu_->step({yd, xd});
  std::vector<float> ga = first[0].logits, gb = first[1].logits;
  ga.insert(ga.end(), second[1].logits.begin(), second[1].logits.end());
  gb.insert(gb.end(), second[0].logits.begin(), second[0].logits.end());
  EXPECT_LE(agree(ra, ga).max_abs, 5e-3);
  EXPECT_LE(agree(rb, gb).max_abs, 5e-3);
}

TEST_F(CudaBackendTest, GraphReplayedDecodeSamplesTheCpuTokens) {
  open(GgmlType::F32, 32, /*graphs=*/true);
  if (!gpu_) return;
  const std::vector<int32_t> p(prompt_.begin(), prompt_.begin() + 20);
  std::vector<int32_t> cpu_tokens, gpu_tokens;
  for (model::Backend* b : {static_cast<model::Backend*>(cpu_.get()), static_cast<model::Backend*>(gpu_.get())}) {
    auto& out = b == cpu_.get() ? cpu_tokens : gpu_tokens;
    SlotRows r{1, 0, p, false, true, {}};
    int32_t t = b->step({r})[0].sampled;
    uint32_t pos = static_cast<uint32_t>(p.size());
    for (int i = 0; i < 12; ++i) {  // greedy single-row decode: eager, captured, then replayed
      out.push_back(t);
      SlotRows d{1, pos++, {t}, false, true, {}};
      t = b->step({d})[0].sampled;
    }
  }
  EXPECT_EQ(cpu_tokens, gpu_tokens);
}

TEST_F(CudaBackendTest, SeededSamplingDrawsTheCpuTokens) {
  open(GgmlType::F32, 32);
  if (!gpu_) return;
  model::SamplingParams sp;
  sp.temperature = 0.9f;
  sp.top_k = 20;
  sp.top_p = 0.95f;
  sp.seed = 42;
  for (model::Backend* b : {static_cast<model::Backend*>(cpu_.get()), static_cast<model::Backend*>(gpu_.get())}) b->reset_slot(0);
  const std::vector<int32_t> p(prompt_.begin(), prompt_.begin() + 17);
  const int32_t c = cpu_->step({SlotRows{0, 0, p, false, true, sp}})[0].sampled;
  const int32_t g = gpu_->step({SlotRows{0, 0, p, false, true, sp}})[0].sampled;
  EXPECT_EQ(c, g);
}

TEST_F(CudaBackendTest, GraphReplayedDecodeWithSampledRowsDrawsTheEagerTokens) {
  open(GgmlType::F32, 32, /*graphs=*/true);
  if (!gpu_) return;
  auto w = model::Glm5Weights::load(path_);
  ASSERT_TRUE(w) << w.error().message;
  CudaBackendOptions go;
  go.max_slots = 3;
  go.max_context = 512;
  go.max_step_rows = 96;
  go.graphs = false;
  const std::unique_ptr<CudaBackend> eager = CudaBackend::from_weights(*w.value(), go);
  // Three slots decoding together: greedy, top-k + top-p, and the whole vocabulary with min-p.
  std::vector<model::SamplingParams> sp(3);
  sp[1].temperature = 0.9f;
  sp[1].top_k = 20;
  sp[1].top_p = 0.9f;
  sp[1].seed = 7;
  sp[2].temperature = 1.3f;
  sp[2].min_p = 0.02f;
  sp[2].seed = 11;
  std::vector<std::vector<int32_t>> tokens[2];
  CudaBackend* backends[2] = {gpu_.get(), eager.get()};
  for (int b = 0; b < 2; ++b) {
    std::vector<SlotRows> prefill;
    for (uint32_t s = 0; s < 3; ++s) {
      prefill.push_back(SlotRows{s, 0, {prompt_.begin() + 10 * s, prompt_.begin() + 10 * s + 9}, false, true, sp[s]});
    }
    std::vector<int32_t> next(3);
    auto res = backends[b]->step(prefill);
    for (uint32_t s = 0; s < 3; ++s) next[s] = res[s].sampled;
    tokens[b].assign(3, {});
    for (uint32_t pos = 9; pos < 25; ++pos) {  // eager, captured, then replayed with new parameters each step
      std::vector<SlotRows> step;
      for (uint32_t s = 0; s < 3; ++s) {
        tokens[b][s].push_back(next[s]);
        model::SamplingParams p = sp[s];
        p.top_p = pos % 2 == 0 ? sp[s].top_p : 1.0f;  // parameters change between replays of one graph
        step.push_back(SlotRows{s, pos, {next[s]}, false, true, p});
      }
      res = backends[b]->step(step);
      for (uint32_t s = 0; s < 3; ++s) next[s] = res[s].sampled;
    }
  }
  EXPECT_EQ(tokens[0], tokens[1]);
  std::set<int32_t> distinct(tokens[0][2].begin(), tokens[0][2].end());
  EXPECT_GT(distinct.size(), 3u);  // the T 1.3 slot really samples
}

TEST_F(CudaBackendTest, RejectsRowsThatBreakTheStepContract) {
  open(GgmlType::F32, 32);
  if (!gpu_) return;
  EXPECT_THROW(gpu_->step({SlotRows{7, 0, {1}, false, true, {}}}), std::invalid_argument);
  EXPECT_THROW(gpu_->step({SlotRows{0, 3, {1}, false, true, {}}}), std::invalid_argument);
  EXPECT_THROW(gpu_->step({SlotRows{0, 0, {1}, false, true, {}}, SlotRows{0, 0, {2}, false, true, {}}}),
               std::invalid_argument);
  EXPECT_THROW(gpu_->step({SlotRows{0, 0, {static_cast<int32_t>(hp_.vocab_size)}, false, true, {}}}), std::invalid_argument);
  EXPECT_THROW(gpu_->step({SlotRows{0, 0, std::vector<int32_t>(513, 1), false, true, {}}}), std::invalid_argument);
}

}  // namespace
}  // namespace ferry::gpu
#endif
