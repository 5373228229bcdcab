// The indexer's per-token keys and gates in a ring of a step's rows (gpu/stage_sizes.hpp,
// index_key_rows) on the CUDA stage: a context of 1,024 with steps of at most 150 rows (a ring of
// 153 per slot and indexer layer), a 450-token prompt prefilled in chunks that are not multiples of
// the pool (5, 37, 150) and decoded a token at a time gives bit for bit the logits of a stage that
// keeps every position's keys (steps of up to 1,024 rows), and the CPU stage's (f32: max |delta| <=
// 5e-3, the same top token); a slot saved mid pool, with
// rows and without, restores and continues as if never saved after its ring has wrapped (the image
// carries the incomplete pool's keys: model/slot_state.hpp), and images move between the CPU and
// the CUDA stage both ways.
#if FERRY_HAVE_CUDA
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "gpu/cuda_stage.hpp"
#include "gpu/stage_sizes.hpp"
#include "model/cpu/cpu_stage.hpp"
#include "model/cpu/sampler.hpp"
#include "model/glm5/glm5_weights.hpp"
#include "model/pipeline.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/model/random_model.hpp"

namespace ferry::gpu {
namespace {

using model::Pipeline;
using model::SlotRows;

constexpr uint32_t kContext = 1024, kStepRows = 150;

class IndexRingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::have_device()) GTEST_SKIP() << "no CUDA device";
    hp_ = testing::tiny_gpu_shape(32);
    hp_.indexer_full = {true, true, true, true, false};
    ASSERT_TRUE(hp_.validate().empty());
    path_ = testing::temp_model_path("index_ring_test");
    ASSERT_TRUE(testing::write_random_model(hp_, model::GgmlType::F32, path_, 23));
    auto w = model::Glm5Weights::load(path_);
    ASSERT_TRUE(w) << w.error().message;
    weights_ = std::move(w.value());
    std::mt19937 rng(6);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(hp_.vocab_size) - 1);
    for (int i = 0; i < 450; ++i) prompt_.push_back(tok(rng));
  }
  void TearDown() override {
    weights_.reset();
    if (!path_.empty()) std::filesystem::remove(path_);
  }

  std::unique_ptr<Pipeline> cpu() {
    model::CpuStageOptions o;
    o.max_slots = 3;
    o.max_context = kContext;
    auto p = Pipeline::make(model::make_cpu_stages(weights_, {{0, 2}, {2, hp_.n_layers}}, 2, o));
    EXPECT_TRUE(p) << (p ? "" : p.error().message);
    return p ? std::move(p.value()) : nullptr;
  }
  // Two CUDA stages on device 0 (the CPU pipeline's split: their images are the CPU's), taking steps
  // of up to `step_rows` rows.
  std::unique_ptr<Pipeline> gpu(uint32_t step_rows = kStepRows) {
    std::vector<std::shared_ptr<model::Stage>> stages;
    for (const model::LayerRange& r : {model::LayerRange{0, 2}, model::LayerRange{2, hp_.n_layers}}) {
      CudaStageOptions o;
      o.max_slots = 3;
      o.max_context = kContext;
      o.max_step_rows = step_rows;
      auto s = CudaStage::from_weights(*weights_, r, o);
      EXPECT_TRUE(s) << (s ? "" : s.error().message);
      if (!s) return nullptr;
      stages.push_back(std::move(s.value()));
    }
    auto p = Pipeline::make(std::move(stages));
    EXPECT_TRUE(p) << (p ? "" : p.error().message);
    return p ? std::move(p.value()) : nullptr;
  }

  // Logits of every position of `tokens` fed to `slot` from `start` in steps of `chunk` rows.
  static std::vector<float> run(Pipeline& b, uint32_t slot, const std::vector<int32_t>& tokens, size_t chunk,
                                uint32_t start = 0) {
    std::vector<float> all;
    for (size_t at = 0; at < tokens.size(); at += chunk) {
      SlotRows r;
      r.slot = slot;
      r.start = start + static_cast<uint32_t>(at);
      r.tokens.assign(tokens.begin() + at, tokens.begin() + std::min(tokens.size(), at + chunk));
      r.logits_all = true;
      r.sample = false;
      auto res = b.step({r});
      EXPECT_TRUE(res) << res.error().message;
      if (!res) return all;
      all.insert(all.end(), (*res)[0].logits.begin(), (*res)[0].logits.end());
    }
    return all;
  }

  // max |a - b| <= tol and the same top token in every row.
  void expect_agree(const std::vector<float>& a, const std::vector<float>& b, double tol, const std::string& what) {
    const size_t V = hp_.vocab_size;
    ASSERT_EQ(a.size(), b.size()) << what;
    double max_abs = 0;
    size_t top1 = 0;
    for (size_t r = 0; r < a.size() / V; ++r) {
      for (size_t i = 0; i < V; ++i) max_abs = std::max(max_abs, std::abs(double(a[r * V + i]) - b[r * V + i]));
      top1 += model::argmax_token({a.data() + r * V, V}) == model::argmax_token({b.data() + r * V, V});
    }
    EXPECT_LE(max_abs, tol) << what;
    EXPECT_EQ(top1, a.size() / V) << what;
  }

  model::Glm5Hparams hp_;
  std::filesystem::path path_;
  std::shared_ptr<const model::Glm5Weights> weights_;
  std::vector<int32_t> prompt_;
};

TEST_F(IndexRingTest, ChunksOffThePoolAndDecodeGiveTheCpuLogits) {
  const uint32_t ring = index_key_rows(kContext, hp_.index_kpool, kStepRows);
  ASSERT_EQ(ring, kStepRows + hp_.index_kpool - 1);
  ASSERT_LT(2 * ring, prompt_.size());  // the ring wraps
  EXPECT_LT(stage_state_bytes(hp_, {0, hp_.n_layers}, 3, kContext, config::KvType::f32, 0, kStepRows),
            stage_state_bytes(hp_, {0, hp_.n_layers}, 3, kContext));
  ASSERT_EQ(index_key_rows(kContext, hp_.index_kpool, kContext), kContext);
  auto c = cpu();
  auto g = gpu();
  auto every = gpu(kContext);  // every position's keys: the layout before the ring
  ASSERT_TRUE(c && g && every);
  const std::vector<float> ref = run(*c, 0, prompt_, prompt_.size());
  uint32_t slot = 0;
  for (size_t chunk : {size_t{5}, size_t{37}, size_t{150}}) {
    const std::vector<float> got = run(*g, slot, prompt_, chunk);
    EXPECT_EQ(got, run(*every, slot, prompt_, chunk)) << "chunks of " << chunk;
    expect_agree(ref, got, 5e-3, "chunks of " + std::to_string(chunk));
    slot = (slot + 1) % 3;
  }
  // Prefill of 311 (311 % 4 = 3) in chunks of 137, then one token a step (graph replays).
  const std::vector<int32_t> head(prompt_.begin(), prompt_.begin() + 311), tail(prompt_.begin() + 311, prompt_.end());
  for (Pipeline* p : {g.get(), every.get()}) ASSERT_FALSE(p->reset_slot(1));
  std::vector<float> got = run(*g, 1, head, 137);
  EXPECT_EQ(got, run(*every, 1, head, 137));
  const std::vector<float> decoded = run(*g, 1, tail, 1, 311);
  EXPECT_EQ(decoded, run(*every, 1, tail, 1, 311));
  got.insert(got.end(), decoded.begin(), decoded.end());
  expect_agree(ref, got, 5e-3, "prefill then decode");
}

TEST_F(IndexRingTest, SavedMidPoolRestoresAfterTheRingWrapped) {
  auto c = cpu();
  auto g = gpu();
  ASSERT_TRUE(c && g);
  // 203 tokens: pool 50 holds 3 of them. Then 247 more, in steps of 5 (the ring of 153 wraps).
  const std::vector<int32_t> head(prompt_.begin(), prompt_.begin() + 203), tail(prompt_.begin() + 203, prompt_.end());
  run(*g, 0, head, 37);
  auto at_203 = g->save_slot(0, false);
  auto whole_203 = g->save_slot(0, true);
  ASSERT_TRUE(at_203 && whole_203);
  const std::vector<float> never = run(*g, 0, tail, 5, 203);
  // Back to 203 in the same slot, without rows: the tail of pool 50 comes from the image.
  ASSERT_FALSE(g->restore_slot(0, at_203.value()));
  EXPECT_EQ(never, run(*g, 0, tail, 5, 203));
  // With rows into another slot.
  ASSERT_FALSE(g->restore_slot(2, whole_203.value()));
  EXPECT_EQ(never, run(*g, 2, tail, 5, 203));
  // The CUDA image continues on the CPU, and the CPU's on the device.
  ASSERT_FALSE(c->restore_slot(0, whole_203.value()));
  expect_agree(never, run(*c, 0, tail, 40, 203), 5e-3, "a CUDA image on the CPU");
  ASSERT_FALSE(c->reset_slot(1));
  run(*c, 1, head, 203);
  auto cpu_203 = c->save_slot(1, true);
  ASSERT_TRUE(cpu_203);
  ASSERT_FALSE(g->restore_slot(1, cpu_203.value()));
  expect_agree(run(*c, 1, tail, 40, 203), run(*g, 1, tail, 37, 203), 5e-3, "a CPU image on the device");
}

}  // namespace
}  // namespace ferry::gpu
#endif  // FERRY_HAVE_CUDA
