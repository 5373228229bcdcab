// The CPU backend on a random model written with GgufWriter: prefill in chunks of any size and decode
// one token at a time give the logits of one pass over the whole sequence; several slots in one step
// give what each gives alone; the step contract is enforced. (Agreement with transformers itself is
// the reference fixtures' job: tests/python/test_eval_ref.py.)
#include "model/cpu/cpu_backend.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "model/formats/gguf_writer.hpp"
#include "model/formats/half.hpp"
#include "model/formats/quant.hpp"
#include "model/glm5/glm5_gguf.hpp"
#include "model/glm5/glm5_tensors.hpp"

namespace ferry::model {
namespace {

using T = Glm5Tensor;

Glm5Hparams tiny() {
  Glm5Hparams hp;
  hp.vocab_size = 97;
  hp.hidden_size = 32;
  hp.n_layers = 5;
  hp.n_nextn_layers = 1;
  hp.dense_ffn = 48;
  hp.moe_ffn = 16;
  hp.n_experts = 6;
  hp.n_experts_used = 2;
  hp.n_group = 3;
  hp.topk_group = 2;
  hp.n_heads = 2;
  hp.q_lora_rank = 24;
  hp.kv_lora_rank = 16;
  hp.qk_nope_head_dim = 8;
  hp.v_head_dim = 12;
  hp.index_n_heads = 16;
  hp.index_head_dim = 8;
  hp.index_topk = 8;
  hp.index_kpool = 4;
  hp.kda_heads = 2;
  hp.kda_head_dim = 8;
  hp.hc_mult = 4;
  hp.context_length = 4096;
  hp.routed_scaling = 2.5f;
  hp.swiglu_limit = 1.5f;
  hp.layer_kinds = {LayerKind::kda, LayerKind::dsa, LayerKind::kda, LayerKind::dsa, LayerKind::dsa};
  hp.ffn_kinds = {FfnKind::dense, FfnKind::moe, FfnKind::moe, FfnKind::moe, FfnKind::moe};
  hp.indexer_full = {true, true, true, true, false};  // layer 4 reuses layer 3's selection
  return hp;
}

std::vector<float> random_values(const Glm5TensorSpec& s, std::mt19937& rng) {
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
      default:
        x = s.dims.size() == 1 ? 0.7f + 0.6f * u(rng) : n(rng) / std::sqrt(fan_in);
    }
  }
  return v;
}

class CpuBackendTest : public ::testing::Test {
 protected:
  std::filesystem::path path_ = std::filesystem::temp_directory_path() /
                                ("cpu_backend_test_" + std::to_string(::getpid()) + ".gguf");

  void SetUp() override {
    const Glm5Hparams hp = tiny();
    ASSERT_TRUE(hp.validate().empty());
    GgufWriter w;
    ASSERT_FALSE(write_glm5_hparams(w, hp));
    std::mt19937 rng(7);
    for (const Glm5TensorSpec& s : glm5_all_tensors(hp)) {
      if (s.optional) continue;
      // Matrices as F16 (the dequantizing product), small state as F32 (read at load).
      const GgmlType type = s.keep_f32 || s.dims.size() == 1 ? GgmlType::F32 : GgmlType::F16;
      auto values = std::make_shared<std::vector<float>>(random_values(s, rng));
      ASSERT_FALSE(w.add_tensor(s.name, s.dims, type, [values, type](GgufSink& out) {
        std::vector<uint8_t> bytes(*ggml_bytes(type, values->size()));
        quantize_row(type, values->data(), bytes.data(), values->size());
        out.write(bytes.data(), bytes.size());
      }));
    }
    ASSERT_TRUE(w.write_file(path_));
    CpuBackendOptions o;
    o.threads = 2;
    o.max_slots = 3;
    auto b = CpuBackend::open(path_, o);
    ASSERT_TRUE(b) << b.error().message;
    backend_ = std::move(b.value());
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(tiny().vocab_size) - 1);
    for (int i = 0; i < 75; ++i) prompt_.push_back(tok(rng));
  }
  void TearDown() override {
    backend_.reset();
    std::filesystem::remove(path_);
  }

  // Logits of every position of `tokens` fed to `slot` in chunks of `chunk`.
  std::vector<float> run(uint32_t slot, const std::vector<int32_t>& tokens, size_t chunk) {
    std::vector<float> all;
    for (size_t at = 0; at < tokens.size(); at += chunk) {
      SlotRows r;
      r.slot = slot;
      r.start = static_cast<uint32_t>(at);
      r.tokens.assign(tokens.begin() + at, tokens.begin() + std::min(tokens.size(), at + chunk));
      r.logits_all = true;
      r.sample = false;
      auto res = backend_->step({r});
      all.insert(all.end(), res[0].logits.begin(), res[0].logits.end());
    }
    return all;
  }

  std::unique_ptr<CpuBackend> backend_;
  std::vector<int32_t> prompt_;
};

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

TEST_F(CpuBackendTest, ChunkedPrefillAndDecodeEqualOnePass) {
  const std::vector<float> whole = run(0, prompt_, prompt_.size());
  ASSERT_EQ(whole.size(), prompt_.size() * tiny().vocab_size);
  float spread = 0;
  for (float x : whole) spread = std::max(spread, std::abs(x));
  EXPECT_GT(spread, 0.5f);  // the model computes something
  for (size_t chunk : {1u, 5u, 17u, 64u}) {
    EXPECT_LT(max_diff(whole, run(0, prompt_, chunk)), 2e-5f) << "chunk " << chunk;
  }
}

TEST_F(CpuBackendTest, SlotsInOneStepEqualSlotsAlone) {
  const std::vector<int32_t> a(prompt_.begin(), prompt_.begin() + 40), b(prompt_.begin() + 10, prompt_.end());
  const std::vector<float> alone_a = run(0, a, a.size()), alone_b = run(1, b, b.size());
  SlotRows ra, rb;
  ra.slot = 1, ra.tokens = a, ra.logits_all = true, ra.sample = false;
  rb.slot = 2, rb.tokens = b, rb.logits_all = true, rb.sample = false;
  auto res = backend_->step({ra, rb});
  EXPECT_LT(max_diff(alone_a, res[0].logits), 2e-5f);
  EXPECT_LT(max_diff(alone_b, res[1].logits), 2e-5f);
  // Then one decode row each, batched.
  ra.start = static_cast<uint32_t>(a.size()), ra.tokens = {5};
  rb.start = static_cast<uint32_t>(b.size()), rb.tokens = {6};
  res = backend_->step({ra, rb});
  std::vector<int32_t> a5(a), b6(b);
  a5.push_back(5), b6.push_back(6);
  const std::vector<float> one_a = run(0, a5, a5.size()), one_b = run(0, b6, b6.size());
  const size_t V = tiny().vocab_size;
  EXPECT_LT(max_diff(std::vector<float>(one_a.end() - V, one_a.end()), res[0].logits), 2e-5f);
  EXPECT_LT(max_diff(std::vector<float>(one_b.end() - V, one_b.end()), res[1].logits), 2e-5f);
}

TEST_F(CpuBackendTest, GreedyStepSamplesTheArgmaxAndStartZeroStartsOver) {
  SlotRows r;
  r.slot = 0;
  r.tokens = prompt_;
  r.sample = true;
  auto first = backend_->step({r});
  EXPECT_TRUE(first[0].logits.empty());  // sampled rows return no logits unless asked
  r.sample = false;
  auto again = backend_->step({r});      // start 0 again: the slot starts over
  const std::span<const float> last(again[0].logits);
  int32_t best = 0;
  for (size_t i = 1; i < last.size(); ++i) best = last[i] > last[best] ? static_cast<int32_t>(i) : best;
  EXPECT_EQ(first[0].sampled, best);
}

TEST_F(CpuBackendTest, StepContractViolationsThrow) {
  SlotRows r;
  r.slot = 0;
  r.start = 3;  // the slot holds nothing
  r.tokens = {1};
  EXPECT_THROW(backend_->step({r}), std::invalid_argument);
  r.slot = 9;
  r.start = 0;
  EXPECT_THROW(backend_->step({r}), std::invalid_argument);
  r.slot = 0;
  EXPECT_THROW(backend_->step({r, r}), std::invalid_argument);
}

TEST_F(CpuBackendTest, MtpInChunksEqualsOnePass) {
  Glm5Forward& m = backend_->model();
  ASSERT_TRUE(m.has_mtp());
  const size_t D = tiny().hidden_size, n = prompt_.size() - 1;
  SequenceState trunk(tiny());
  std::vector<float> h;
  const ForwardRows rows{&trunk, prompt_};
  m.forward(std::span<const ForwardRows>(&rows, 1), h);
  auto mtp = [&](size_t chunk) {
    SequenceState st(tiny());
    std::vector<float> out, part;
    for (size_t at = 0; at < n; at += chunk) {
      const size_t k = std::min(chunk, n - at);
      m.mtp_forward(st, h.data() + at * D, std::span<const int32_t>(prompt_.data() + at + 1, k), part);
      out.insert(out.end(), part.begin(), part.end());
    }
    return out;
  };
  const std::vector<float> whole = mtp(n);
  EXPECT_LT(max_diff(whole, mtp(1)), 2e-5f);
  EXPECT_LT(max_diff(whole, mtp(9)), 2e-5f);
}

}  // namespace
}  // namespace ferry::model
