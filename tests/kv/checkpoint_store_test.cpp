// Checkpoints on the CPU backend: resuming a prompt from a kv::CheckpointStore image gives the logits
// (f32, <= 1e-4) and greedy tokens of a full recompute, for prefixes ending on and off the prefill
// chunk and the indexer's pool boundaries, in place and from spilled rows into another slot, on one
// stage and split into two; a missing checkpoint is a clear error; spilled rows are one shared copy;
// dropping frees the images.
#include "kv/checkpoint_store.hpp"

#include <gtest/gtest.h>

#include <random>

#include "model/cpu/cpu_stage.hpp"
#include "tests/kv/checkpoint_exactness.hpp"
#include "tests/model/random_model.hpp"

namespace ferry::kv {
namespace {

model::Glm5Hparams tiny() { return testing::five_layer_hparams(); }

class CheckpointStoreTest : public ::testing::Test {
 protected:
  std::filesystem::path path_ = testing::temp_model_path("checkpoint_store_test");

  void SetUp() override {
    ASSERT_TRUE(tiny().validate().empty());
    ASSERT_TRUE(testing::write_random_model(tiny(), model::GgmlType::F32, path_, 13));
    auto w = model::Glm5Weights::load(path_);
    ASSERT_TRUE(w) << w.error().message;
    weights_ = std::move(w.value());
    std::mt19937 rng(3);
    std::uniform_int_distribution<int32_t> tok(0, 96);
    for (int i = 0; i < 75; ++i) prompt_.push_back(tok(rng));
  }
  void TearDown() override {
    weights_.reset();
    std::filesystem::remove(path_);
  }

  std::unique_ptr<model::Pipeline> pipeline(const std::vector<model::LayerRange>& ranges) {
    model::CpuStageOptions o;
    o.max_slots = 3;
    auto p = model::Pipeline::make(model::make_cpu_stages(weights_, ranges, 2, o));
    EXPECT_TRUE(p) << (p ? "" : p.error().message);
    return p ? std::move(p.value()) : nullptr;
  }

  std::shared_ptr<const model::Glm5Weights> weights_;
  std::vector<int32_t> prompt_;
};

// Chunks of 16, pools of 4: 16 and 48 end a chunk and a pool, 36 a pool only, 30 and 33 neither.
const std::vector<uint32_t> kPositions = {16, 30, 33, 36, 48, 74};

TEST_F(CheckpointStoreTest, ResumingEqualsAFullRecomputeOnOneStage) {
  auto p = pipeline({{0, 5}});
  ASSERT_TRUE(p);
  testing::expect_resume_exact(*p, prompt_, 16, kPositions, 1e-4);
}

TEST_F(CheckpointStoreTest, ResumingEqualsAFullRecomputeOverTwoStages) {
  auto p = pipeline({{0, 2}, {2, 5}});
  ASSERT_TRUE(p);
  testing::expect_resume_exact(*p, prompt_, 16, kPositions, 1e-4);
}

TEST_F(CheckpointStoreTest, AMissingCheckpointIsAnErrorAndDropFreesIt) {
  auto p = pipeline({{0, 5}});
  ASSERT_TRUE(p);
  model::Stage& stage = *p->stages()[0];
  CheckpointStore store;
  const Status missing = store.restore(stage, 0, 7);
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->code, ErrorCode::invalid_plan);
  EXPECT_NE(missing->message.find("checkpoint 7 is not held"), std::string::npos) << missing->message;
  testing::prefill_logits(*p, 0, prompt_, 0, 20, 20);
  const Status other_count = store.save(stage, 0, 6, 21);
  ASSERT_TRUE(other_count);
  EXPECT_EQ(other_count->code, ErrorCode::invalid_plan);
  EXPECT_NE(other_count->message.find("holds 20 positions, not the checkpoint's 21"), std::string::npos)
      << other_count->message;
  EXPECT_EQ(store.find(6), nullptr);
  ASSERT_FALSE(store.save(stage, 0, 7, 20));
  ASSERT_NE(store.find(7), nullptr);
  EXPECT_EQ(store.find(7)->tokens, 20u);
  const uint32_t mtp = store.find(7)->mtp_tokens;
  const uint64_t fixed = stage.state_layout().image_floats(20, mtp, false) * sizeof(float);
  EXPECT_EQ(store.bytes(), fixed);  // the rows are still the slot's
  EXPECT_FALSE(store.spilled(7));
  testing::prefill_logits(*p, 0, prompt_, 20, 30, 10);
  ASSERT_FALSE(store.save(stage, 0, 8, 30));
  const std::vector<uint64_t> both = {7, 8};
  ASSERT_FALSE(store.spill(stage, 0, both));
  EXPECT_TRUE(store.spilled(7) && store.spilled(8));
  // One copy of the slot's 30 rows, shared by both checkpoints.
  EXPECT_EQ(store.bytes(), fixed + stage.state_layout().image_floats(30, store.find(8)->mtp_tokens, false) * sizeof(float) +
                               stage.state_layout().image_floats(30, store.find(8)->mtp_tokens, true) * sizeof(float));
  store.drop(8);
  store.drop(7);
  EXPECT_EQ(store.size(), 0u);
  EXPECT_EQ(store.bytes(), 0u);
}

}  // namespace
}  // namespace ferry::kv
