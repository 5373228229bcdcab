// Routed experts beyond the device: a stage whose pool holds only some experts (down to one slot, fewer
// than one token routes to) gives exactly the logits of the all-resident stage, whichever miss path a
// prefill takes (host memory read by the kernels, or uploads to the staging buffers), with swaps
// moving experts between the pool and the host store on every decode step; synthetic experts have the
// same bytes wherever they are made; the counters say where the routes went.
#if FERRY_HAVE_CUDA
#include <gtest/gtest.h>

#include <random>

#include "gpu/backend_factory.hpp"
#include "model/glm5/glm5_tensors.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/model/random_model.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::have_device;
using model::GgmlType;
using model::SlotRows;

model::Glm5Hparams shape() { return ferry::testing::tiny_gpu_shape(256); }

class ExpertTiersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
    path_ = testing::temp_model_path("expert_tiers_test");
    // Q4_K gate/up (rows of 256), Q8_0 down (rows of 32): experts of two types, as in real files.
    ASSERT_TRUE(testing::write_random_model(shape(), GgmlType::Q4_K, path_, 3));
    std::mt19937 rng(8);
    std::uniform_int_distribution<int32_t> tok(0, 96);
    for (int i = 0; i < 60; ++i) prompt_.push_back(tok(rng));
  }
  void TearDown() override {
    if (!path_.empty()) std::filesystem::remove(path_);
  }

  BackendOptions options(const std::string& cap = "", const std::string& miss = "auto") const {
    BackendOptions o;
    o.kind = "cuda";
    o.max_slots = 2;
    o.max_context = 256;
    o.max_step_rows = 64;
    if (!cap.empty()) o.memory.expert_pool_caps = {std::stoull(cap)};
    o.memory.miss_path = miss;
    o.memory.prefill_staging = 1 << 20;
    return o;
  }

  OpenedModel open(const BackendOptions& o) {
    auto m = open_pipeline(path_, o);
    EXPECT_TRUE(m) << (m ? "" : m.error().message);
    return m ? std::move(m.value()) : OpenedModel{};
  }

  // Prefill in chunks of 40 (GEMMs, the miss path of a chunk) then greedy decode, every logit kept;
  // `between` runs after each decode step.
  static std::vector<float> run(OpenedModel& m, const std::vector<int32_t>& prompt, const std::function<void()>& between) {
    std::vector<float> all;
    for (size_t at = 0; at < prompt.size(); at += 40) {
      SlotRows r{0, static_cast<uint32_t>(at),
                 {prompt.begin() + at, prompt.begin() + std::min(prompt.size(), at + 40)}, true, false, {}};
      auto res = m.pipeline->step({r});
      EXPECT_TRUE(res) << res.error().message;
      if (!res) return all;
      all.insert(all.end(), (*res)[0].logits.begin(), (*res)[0].logits.end());
    }
    int32_t t = 5;
    for (uint32_t pos = static_cast<uint32_t>(prompt.size()); pos < prompt.size() + 24; ++pos) {
      auto res = m.pipeline->step({SlotRows{0, pos, {t}, false, false, {}}});
      EXPECT_TRUE(res) << res.error().message;
      if (!res) return all;
      const std::vector<float>& lg = (*res)[0].logits;
      all.insert(all.end(), lg.begin(), lg.end());
      t = static_cast<int32_t>(std::max_element(lg.begin(), lg.end()) - lg.begin());
      between();
    }
    return all;
  }

  // Greedy decode through the sampling path (replayed from CUDA graphs), `between` after each step.
  static std::vector<int32_t> greedy(OpenedModel& m, const std::vector<int32_t>& prompt,
                                     const std::function<void()>& between) {
    std::vector<int32_t> out;
    auto first = m.pipeline->step({SlotRows{1, 0, prompt, false, true, {}}});
    EXPECT_TRUE(first);
    int32_t t = first ? (*first)[0].sampled : 0;
    for (uint32_t pos = static_cast<uint32_t>(prompt.size()); pos < prompt.size() + 20; ++pos) {
      out.push_back(t);
      auto res = m.pipeline->step({SlotRows{1, pos, {t}, false, true, {}}});
      EXPECT_TRUE(res);
      if (!res) break;
      t = (*res)[0].sampled;
      between();
    }
    return out;
  }

  static uint64_t slot_bytes(const OpenedModel& m) { return m.plan.expert_slot_bytes; }

  std::filesystem::path path_;
  std::vector<int32_t> prompt_;
};

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

TEST_F(ExpertTiersTest, EveryPoolSizeAndMissPathGivesTheResidentLogits) {
  OpenedModel resident = open(options());
  ASSERT_TRUE(resident.pipeline);
  ASSERT_FALSE(resident.plan.tiered());
  const std::vector<float> want = run(resident, prompt_, [] {});
  const uint64_t slot = slot_bytes(resident);
  ASSERT_GT(slot, 0u);
  for (const uint64_t slots : {uint64_t{1}, uint64_t{5}, uint64_t{17}}) {
    for (const char* miss : {"mapped", "upload"}) {
      OpenedModel tiered = open(options(std::to_string(slots * slot), miss));
      ASSERT_TRUE(tiered.pipeline);
      ASSERT_TRUE(tiered.plan.tiered());
      EXPECT_LE(max_diff(want, run(tiered, prompt_, [] {})), 1e-6f) << slots << " slots, " << miss;
      const model::ExpertTierCounters c = tiered.pipeline->stages()[0]->experts()->counters();
      EXPECT_EQ(c.pool_slots, slots);
      EXPECT_GT(c.misses_mapped, 0u) << "decode reads missed experts from host memory";
      if (std::string(miss) == "upload") {
        EXPECT_GT(c.misses_uploaded, 0u);
        EXPECT_GT(c.bytes_uploaded, 0u);
      } else {
        EXPECT_EQ(c.misses_uploaded, 0u);
      }
      EXPECT_EQ(c.routes, c.hits + c.misses_mapped + c.misses_uploaded);
    }
  }
}

TEST_F(ExpertTiersTest, SwapsOnEveryDecodeStepChangeNoLogit) {
  OpenedModel resident = open(options());
  ASSERT_TRUE(resident.pipeline);
  const std::vector<float> want = run(resident, prompt_, [] {});
  OpenedModel tiered = open(options(std::to_string(4 * slot_bytes(resident))));
  ASSERT_TRUE(tiered.pipeline && tiered.experts);
  // Each step, make one expert outside the pool the most routed by far: the policy swaps it in.
  std::mt19937 rng(2);
  const auto force_swaps = [&] {
    model::RouteCounts fake;
    fake.layers = {1, 2, 3, 4};
    fake.experts = 6;
    fake.counts.assign(24, 0);
    for (int tries = 0; tries < 50; ++tries) {
      const uint32_t l = 1 + rng() % 4, e = rng() % 6;
      if (tiered.experts->pooled({l, e})) continue;
      fake.counts[(l - 1) * 6 + e] = 1000;
      break;
    }
    tiered.experts->observe(0, fake);
    tiered.rebalance();
  };
  EXPECT_LE(max_diff(want, run(tiered, prompt_, force_swaps)), 1e-6f);
  EXPECT_EQ(greedy(resident, prompt_, [] {}), greedy(tiered, prompt_, force_swaps));
  // Steps with nothing new to move finish the swaps under way: each then promoted one and evicted one.
  EXPECT_EQ(greedy(resident, prompt_, [] {}), greedy(tiered, prompt_, [] {}));
  const model::ExpertTierCounters c = tiered.pipeline->stages()[0]->experts()->counters();
  EXPECT_GT(c.promotions, 5u);
  EXPECT_EQ(c.swaps_in_flight, 0u);
  EXPECT_EQ(c.promotions, c.evictions);
  EXPECT_EQ(c.pool_used, c.pool_slots);
}

TEST_F(ExpertTiersTest, SyntheticExpertsAreTheSameWhereverTheyAreMade) {
  BackendOptions o = options();
  o.route_skew = 0.5f;
  auto resident = open_synthetic_pipeline(shape(), GgmlType::Q4_K, 9, o);
  ASSERT_TRUE(resident) << resident.error().message;
  const std::vector<float> want = run(resident.value(), prompt_, [] {});
  o.memory.expert_pool_caps = {3 * resident->plan.expert_slot_bytes};
  auto tiered = open_synthetic_pipeline(shape(), GgmlType::Q4_K, 9, o);
  ASSERT_TRUE(tiered) << tiered.error().message;
  ASSERT_TRUE(tiered->plan.tiered());
  EXPECT_LE(max_diff(want, run(tiered.value(), prompt_, [&] { tiered->rebalance(); })), 1e-6f);
}

TEST_F(ExpertTiersTest, APlanThatCannotFitIsRefusedNamingTheBudget) {
  BackendOptions o = options(std::to_string(uint64_t{1} << 50));
  auto m = open_pipeline(path_, o);
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().code, ErrorCode::out_of_memory);
  EXPECT_NE(m.error().message.find("--expert-pool-cap"), std::string::npos) << m.error().message;
  o = options("1");
  o.memory.host_expert_budget = 1;
  m = open_pipeline(path_, o);
  ASSERT_FALSE(m);
  EXPECT_NE(m.error().message.find("--host-expert-budget"), std::string::npos) << m.error().message;
}

}  // namespace
}  // namespace ferry::gpu
#endif
