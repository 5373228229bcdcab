// The GPU resident KV window (gpu/kv_window.hpp) against the all-resident stage on the same random
// model: with a window of 24 rows per DSA layer and slot (one query row selects up to 12) and prompts
// of 150 tokens, prefill (the host-tier reads), chunked prefill and decode (CLOCK, fetches from the
// host tier; planned on the device, graphed or not, or on the host for a chunk of 5 rows), several
// slots in one step, a slot saved out of its window and restored, and a rollback give the same
// logits bit for bit: the same encoded rows are read in the same order (f32 and int8 rows).
#if FERRY_HAVE_CUDA
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <string>

#include "gpu/cuda_stage.hpp"
#include "model/glm5/glm5_weights.hpp"
#include "model/pipeline.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/model/random_model.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::have_device;
using model::Pipeline;
using model::SlotRows;

constexpr uint32_t kWindow = 24;

class KvWindowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
    hp_ = ferry::testing::tiny_gpu_shape(32);
    hp_.indexer_full = {true, true, true, true, false};  // layer 4 reuses layer 3's selection
    ASSERT_TRUE(hp_.validate().empty());
    path_ = testing::temp_model_path("kv_window_test");
    ASSERT_TRUE(testing::write_random_model(hp_, model::GgmlType::F32, path_, 17));
    auto w = model::Glm5Weights::load(path_);
    ASSERT_TRUE(w) << w.error().message;
    weights_ = std::move(w.value());
    std::mt19937 rng(9);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(hp_.vocab_size) - 1);
    for (int i = 0; i < 150; ++i) prompt_.push_back(tok(rng));
  }
  void TearDown() override {
    weights_.reset();
    if (!path_.empty()) std::filesystem::remove(path_);
  }

  std::unique_ptr<Pipeline> open(uint32_t resident, config::KvType latent = config::KvType::f32, bool graphs = true) {
    CudaStageOptions go;
    go.graphs = graphs;
    go.kv.latent = latent;
    go.kv_resident = resident;
    go.max_slots = 3;
    go.max_context = 512;
    go.max_step_rows = 160;
    auto s = CudaStage::from_weights(*weights_, {0, hp_.n_layers}, go);
    EXPECT_TRUE(s) << (s ? "" : s.error().message);
    if (!s) return nullptr;
    stage_ = s.value().get();
    std::vector<std::shared_ptr<model::Stage>> stages{std::move(s.value())};
    auto p = Pipeline::make(std::move(stages));
    EXPECT_TRUE(p) << (p ? "" : p.error().message);
    return p ? std::move(p.value()) : nullptr;
  }

  static std::vector<model::SlotResult> step(Pipeline& b, const std::vector<SlotRows>& rows) {
    auto res = b.step(rows);
    EXPECT_TRUE(res) << res.error().message;
    return res ? std::move(res.value()) : std::vector<model::SlotResult>(rows.size());
  }

  // Every row's logits: `tokens` into `slot` in chunks, then `decode` greedy steps one row at a time.
  static std::vector<float> run(Pipeline& b, uint32_t slot, const std::vector<int32_t>& tokens, size_t chunk,
                                int decode) {
    std::vector<float> all;
    for (size_t at = 0; at < tokens.size(); at += chunk) {
      SlotRows r{slot, static_cast<uint32_t>(at), {}, true, true, {}};
      r.tokens.assign(tokens.begin() + at, tokens.begin() + std::min(tokens.size(), at + chunk));
      auto res = step(b, {r});
      all.insert(all.end(), res[0].logits.begin(), res[0].logits.end());
      if (at + chunk >= tokens.size()) {
        int32_t t = res[0].sampled;
        for (int i = 0; i < decode; ++i) {
          auto d = step(b, {SlotRows{slot, static_cast<uint32_t>(tokens.size() + i), {t}, true, true, {}}});
          all.insert(all.end(), d[0].logits.begin(), d[0].logits.end());
          t = d[0].sampled;
        }
      }
    }
    return all;
  }

  model::Glm5Hparams hp_;
  std::filesystem::path path_;
  std::shared_ptr<const model::Glm5Weights> weights_;
  std::vector<int32_t> prompt_;
  CudaStage* stage_ = nullptr;
};

TEST_F(KvWindowTest, PrefillAndDecodePastTheWindowGiveTheAllResidentLogits) {
  for (config::KvType t : {config::KvType::f32, config::KvType::int8}) {
    auto all = open(0, t);
    auto win = open(kWindow, t);
    ASSERT_TRUE(all && win);
    model::Stage* ws = stage_;
    for (size_t chunk : {size_t{150}, size_t{37}, size_t{5}}) {
      const std::vector<float> want = run(*all, 0, prompt_, chunk, 20);
      const std::vector<float> got = run(*win, 0, prompt_, chunk, 20);
      ASSERT_EQ(want.size(), got.size());
      size_t differ = 0;
      for (size_t i = 0; i < want.size(); ++i) differ += want[i] != got[i];
      EXPECT_EQ(differ, 0u) << config::kv_type_name(t) << " chunk " << chunk;
    }
    const model::StageCounters c = ws->counters();
    EXPECT_EQ(c.kv_window_rows, uint64_t{3} * 3 * kWindow);  // 3 DSA layers x 3 slots
    EXPECT_GT(c.kv_windowed_steps, 0u);
    EXPECT_GT(c.kv_fetched_rows, 0u);  // decode past the window fetches ...
    EXPECT_GT(c.kv_hits, 0u);          // ... and finds rows resident
    EXPECT_LE(c.kv_resident_rows, c.kv_window_rows);
    ASSERT_EQ(c.kv_host_slot_bytes.size(), 3u);
    EXPECT_EQ(c.kv_host_slot_bytes[0], uint64_t{3} * 170 * config::kv_row_bytes(t, hp_.kv_lora_rank));
  }
}

TEST_F(KvWindowTest, AContextWithinTheWindowNeverLeavesIt) {
  auto all = open(0);
  auto win = open(200);
  ASSERT_TRUE(all && win);
  EXPECT_EQ(run(*all, 1, prompt_, 150, 10), run(*win, 1, prompt_, 150, 10));
  const model::StageCounters c = stage_->counters();
  EXPECT_EQ(c.kv_windowed_steps, 0u);
  EXPECT_EQ(c.kv_fetched_rows, 0u);
  EXPECT_EQ(c.kv_resident_rows, uint64_t{3} * 160);  // every row of slot 1, in place
}

TEST_F(KvWindowTest, SlotsInOneStepAndARestoredSlotGiveTheAllResidentLogits) {
  auto all = open(0);
  auto win = open(kWindow);
  ASSERT_TRUE(all && win);
  std::vector<int32_t> a(prompt_.begin(), prompt_.begin() + 100), b(prompt_.begin() + 100, prompt_.begin() + 110);
  std::vector<float> want, got;
  for (Pipeline* p : {all.get(), win.get()}) {
    std::vector<float>& out = p == all.get() ? want : got;
    auto first = step(*p, {SlotRows{0, 0, a, true, false, {}}, SlotRows{2, 0, b, true, false, {}}});
    for (const auto& r : first) out.insert(out.end(), r.logits.begin(), r.logits.end());
    for (uint32_t i = 0; i < 6; ++i) {
      auto d = step(*p, {SlotRows{2, 10 + i, {b[i]}, true, false, {}}, SlotRows{0, 100 + i, {a[i]}, true, false, {}}});
      for (const auto& r : d) out.insert(out.end(), r.logits.begin(), r.logits.end());
    }
    // Slot 0 (106 rows, out of its window) saved, restored into slot 1, continued there.
    auto image = p->stages()[0]->save_slot(0, true);
    ASSERT_TRUE(image) << image.error().message;
    ASSERT_FALSE(p->stages()[0]->restore_slot(1, image.value()));
    for (uint32_t i = 0; i < 6; ++i) {
      auto d = step(*p, {SlotRows{1, 106 + i, {a[10 + i]}, true, false, {}}});
      out.insert(out.end(), d[0].logits.begin(), d[0].logits.end());
    }
  }
  ASSERT_EQ(want.size(), got.size());
  EXPECT_EQ(want, got);
}

// Decode steps past the window are planned on the device and captured: one-row steps of slot 0 and
// slot 2 replay the same graph (the slot comes from the device), a step of slots 0 and 1 hands slot 1
// (in its window until then) to CLOCK. Graphs on and off give the all-resident logits.
TEST_F(KvWindowTest, GraphedWindowedDecodeOfSeveralSlotsGivesTheAllResidentLogits) {
  auto all = open(0);
  auto graphed = open(kWindow);
  model::Stage* gs = stage_;
  auto eager = open(kWindow, config::KvType::f32, false);
  ASSERT_TRUE(all && graphed && eager);
  std::vector<std::vector<float>> out(3);
  Pipeline* pipes[] = {all.get(), graphed.get(), eager.get()};
  for (int k = 0; k < 3; ++k) {
    Pipeline& p = *pipes[k];
    auto take = [&](const std::vector<model::SlotResult>& res) {
      for (const auto& r : res) out[k].insert(out[k].end(), r.logits.begin(), r.logits.end());
    };
    const std::vector<int32_t> a(prompt_.begin(), prompt_.begin() + 60), b(prompt_.begin() + 60, prompt_.begin() + 100),
        c(prompt_.begin() + 100, prompt_.begin() + 110);
    take(step(p, {SlotRows{0, 0, a, true, false, {}}, SlotRows{2, 0, b, true, false, {}}}));
    take(step(p, {SlotRows{1, 0, c, true, false, {}}}));  // in its window: not a windowed step
    uint32_t at0 = 60, at1 = 10, at2 = 40;
    for (uint32_t i = 0; i < 8; ++i) {
      take(step(p, {SlotRows{0, at0++, {prompt_[i]}, true, false, {}}}));
      take(step(p, {SlotRows{2, at2++, {prompt_[20 + i]}, true, false, {}}}));
      if (i >= 4) {
        take(step(p, {SlotRows{0, at0++, {prompt_[40 + i]}, true, false, {}},
                      SlotRows{1, at1++, {prompt_[i]}, true, false, {}}}));
      }
    }
  }
  ASSERT_EQ(out[0].size(), out[1].size());
  EXPECT_EQ(out[0], out[1]) << "graphs on";
  EXPECT_EQ(out[0], out[2]) << "graphs off";
  const model::StageCounters c = gs->counters();
  EXPECT_GT(c.kv_hits, 0u);
  EXPECT_GT(c.kv_fetched_rows, 0u);
}

// A slot rolled back past its window (an image without rows) rewrites positions its frames held:
// the cut frees them on the device tables, or the attention would read the old rows.
TEST_F(KvWindowTest, ARollbackPastTheWindowDropsTheFramesAfterTheCut) {
  auto all = open(0);
  auto win = open(kWindow);
  ASSERT_TRUE(all && win);
  std::vector<float> want, got;
  for (Pipeline* p : {all.get(), win.get()}) {
    std::vector<float>& out = p == all.get() ? want : got;
    const std::vector<int32_t> a(prompt_.begin(), prompt_.begin() + 80);
    step(*p, {SlotRows{0, 0, a, true, false, {}}});
    for (uint32_t i = 0; i < 4; ++i) step(*p, {SlotRows{0, 80 + i, {prompt_[i]}, true, false, {}}});
    auto image = p->stages()[0]->save_slot(0, false);
    ASSERT_TRUE(image) << image.error().message;
    for (uint32_t i = 0; i < 6; ++i) step(*p, {SlotRows{0, 84 + i, {prompt_[10 + i]}, true, false, {}}});
    ASSERT_FALSE(p->stages()[0]->restore_slot(0, image.value()));
    for (uint32_t i = 0; i < 6; ++i) {
      auto d = step(*p, {SlotRows{0, 84 + i, {prompt_[30 + i]}, true, false, {}}});
      out.insert(out.end(), d[0].logits.begin(), d[0].logits.end());
    }
  }
  ASSERT_EQ(want.size(), got.size());
  EXPECT_EQ(want, got);
}

// Prefill chunks past the window gather their selections' union into a staging of --kv-resident rows
// (gpu/prefill_gather.hpp). A window of 100: the chunks [74, 111) and [111, 148) find the positions
// before 74 in the window's frames (adopted when the slot left it), the rest in the host tier. A
// window of 24 (two rows' selections): every chunk, windowed from the first, is split into groups.
// f32 and int8 rows, the all-resident logits bit for bit; the timing line is for the log.
TEST_F(KvWindowTest, ChunkedPrefillPastTheWindowGathersTheUnionAndGivesTheAllResidentLogits) {
  for (config::KvType t : {config::KvType::f32, config::KvType::int8}) {
    auto all = open(0, t);
    for (uint32_t resident : {100u, kWindow}) {
      auto win = open(resident, t);
      ASSERT_TRUE(all && win);
      CudaStage* ws = stage_;
      const auto t0 = std::chrono::steady_clock::now();
      const std::vector<float> want = run(*all, 0, prompt_, 37, 6);
      const auto t1 = std::chrono::steady_clock::now();
      const std::vector<float> got = run(*win, 0, prompt_, 37, 6);
      const auto t2 = std::chrono::steady_clock::now();
      ASSERT_EQ(want.size(), got.size());
      size_t differ = 0;
      for (size_t i = 0; i < want.size(); ++i) differ += want[i] != got[i];
      EXPECT_EQ(differ, 0u) << config::kv_type_name(t) << " window " << resident;
      const CudaStage::PrefillGatherCounts c = ws->prefill_gather_counts();
      EXPECT_GT(c.rows, 0u);
      EXPECT_GT(c.tier_rows, 0u);  // the chunk's own rows, at least
      if (resident == kWindow) {
        EXPECT_EQ(c.tier_rows, c.rows);  // windowed from the first chunk: no frames yet
      } else {
        EXPECT_LT(c.tier_rows, c.rows);  // positions before 74 from the window's frames
      }
      // Windowed chunks of 37 rows: 2 (window 100) or 4 (window 24) a DSA layer, more groups when split.
      const uint64_t chunks = resident == kWindow ? 4 : 2;
      if (resident == kWindow) {
        EXPECT_GT(c.groups, 3 * chunks);
      } else {
        EXPECT_GE(c.groups, 3 * chunks);
      }
      std::printf("[ timing ] prefill 150 rows in chunks of 37 + 6 decode, %s, window %u: %.2f ms windowed, %.2f ms "
                  "all-resident; %llu staging rows (%llu from the host tier) in %llu groups\n",
                  std::string(config::kv_type_name(t)).c_str(), resident,
                  std::chrono::duration<double, std::milli>(t2 - t1).count(),
                  std::chrono::duration<double, std::milli>(t1 - t0).count(),
                  static_cast<unsigned long long>(c.rows),
                  static_cast<unsigned long long>(c.tier_rows),
                  static_cast<unsigned long long>(c.groups));
    }
  }
}

// Two slots' prefill chunks in one step past the window (one union over both slots' positions), then
// each slot's next chunk and decode of both: the all-resident logits.
TEST_F(KvWindowTest, PrefillOfSeveralSlotsInOneStepPastTheWindowGivesTheAllResidentLogits) {
  auto all = open(0);
  auto win = open(40);
  ASSERT_TRUE(all && win);
  CudaStage* ws = stage_;
  std::vector<float> want, got;
  for (Pipeline* p : {all.get(), win.get()}) {
    std::vector<float>& out = p == all.get() ? want : got;
    auto take = [&](const std::vector<model::SlotResult>& res) {
      for (const auto& r : res) out.insert(out.end(), r.logits.begin(), r.logits.end());
    };
    const std::vector<int32_t> a(prompt_.begin(), prompt_.begin() + 50), b(prompt_.begin() + 50, prompt_.begin() + 95),
        a2(prompt_.begin() + 95, prompt_.begin() + 125), b2(prompt_.begin() + 125, prompt_.begin() + 150);
    take(step(*p, {SlotRows{0, 0, a, true, true, {}}, SlotRows{2, 0, b, true, true, {}}}));
    take(step(*p, {SlotRows{2, 45, b2, true, true, {}}, SlotRows{0, 50, a2, true, true, {}}}));
    for (uint32_t i = 0; i < 4; ++i) {
      take(step(*p, {SlotRows{0, 80 + i, {prompt_[i]}, true, false, {}},
                     SlotRows{2, 70 + i, {prompt_[9 + i]}, true, false, {}}}));
    }
  }
  ASSERT_EQ(want.size(), got.size());
  EXPECT_EQ(want, got);
  EXPECT_GT(ws->prefill_gather_counts().rows, 0u);
}

// Prefill past the window after a rollback (an image without rows: positions past it rewritten by a
// chunk) and into a slot restored from another's image (its rows in the host tier): the cut frees the
// frames the chunk rewrites, the gather reads the restored rows. The all-resident logits.
TEST_F(KvWindowTest, PrefillPastTheWindowAfterARollbackAndARestoreGivesTheAllResidentLogits) {
  for (config::KvType t : {config::KvType::f32, config::KvType::int8}) {
    auto all = open(0, t);
    auto win = open(kWindow, t);
    ASSERT_TRUE(all && win);
    std::vector<float> want, got;
    for (Pipeline* p : {all.get(), win.get()}) {
      std::vector<float>& out = p == all.get() ? want : got;
      auto take = [&](const std::vector<model::SlotResult>& res) {
        for (const auto& r : res) out.insert(out.end(), r.logits.begin(), r.logits.end());
      };
      step(*p, {SlotRows{0, 0, std::vector<int32_t>(prompt_.begin(), prompt_.begin() + 60), true, false, {}}});
      for (uint32_t i = 0; i < 3; ++i) step(*p, {SlotRows{0, 60 + i, {prompt_[i]}, true, false, {}}});
      auto image = p->stages()[0]->save_slot(0, false);
      ASSERT_TRUE(image) << image.error().message;
      step(*p, {SlotRows{0, 63, std::vector<int32_t>(prompt_.begin() + 70, prompt_.begin() + 90), true, false, {}}});
      ASSERT_FALSE(p->stages()[0]->restore_slot(0, image.value()));
      const std::vector<int32_t> rewrite(prompt_.begin() + 100, prompt_.begin() + 130);
      take(step(*p, {SlotRows{0, 63, rewrite, true, true, {}}}));
      auto rows = p->stages()[0]->save_slot(0, true);
      ASSERT_TRUE(rows) << rows.error().message;
      ASSERT_FALSE(p->stages()[0]->restore_slot(1, rows.value()));
      const std::vector<int32_t> more(prompt_.begin() + 20, prompt_.begin() + 40);
      take(step(*p, {SlotRows{1, 93, more, true, true, {}}}));
      take(step(*p, {SlotRows{1, 113, {prompt_[5]}, true, false, {}}}));
    }
    ASSERT_EQ(want.size(), got.size());
    EXPECT_EQ(want, got) << config::kv_type_name(t);
  }
}

TEST_F(KvWindowTest, AWindowSmallerThanOneRowsSelectionIsRefused) {
  CudaStageOptions go;
  go.kv_resident = 8;  // one query row selects up to 12
  go.max_context = 512;
  auto s = CudaStage::from_weights(*weights_, {0, hp_.n_layers}, go);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("--kv-resident 8"), std::string::npos) << s.error().message;
}

}  // namespace
}  // namespace ferry::gpu
#endif
