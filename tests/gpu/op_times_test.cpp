// The per-op time breakdown of eager steps (gpu/op_times.hpp, `ferry bench --op-times`) on the small
// random model: timing leaves the logits bit-identical, a prefill step marks every op group its layers
// have the expected number of times, decode graphs and untimed steps add nothing, and the groups add
// up to the step.
#if FERRY_HAVE_CUDA
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "gpu/cuda_stage.hpp"
#include "gpu/op_times.hpp"
#include "model/glm5/glm5_weights.hpp"
#include "model/pipeline.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/model/random_model.hpp"

namespace ferry::gpu {
namespace {

using model::FfnKind;
using model::GgmlType;
using model::LayerKind;
using model::SlotRows;

class OpTimesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::have_device()) GTEST_SKIP() << "no CUDA device";
    hp_ = testing::tiny_gpu_shape(256);
    path_ = testing::temp_model_path("op_times_test");
    ASSERT_TRUE(testing::write_random_model(hp_, GgmlType::Q8_0, path_, 3));
    auto w = model::Glm5Weights::load(path_);
    ASSERT_TRUE(w) << w.error().message;
    weights_ = std::move(w.value());
    CudaStageOptions go;
    go.max_slots = 2;
    go.max_context = 256;
    go.max_step_rows = 64;
    auto s = CudaStage::from_weights(*weights_, {0, hp_.n_layers}, go);
    ASSERT_TRUE(s) << s.error().message;
    stage_ = s.value().get();
    auto p = model::Pipeline::make({std::shared_ptr<model::Stage>(std::move(s.value()))});
    ASSERT_TRUE(p) << p.error().message;
    pipe_ = std::move(p.value());
    std::mt19937 rng(9);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(hp_.vocab_size) - 1);
    for (int i = 0; i < 40; ++i) prompt_.push_back(tok(rng));
  }
  void TearDown() override {
    pipe_.reset();
    weights_.reset();
    if (!path_.empty()) std::filesystem::remove(path_);
  }
  // A whole prefill of the prompt into slot 0 from its start: every row's logits.
  std::vector<float> prefill() {
    SlotRows r{0, 0, prompt_, true, false, {}};
    auto res = pipe_->step({r});
    EXPECT_TRUE(res) << res.error().message;
    return res ? (*res)[0].logits : std::vector<float>{};
  }
  uint64_t marks(const OpTimeTotals& t, OpGroup g) const { return t.marks[static_cast<size_t>(g)]; }

  model::Glm5Hparams hp_;
  std::filesystem::path path_;
  std::shared_ptr<const model::Glm5Weights> weights_;
  std::unique_ptr<model::Pipeline> pipe_;
  CudaStage* stage_ = nullptr;
  std::vector<int32_t> prompt_;
};

TEST_F(OpTimesTest, APrefillMarksEveryGroupItsLayersHaveAndKeepsTheLogits) {
  const std::vector<float> untimed = prefill();
  EXPECT_EQ(stage_->take_op_times().steps, 0u) << "timing is off by default";
  stage_->time_ops(true);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<float> timed = prefill();
  const double wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const OpTimeTotals t = stage_->take_op_times();
  ASSERT_FALSE(timed.empty());
  EXPECT_EQ(untimed, timed) << "events must not change what the step computes";
  EXPECT_EQ(t.steps, 1u);

  uint64_t kda = 0, dsa = 0, dense = 0, moe = 0;
  for (uint32_t il = 0; il < hp_.n_layers; ++il) {
    (hp_.layer_kinds[il] == LayerKind::kda ? kda : dsa) += 1;
    (hp_.ffn_kinds[il] == FfnKind::dense ? dense : moe) += 1;
  }
  const uint64_t layers = hp_.n_layers;
  EXPECT_EQ(marks(t, OpGroup::embed), 1u);
  EXPECT_EQ(marks(t, OpGroup::mhc_pre), 2 * layers);
  EXPECT_EQ(marks(t, OpGroup::mhc_post), 2 * layers);
  EXPECT_EQ(marks(t, OpGroup::kda_proj), 2 * kda);
  EXPECT_EQ(marks(t, OpGroup::kda_conv), kda);
  EXPECT_EQ(marks(t, OpGroup::kda_recurrence), kda);
  EXPECT_EQ(marks(t, OpGroup::kda_out), kda);
  EXPECT_EQ(marks(t, OpGroup::sparse_mla), dsa);
  EXPECT_EQ(marks(t, OpGroup::dsa_out), dsa);
  EXPECT_EQ(marks(t, OpGroup::dsa_proj), 2 * dsa);
  EXPECT_GE(marks(t, OpGroup::indexer_select), 1u);  // layers that reuse a selection have no indexer
  EXPECT_LE(marks(t, OpGroup::indexer_select), dsa);
  EXPECT_EQ(marks(t, OpGroup::indexer_proj), marks(t, OpGroup::indexer_select));
  EXPECT_EQ(marks(t, OpGroup::dense_ffn), dense);
  EXPECT_EQ(marks(t, OpGroup::moe_router), moe);
  EXPECT_EQ(marks(t, OpGroup::moe_experts), moe);
  EXPECT_TRUE(marks(t, OpGroup::moe_shared) == 0 || marks(t, OpGroup::moe_shared) == moe);
  EXPECT_EQ(marks(t, OpGroup::head), 1u);
  // 40 rows take the cuBLAS path: the projections' groups have GEMMs and fp16 conversions (Q8_0
  // weights), the groups without products none; parts never exceed their group.
  for (OpGroup g : {OpGroup::kda_proj, OpGroup::kda_out, OpGroup::dsa_proj, OpGroup::dsa_out, OpGroup::dense_ffn}) {
    EXPECT_GT(t.gemm_ms[static_cast<size_t>(g)], 0.0) << op_group_name(g);
    EXPECT_GT(t.convert_ms[static_cast<size_t>(g)], 0.0) << op_group_name(g);
  }
  for (OpGroup g : {OpGroup::embed, OpGroup::mhc_post, OpGroup::kda_conv, OpGroup::kda_recurrence,
                    OpGroup::indexer_select, OpGroup::sparse_mla}) {
    EXPECT_EQ(t.gemm_ms[static_cast<size_t>(g)] + t.convert_ms[static_cast<size_t>(g)], 0.0) << op_group_name(g);
  }
  for (size_t i = 0; i < kOpGroups; ++i) {
    EXPECT_LE(t.gemm_ms[i] + t.convert_ms[i], t.ms[i] * (1 + 1e-6) + 1e-9) << op_group_name(static_cast<OpGroup>(i));
    EXPECT_GE(t.ms[i], 0.0) << op_group_name(static_cast<OpGroup>(i));
    if (t.marks[i] == 0) {
      EXPECT_EQ(t.ms[i], 0.0) << op_group_name(static_cast<OpGroup>(i));
    }
  }
  // The marks cover the step from the embedding to the results on the host, inside its wall time.
  EXPECT_GT(t.total_ms(), 0.0);
  EXPECT_LE(t.total_ms(), wall_ms);
  const std::string table = format_op_times(t, "pp40");
  EXPECT_NE(table.find("sparse_mla"), std::string::npos) << table;
  EXPECT_NE(table.find("total"), std::string::npos) << table;
  EXPECT_EQ(table.find("moe_shared"), marks(t, OpGroup::moe_shared) == 0 ? std::string::npos : table.find("moe_shared"))
      << "groups without marks are left out";
}

TEST_F(OpTimesTest, DecodeGraphsAndUntimedStepsAddNothing) {
  stage_->time_ops(true);
  auto first = pipe_->step({SlotRows{1, 0, prompt_, false, true, {}}});
  ASSERT_TRUE(first) << first.error().message;
  EXPECT_EQ(stage_->take_op_times().steps, 1u);
  int32_t t = (*first)[0].sampled;
  uint32_t pos = static_cast<uint32_t>(prompt_.size());
  for (int i = 0; i < 4; ++i) {  // captured, then replayed
    auto res = pipe_->step({SlotRows{1, pos++, {t}, false, true, {}}});
    ASSERT_TRUE(res) << res.error().message;
    t = (*res)[0].sampled;
  }
  const OpTimeTotals decode = stage_->take_op_times();
  EXPECT_EQ(decode.steps, 0u);
  EXPECT_EQ(decode.total_ms(), 0.0);
  stage_->time_ops(false);
  prefill();
  EXPECT_EQ(stage_->take_op_times().steps, 0u);
}

TEST(OpTimesTotals, AddSumsGroupsAndSteps) {
  OpTimeTotals a, b;
  a.ms[static_cast<size_t>(OpGroup::head)] = 1.5;
  a.marks[static_cast<size_t>(OpGroup::head)] = 1;
  a.steps = 1;
  b.ms[static_cast<size_t>(OpGroup::head)] = 0.5;
  b.ms[static_cast<size_t>(OpGroup::sparse_mla)] = 2.0;
  a.gemm_ms[static_cast<size_t>(OpGroup::head)] = 0.25;
  a.convert_ms[static_cast<size_t>(OpGroup::head)] = 0.5;
  b.marks[static_cast<size_t>(OpGroup::head)] = 1;
  b.marks[static_cast<size_t>(OpGroup::sparse_mla)] = 3;
  b.steps = 1;
  a.add(b);
  EXPECT_EQ(a.steps, 2u);
  EXPECT_DOUBLE_EQ(a.ms[static_cast<size_t>(OpGroup::head)], 2.0);
  EXPECT_DOUBLE_EQ(a.total_ms(), 4.0);
  EXPECT_EQ(a.marks[static_cast<size_t>(OpGroup::sparse_mla)], 3u);
  const std::string table = format_op_times(a, "x");
  EXPECT_DOUBLE_EQ(a.gemm_ms[static_cast<size_t>(OpGroup::head)], 0.25);
  // Per step (2): head 1.0 ms, 50% of 2.0, 0.125 cuBLAS, 0.25 fp16, 1 mark.
  EXPECT_NE(table.find("head                  1.000   50.0%      0.125      0.250      1.0"), std::string::npos)
      << table;
}

}  // namespace
}  // namespace ferry::gpu
#endif
