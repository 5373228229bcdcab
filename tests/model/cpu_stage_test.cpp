// CPU stages on a random model written with GgufWriter: prefill in chunks of any size and decode one
// token at a time give the logits of one pass over the whole sequence; several slots in one step give
// what each gives alone; the model split into 2 or 3 stages gives exactly the logits of one stage;
// a slot's state saved and restored continues as if never saved; the step contract is enforced.
// (Agreement with transformers itself is the reference fixtures' job: tests/python/test_eval_ref.py.)
#include "model/cpu/cpu_stage.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "model/pipeline.hpp"
#include "tests/model/random_model.hpp"

namespace ferry::model {
namespace {

Glm5Hparams tiny() { return testing::five_layer_hparams(); }

class CpuStageTest : public ::testing::Test {
 protected:
  std::filesystem::path path_ = testing::temp_model_path("cpu_stage_test");

  void SetUp() override {
    const Glm5Hparams hp = tiny();
    ASSERT_TRUE(hp.validate().empty());
    // Matrices as F16 (the dequantizing product), small state as F32 (read at load).
    ASSERT_TRUE(testing::write_random_model(hp, GgmlType::F16, path_, 7));
    auto w = Glm5Weights::load(path_);
    ASSERT_TRUE(w) << w.error().message;
    weights_ = std::move(w.value());
    pipeline_ = split({});
    std::mt19937 rng(9);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(tiny().vocab_size) - 1);
    for (int i = 0; i < 75; ++i) prompt_.push_back(tok(rng));
  }
  void TearDown() override {
    pipeline_.reset();
    weights_.reset();
    std::filesystem::remove(path_);
  }

  // The model as stages starting at `cuts` (none: one stage).
  std::unique_ptr<Pipeline> split(const std::vector<uint32_t>& cuts, config::KvFormats kv = {}) {
    std::vector<LayerRange> ranges;
    uint32_t first = 0;
    for (uint32_t c : cuts) ranges.push_back({first, c}), first = c;
    ranges.push_back({first, tiny().n_layers});
    CpuStageOptions o;
    o.max_slots = 3;
    o.kv = kv;
    auto p = Pipeline::make(make_cpu_stages(weights_, ranges, 2, o));
    EXPECT_TRUE(p) << (p ? "" : p.error().message);
    return p ? std::move(p.value()) : nullptr;
  }

  // Logits of every position of `tokens` fed to `slot` in chunks of `chunk`.
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

  std::shared_ptr<const Glm5Weights> weights_;
  std::unique_ptr<Pipeline> pipeline_;
  std::vector<int32_t> prompt_;
};

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

TEST_F(CpuStageTest, ChunkedPrefillAndDecodeEqualOnePass) {
  const std::vector<float> whole = run(*pipeline_, 0, prompt_, prompt_.size());
  ASSERT_EQ(whole.size(), prompt_.size() * tiny().vocab_size);
  float spread = 0;
  for (float x : whole) spread = std::max(spread, std::abs(x));
  EXPECT_GT(spread, 0.5f);  // the model computes something
  for (size_t chunk : {1u, 5u, 17u, 64u}) {
    EXPECT_LT(max_diff(whole, run(*pipeline_, 0, prompt_, chunk)), 2e-5f) << "chunk " << chunk;
  }
}

TEST_F(CpuStageTest, SplitIntoStagesGivesExactlyTheLogitsOfOneStage) {
  const std::vector<float> one = run(*pipeline_, 0, prompt_, 17);
  for (const std::vector<uint32_t>& cuts : {std::vector<uint32_t>{2}, {1, 3}, {1, 2, 3}}) {
    auto p = split(cuts);
    ASSERT_TRUE(p);
    ASSERT_EQ(p->stages().size(), cuts.size() + 1);
    EXPECT_EQ(one, run(*p, 1, prompt_, 17)) << cuts.size() + 1 << " stages";
    EXPECT_GT(p->stages().front()->counters().handoff_bytes, 0u);
  }
}

TEST_F(CpuStageTest, ASplitThatSeparatesASharedIndexerFromItsSourceIsRefused) {
  CpuStageOptions o;
  auto p = Pipeline::make(make_cpu_stages(weights_, {{0, 4}, {4, 5}}, 1, o));
  ASSERT_FALSE(p);
  EXPECT_NE(p.error().message.find("layer 4 reuses the DSA selection of layer 3"), std::string::npos) << p.error().message;
}

TEST_F(CpuStageTest, SlotsInOneStepEqualSlotsAlone) {
  const std::vector<int32_t> a(prompt_.begin(), prompt_.begin() + 40), b(prompt_.begin() + 10, prompt_.end());
  const std::vector<float> alone_a = run(*pipeline_, 0, a, a.size()), alone_b = run(*pipeline_, 1, b, b.size());
  SlotRows ra, rb;
  ra.slot = 1, ra.tokens = a, ra.logits_all = true, ra.sample = false;
  rb.slot = 2, rb.tokens = b, rb.logits_all = true, rb.sample = false;
  auto res = pipeline_->step({ra, rb});
  ASSERT_TRUE(res);
  EXPECT_LT(max_diff(alone_a, (*res)[0].logits), 2e-5f);
  EXPECT_LT(max_diff(alone_b, (*res)[1].logits), 2e-5f);
  // Then one decode row each, batched.
  ra.start = static_cast<uint32_t>(a.size()), ra.tokens = {5};
  rb.start = static_cast<uint32_t>(b.size()), rb.tokens = {6};
  res = pipeline_->step({ra, rb});
  ASSERT_TRUE(res);
  std::vector<int32_t> a5(a), b6(b);
  a5.push_back(5), b6.push_back(6);
  const std::vector<float> one_a = run(*pipeline_, 0, a5, a5.size()), one_b = run(*pipeline_, 0, b6, b6.size());
  const size_t V = tiny().vocab_size;
  EXPECT_LT(max_diff(std::vector<float>(one_a.end() - V, one_a.end()), (*res)[0].logits), 2e-5f);
  EXPECT_LT(max_diff(std::vector<float>(one_b.end() - V, one_b.end()), (*res)[1].logits), 2e-5f);
}

TEST_F(CpuStageTest, RestoreThenContinueEqualsNeverSaved) {
  const std::vector<int32_t> head(prompt_.begin(), prompt_.begin() + 30), tail(prompt_.begin() + 30, prompt_.end());
  auto p = split({2});
  ASSERT_TRUE(p);
  run(*p, 0, head, 7);
  auto at_30 = p->save_slot(0, /*with_rows=*/false);
  auto whole_30 = p->save_slot(0, /*with_rows=*/true);
  ASSERT_TRUE(at_30 && whole_30);
  EXPECT_EQ(at_30->size(), 2u);
  const std::vector<float> never = run(*p, 0, tail, 9, 30);  // never saved: straight on from 30
  // Back to 30 on the same slot (its rows up to 30 are still there), then the same tokens again.
  ASSERT_FALSE(p->restore_slot(0, at_30.value()));
  EXPECT_EQ(never, run(*p, 0, tail, 9, 30));
  // The whole state, rows included, moved into another slot.
  ASSERT_FALSE(p->restore_slot(2, whole_30.value()));
  EXPECT_EQ(never, run(*p, 2, tail, 9, 30));
  // An image without rows cannot go into a slot that does not hold them.
  const Status e = p->restore_slot(1, at_30.value());
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, ErrorCode::invalid_plan);
}

// The indexer's keys and gates travel as the incomplete pool's rows only, in every image (with rows or
// without): 30 tokens with kpool 4 carry 2 rows of each, 28 none. A checkpoint without rows taken mid
// pool goes back into its slot after the slot ran far past it, and a slot restored from rows (holding
// only that tail of keys) saves again and continues: each as if never saved.
TEST_F(CpuStageTest, ImagesCarryTheIncompletePoolsKeysAndRestoreMidPool) {
  const uint32_t kp = tiny().index_kpool;
  ASSERT_EQ(kp, 4u);
  auto p = split({2});
  ASSERT_TRUE(p);
  const SlotStateLayout& layout = p->stages().back()->state_layout();
  uint64_t keys_at_30 = 0, keys_at_28 = 0, pools_at_30 = 0;
  for (const StatePartSpec& part : layout.parts()) {
    if (part.part == StatePart::index_key || part.part == StatePart::index_gate) {
      EXPECT_EQ(part.unit, StateUnit::tail);
      keys_at_30 += layout.part_floats(part, 30, 0), keys_at_28 += layout.part_floats(part, 28, 0);
    }
    if (part.part == StatePart::pool_key) pools_at_30 += layout.part_floats(part, 30, 0);
  }
  EXPECT_GT(keys_at_30, 0u);
  EXPECT_EQ(keys_at_28, 0u);
  EXPECT_EQ(keys_at_30 % (30 % kp), 0u);
  EXPECT_EQ(layout.image_floats(30, 0, false), layout.image_floats(0, 0, false) + keys_at_30);
  EXPECT_GT(pools_at_30, 0u);

  const std::vector<int32_t> head(prompt_.begin(), prompt_.begin() + 30), tail(prompt_.begin() + 30, prompt_.end());
  run(*p, 0, head, 7);
  auto at_30 = p->save_slot(0, false);
  auto whole_30 = p->save_slot(0, true);
  ASSERT_TRUE(at_30 && whole_30);
  const std::vector<float> never = run(*p, 0, tail, 9, 30);
  auto whole_75 = p->save_slot(0, true);
  ASSERT_TRUE(whole_75);
  // Slot 0 ran to 75; back to 30 without rows.
  ASSERT_FALSE(p->restore_slot(0, at_30.value()));
  EXPECT_EQ(never, run(*p, 0, tail, 9, 30));
  // Slot 1 from rows, 5 tokens on (35: mid pool again), saved and restored into slot 2.
  ASSERT_FALSE(p->restore_slot(1, whole_30.value()));
  const std::vector<int32_t> five(tail.begin(), tail.begin() + 5), rest(tail.begin() + 5, tail.end());
  run(*p, 1, five, 5, 30);
  auto whole_35 = p->save_slot(1, true);
  ASSERT_TRUE(whole_35);
  ASSERT_FALSE(p->restore_slot(2, whole_35.value()));
  const size_t V = tiny().vocab_size;
  const std::vector<float> never_rest(never.begin() + 5 * V, never.end());
  EXPECT_LT(max_diff(never_rest, run(*p, 2, rest, 6, 35)), 2e-5f);
  EXPECT_LT(max_diff(never_rest, run(*p, 1, rest, 40, 35)), 2e-5f);
  // What slot 2 holds at 75 (its pools made from keys that came through two images) is slot 0's.
  auto again_75 = p->save_slot(2, true);
  ASSERT_TRUE(again_75);
  for (size_t i = 0; i < whole_75->size(); ++i) {
    EXPECT_EQ((*whole_75)[i].tokens, (*again_75)[i].tokens);
    EXPECT_LT(max_diff((*whole_75)[i].data, (*again_75)[i].data), 2e-5f) << "stage " << i;
  }
}

// With f16 or int8 rows (latents and indexer rows) the state image holds the rows as stored: a restored
// slot continues bit for bit as if never saved, and the image of an int8 latent row is its codes and
// its scale.
TEST_F(CpuStageTest, CompactKvRowsRestoreExactly) {
  const std::vector<int32_t> head(prompt_.begin(), prompt_.begin() + 30), tail(prompt_.begin() + 30, prompt_.end());
  const std::vector<float> f32 = run(*split({2}), 0, prompt_, 75);
  for (config::KvType t : {config::KvType::f16, config::KvType::int8}) {
    auto p = split({2}, {t, t});
    ASSERT_TRUE(p);
    const std::vector<float> whole = run(*p, 0, prompt_, 75);
    EXPECT_NE(whole, f32) << config::kv_type_name(t);  // the format is in use
    ASSERT_FALSE(p->reset_slot(0));
    run(*p, 0, head, 7);
    auto image = p->save_slot(0, /*with_rows=*/true);
    ASSERT_TRUE(image);
    const SlotStateImage& last = image->back();
    const SlotStateLayout& layout = p->stages().back()->state_layout();
    for (const StatePartSpec& part : layout.parts()) {
      if (part.part == StatePart::latent) {
        EXPECT_EQ(part.width, config::kv_image_width(t, tiny().kv_lora_rank));
      }
    }
    EXPECT_EQ(last.data.size(), layout.image_floats(last.tokens, last.mtp_tokens, true));
    const std::vector<float> never = run(*p, 0, tail, 9, 30);
    ASSERT_FALSE(p->restore_slot(2, image.value()));
    EXPECT_EQ(never, run(*p, 2, tail, 9, 30)) << config::kv_type_name(t);
  }
}

TEST_F(CpuStageTest, GreedyStepSamplesTheArgmaxAndStartZeroStartsOver) {
  SlotRows r;
  r.slot = 0;
  r.tokens = prompt_;
  r.sample = true;
  auto first = pipeline_->step({r});
  ASSERT_TRUE(first);
  EXPECT_TRUE((*first)[0].logits.empty());  // sampled rows return no logits unless asked
  r.sample = false;
  auto again = pipeline_->step({r});  // start 0 again: the slot starts over
  ASSERT_TRUE(again);
  const std::span<const float> last((*again)[0].logits);
  int32_t best = 0;
  for (size_t i = 1; i < last.size(); ++i) best = last[i] > last[best] ? static_cast<int32_t>(i) : best;
  EXPECT_EQ((*first)[0].sampled, best);
}

TEST_F(CpuStageTest, StepContractViolationsAreInvalidPlans) {
  auto expect_invalid = [&](const std::vector<SlotRows>& rows) {
    auto res = pipeline_->step(rows);
    ASSERT_FALSE(res);
    EXPECT_EQ(res.error().code, ErrorCode::invalid_plan) << res.error().message;
  };
  SlotRows r;
  r.slot = 0;
  r.start = 3;  // the slot holds nothing
  r.tokens = {1};
  expect_invalid({r});
  r.slot = 9;
  r.start = 0;
  expect_invalid({r});
  r.slot = 0;
  expect_invalid({r, r});
  r.tokens = {static_cast<int32_t>(tiny().vocab_size)};
  expect_invalid({r});
}

TEST_F(CpuStageTest, MtpInChunksEqualsOnePass) {
  ThreadPool pool(2);
  Glm5Forward m(*weights_, pool);
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
