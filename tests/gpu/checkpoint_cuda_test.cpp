// Checkpoints on the CUDA backend (ctest label cuda): resuming a prompt from kv::CheckpointStore images
// of CUDA stages gives the logits (f32, <= 1e-4) and greedy tokens of a full recompute on the device,
// for prefixes ending on and off the prefill chunk and the indexer's pool boundaries, on one stage and
// on two stages of one device. The scenario is the CPU test's (tests/kv/checkpoint_exactness.hpp).
#if FERRY_HAVE_CUDA
#include <gtest/gtest.h>

#include <random>

#include "gpu/cuda_stage.hpp"
#include "model/glm5/glm5_weights.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/kv/checkpoint_exactness.hpp"
#include "tests/model/random_model.hpp"

namespace ferry::gpu {
namespace {

class CheckpointCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::have_device()) GTEST_SKIP() << "no CUDA device";
    hp_ = testing::tiny_gpu_shape(32);
    hp_.indexer_full = {true, true, true, true, false};
    ASSERT_TRUE(hp_.validate().empty());
    path_ = testing::temp_model_path("checkpoint_cuda_test");
    ASSERT_TRUE(testing::write_random_model(hp_, model::GgmlType::F32, path_, 17));
    auto w = model::Glm5Weights::load(path_);
    ASSERT_TRUE(w) << w.error().message;
    weights_ = std::move(w.value());
    std::mt19937 rng(4);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(hp_.vocab_size) - 1);
    for (int i = 0; i < 90; ++i) prompt_.push_back(tok(rng));
  }
  void TearDown() override {
    weights_.reset();
    if (!path_.empty()) std::filesystem::remove(path_);
  }

  std::unique_ptr<model::Pipeline> pipeline(const std::vector<model::LayerRange>& ranges) {
    std::vector<std::shared_ptr<model::Stage>> stages;
    for (const model::LayerRange& r : ranges) {
      CudaStageOptions o;
      o.max_slots = 3;
      o.max_context = 512;
      o.max_step_rows = 64;
      auto s = CudaStage::from_weights(*weights_, r, o);
      EXPECT_TRUE(s) << (s ? "" : s.error().message);
      if (!s) return nullptr;
      stages.push_back(std::move(s.value()));
    }
    auto p = model::Pipeline::make(std::move(stages));
    EXPECT_TRUE(p) << (p ? "" : p.error().message);
    return p ? std::move(p.value()) : nullptr;
  }

  model::Glm5Hparams hp_;
  std::filesystem::path path_;
  std::shared_ptr<const model::Glm5Weights> weights_;
  std::vector<int32_t> prompt_;
};

// Chunks of 16, pools of 4: 16 and 48 end a chunk and a pool, 36 a pool only, 30 and 33 neither.
const std::vector<uint32_t> kPositions = {16, 30, 33, 36, 48, 89};

TEST_F(CheckpointCudaTest, ResumingEqualsAFullRecomputeOnOneStage) {
  auto p = pipeline({{0, hp_.n_layers}});
  ASSERT_TRUE(p);
  testing::expect_resume_exact(*p, prompt_, 16, kPositions, 1e-4);
}

TEST_F(CheckpointCudaTest, ResumingEqualsAFullRecomputeOverTwoStages) {
  auto p = pipeline({{0, 2}, {2, hp_.n_layers}});
  ASSERT_TRUE(p);
  testing::expect_resume_exact(*p, prompt_, 16, kPositions, 1e-4);
}

}  // namespace
}  // namespace ferry::gpu
#endif  // FERRY_HAVE_CUDA
