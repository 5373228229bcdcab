// Speculative decoding on CUDA stages (gpu/mtp_block.hpp, gpu/verify_keep.hpp) against the CPU
// reference on a random f32 model with an MTP block: the block's logits of every entry equal the CPU
// block's over the same sequence (prefilled whole, in chunks, one row a step); its drafts equal the
// CPU stage's drafts step for step (K = 1 and 3, one stage and two: the last stage then embeds the
// drafts with a copy of the embedding); greedy tokens with drafts to verify (the MTP's, and planted
// right and wrong ones so that every accept and reject path is taken) equal plain greedy decoding on
// CUDA, with 1 and 3 slots and a chunked prefill in the same steps; sampled rows draw the tokens of
// plain sampling with the same seed; drafts and verify rows a stage cannot take are invalid plans.
#if FERRY_HAVE_CUDA
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpu/cuda_stage.hpp"
#include "gpu/mtp_block.hpp"
#include "model/cpu/cpu_stage.hpp"
#include "model/cpu/sampler.hpp"
#include "model/glm5/glm5_weights.hpp"
#include "model/pipeline.hpp"
#include "model/speculative.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/model/random_model.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::have_device;
using model::GgmlType;
using model::Glm5Hparams;
using model::LayerRange;
using model::Pipeline;
using model::SamplingParams;
using model::SlotResult;
using model::SlotRows;
using model::SpecCounts;
using model::SpecDecoder;

Glm5Hparams mtp_shape() {
  Glm5Hparams hp = ferry::testing::tiny_gpu_shape(32);
  hp.n_nextn_layers = 1;  // layer 5: a DSA layer with a full indexer and an MoE FFN
  hp.indexer_full = {true, true, true, true, false};
  return hp;
}

// Drafts to plant: given the tokens confirmed so far (the last one just drawn), the drafts to verify.
using Oracle = std::function<std::vector<int32_t>(const std::vector<int32_t>& out)>;

// Right drafts but about a third, which are wrong (the true next token + 1), by a hash of the position.
Oracle planted(const std::vector<int32_t>& truth, uint32_t k) {
  return [&truth, k](const std::vector<int32_t>& out) {
    std::vector<int32_t> d;
    for (uint32_t j = 0; j < k && out.size() + j < truth.size(); ++j) {
      const size_t at = out.size() + j;
      const bool wrong = ((at * 2654435761u) >> 7) % 3 == 0;
      d.push_back(wrong ? (truth[at] + 1) % static_cast<int32_t>(mtp_shape().vocab_size) : truth[at]);
    }
    return d;
  };
}

struct SpecRun {
  std::vector<int32_t> tokens;
  std::vector<std::vector<int32_t>> drafts;  // the stage's drafts after each step
  SpecCounts counts;
};

class MtpCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
    hp_ = mtp_shape();
    ASSERT_TRUE(hp_.validate().empty()) << hp_.validate().front();
    path_ = testing::temp_model_path("mtp_cuda_test");
    ASSERT_TRUE(testing::write_random_model(hp_, GgmlType::F32, path_, 11));
    auto w = model::Glm5Weights::load(path_);
    ASSERT_TRUE(w) << w.error().message;
    weights_ = std::move(w.value());
    std::mt19937 rng(5);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(hp_.vocab_size) - 1);
    for (int p = 0; p < 3; ++p) {
      prompts_.emplace_back();
      for (int i = 0; i < 23 + 9 * p; ++i) prompts_.back().push_back(tok(rng));
    }
  }
  void TearDown() override {
    weights_.reset();
    if (!path_.empty()) std::filesystem::remove(path_);
  }

  std::unique_ptr<Pipeline> cpu(bool mtp) {
    model::CpuStageOptions o;
    o.max_slots = 3;
    o.max_context = 512;
    o.mtp = mtp;
    auto p = Pipeline::make(model::make_cpu_stages(weights_, {{0, hp_.n_layers}}, 2, o));
    EXPECT_TRUE(p) << (p ? "" : p.error().message);
    return p ? std::move(p.value()) : nullptr;
  }
  // CUDA stages cut at `cuts` on device 0.
  std::unique_ptr<Pipeline> gpu(bool mtp, const std::vector<uint32_t>& cuts = {}) {
    std::vector<std::shared_ptr<model::Stage>> stages;
    uint32_t first = 0;
    std::vector<uint32_t> ends(cuts);
    ends.push_back(hp_.n_layers);
    for (uint32_t end : ends) {
      CudaStageOptions o;
      o.max_slots = 3;
      o.max_context = 512;
      o.max_step_rows = 96;
      o.mtp = mtp;
      auto s = CudaStage::from_weights(*weights_, LayerRange{first, end}, o);
      EXPECT_TRUE(s) << (s ? "" : s.error().message);
      if (!s) return nullptr;
      stages.push_back(std::move(s.value()));
      first = end;
    }
    auto p = Pipeline::make(std::move(stages));
    EXPECT_TRUE(p) << (p ? "" : p.error().message);
    return p ? std::move(p.value()) : nullptr;
  }

  static SlotResult step1(Pipeline& p, const SlotRows& r) {
    auto res = p.step({r});
    EXPECT_TRUE(res) << res.error().message;
    return res ? (*res)[0] : SlotResult{};
  }

  // Plain decoding: the prompt in one step, then one row a step (replayed from graphs on CUDA).
  static std::vector<int32_t> plain(Pipeline& p, uint32_t slot, const std::vector<int32_t>& prompt, size_t n,
                                    const SamplingParams& sp = {}) {
    SlotRows r;
    r.slot = slot;
    r.tokens = prompt;
    r.sampling = sp;
    std::vector<int32_t> out{step1(p, r).sampled};
    while (out.size() < n) {
      r.start = static_cast<uint32_t>(prompt.size() + out.size() - 1);
      r.tokens = {out.back()};
      out.push_back(step1(p, r).sampled);
    }
    return out;
  }

  // K drafts a step (the MTP's, or the oracle's), the prompt prefilled in chunks of `chunk`.
  static SpecRun speculative(Pipeline& p, uint32_t slot, const std::vector<int32_t>& prompt, size_t n, uint32_t k,
                             size_t chunk, const Oracle& oracle, const SamplingParams& sp = {}) {
    SpecRun run;
    SlotResult first;
    for (size_t at = 0; at < prompt.size(); at += chunk) {
      SlotRows r;
      r.slot = slot;
      r.start = static_cast<uint32_t>(at);
      r.tokens.assign(prompt.begin() + at, prompt.begin() + std::min(prompt.size(), at + chunk));
      r.sample = at + chunk >= prompt.size();
      r.draft = r.sample ? k : 0;
      r.sampling = sp;
      first = step1(p, r);
    }
    run.tokens = {first.sampled};
    run.drafts.push_back(first.drafts);
    SpecDecoder dec(static_cast<uint32_t>(prompt.size()), first.sampled, oracle ? oracle(run.tokens) : first.drafts);
    while (run.tokens.size() < n) {
      const SlotRows r = dec.rows(slot, sp, k);
      SlotResult res = step1(p, r);
      if (res.sampled < 0) break;
      run.drafts.push_back(res.drafts);
      if (oracle) {
        std::vector<int32_t> next(run.tokens);
        const size_t a = std::min(res.accepted, r.verify);
        next.insert(next.end(), r.tokens.end() - r.verify, r.tokens.end() - r.verify + static_cast<ptrdiff_t>(a));
        next.push_back(res.sampled);
        res.drafts = oracle(next);
      }
      for (int32_t t : dec.apply(r, res)) run.tokens.push_back(t);
    }
    run.counts = dec.counts();
    run.tokens.resize(std::min(run.tokens.size(), n));
    return run;
  }

  Glm5Hparams hp_;
  std::filesystem::path path_;
  std::shared_ptr<const model::Glm5Weights> weights_;
  std::vector<std::vector<int32_t>> prompts_;
};

TEST_F(MtpCudaTest, BlockLogitsEqualTheCpuBlockForEveryChunking) {
  const std::vector<int32_t>& seq = prompts_[2];
  // The CPU block over the whole sequence: entry t is the trunk's hidden state at t with token t + 1.
  model::ThreadPool pool(2);
  model::Glm5Forward m(*weights_, pool);
  model::SequenceState st(hp_);
  std::vector<float> h, mh;
  const model::ForwardRows rows{&st, seq};
  m.forward(std::span<const model::ForwardRows>(&rows, 1), h);
  m.mtp_forward(st, h.data(), std::span<const int32_t>(seq.data() + 1, seq.size() - 1), mh);
  const size_t V = hp_.vocab_size, entries = seq.size() - 1;
  std::vector<float> want(entries * V);
  m.mtp_logits(mh.data(), entries, want.data());

  for (const std::vector<uint32_t>& cuts : {std::vector<uint32_t>{}, std::vector<uint32_t>{2}}) {
    auto p = gpu(true, cuts);
    ASSERT_TRUE(p);
    auto* last = dynamic_cast<CudaStage*>(p->stages().back().get());
    ASSERT_NE(last, nullptr);
    ASSERT_TRUE(last->drafts());
    last->record_mtp_logits(true);
    for (size_t chunk : {seq.size(), size_t{7}, size_t{1}}) {
      ASSERT_FALSE(p->reset_slot(1));
      for (size_t at = 0; at < seq.size(); at += chunk) {
        SlotRows r;
        r.slot = 1;
        r.start = static_cast<uint32_t>(at);
        r.tokens.assign(seq.begin() + at, seq.begin() + std::min(seq.size(), at + chunk));
        r.sample = false;
        step1(*p, r);
      }
      const std::vector<float> got = last->take_mtp_logits();
      ASSERT_EQ(got.size(), want.size()) << "chunk " << chunk;
      double worst = 0;
      size_t top1 = 0;
      for (size_t e = 0; e < entries; ++e) {
        for (size_t i = 0; i < V; ++i) worst = std::max(worst, std::abs(double(got[e * V + i]) - want[e * V + i]));
        top1 += model::argmax_token({got.data() + e * V, V}) == model::argmax_token({want.data() + e * V, V});
      }
      EXPECT_LE(worst, 5e-3) << "chunk " << chunk << ", " << cuts.size() + 1 << " stage(s)";
      EXPECT_EQ(top1, entries) << "chunk " << chunk;
    }
  }
}

TEST_F(MtpCudaTest, DraftsEqualTheCpuStageDrafts) {
  auto c = cpu(true);
  ASSERT_TRUE(c);
  for (uint32_t k : {1u, 3u}) {
    const SpecRun want = speculative(*c, 0, prompts_[1], 24, k, 9, nullptr);
    for (const std::vector<uint32_t>& cuts : {std::vector<uint32_t>{}, std::vector<uint32_t>{2}}) {
      auto g = gpu(true, cuts);
      ASSERT_TRUE(g);
      const SpecRun got = speculative(*g, 0, prompts_[1], 24, k, 9, nullptr);
      const std::string what = "K " + std::to_string(k) + ", " + std::to_string(cuts.size() + 1) + " stage(s)";
      ASSERT_EQ(got.tokens, want.tokens) << what;
      // Each draft is an argmax of logits within float rounding of the CPU's: all but a near tie
      // agree (a wrong block agrees on about 1 in the vocabulary's 97).
      ASSERT_EQ(got.drafts.size(), want.drafts.size()) << what;
      size_t same = 0, all = 0;
      for (size_t i = 0; i < got.drafts.size(); ++i) {
        ASSERT_EQ(got.drafts[i].size(), want.drafts[i].size()) << what << ", step " << i;
        for (size_t j = 0; j < got.drafts[i].size(); ++j) same += got.drafts[i][j] == want.drafts[i][j], ++all;
      }
      EXPECT_GE(double(same), 0.95 * double(all)) << what << ": " << same << " of " << all << " drafts equal";
      EXPECT_GT(got.counts.drafted, 0u);
    }
  }
}

TEST_F(MtpCudaTest, GreedyWithDraftsEqualsPlainGreedy) {
  auto off = gpu(false);
  ASSERT_TRUE(off);
  const std::vector<int32_t> truth = plain(*off, 0, prompts_[0], 36);
  for (uint32_t k : {1u, 3u}) {
    for (const std::vector<uint32_t>& cuts : {std::vector<uint32_t>{}, std::vector<uint32_t>{3}}) {
      auto p = gpu(true, cuts);
      ASSERT_TRUE(p);
      const std::string what = "K " + std::to_string(k) + ", " + std::to_string(cuts.size() + 1) + " stage(s)";
      EXPECT_EQ(speculative(*p, 1, prompts_[0], 36, k, 64, nullptr).tokens, truth) << what;
      const SpecRun run = speculative(*p, 2, prompts_[0], 36, k, 7, planted(truth, k));
      EXPECT_EQ(run.tokens, truth) << what;
      EXPECT_GT(run.counts.accepted, 0u) << what;
      EXPECT_LT(run.counts.accepted, run.counts.drafted) << what;  // both paths taken
    }
  }
}

// The block's pass and its drafting replay from CUDA graphs once a shape repeats, with the tokens
// and drafts of the same stage run eagerly (graphs off).
TEST_F(MtpCudaTest, ThePassAndTheDraftsReplayFromGraphs) {
  for (uint32_t k : {1u, 3u}) {
    SpecRun runs[2];
    size_t graphs[2] = {};
    for (int on = 0; on < 2; ++on) {
      CudaStageOptions o;
      o.max_slots = 3;
      o.max_context = 512;
      o.max_step_rows = 96;
      o.mtp = true;
      o.graphs = on == 1;
      auto s = CudaStage::from_weights(*weights_, LayerRange{0, hp_.n_layers}, o);
      ASSERT_TRUE(s) << s.error().message;
      std::shared_ptr<CudaStage> stage = std::move(s.value());
      auto p = Pipeline::make(std::vector<std::shared_ptr<model::Stage>>{stage});
      ASSERT_TRUE(p) << p.error().message;
      runs[on] = speculative(*p.value(), 0, prompts_[1], 24, k, 64, nullptr);
      graphs[on] = stage->mtp_graphs();
    }
    const std::string what = "K " + std::to_string(k);
    EXPECT_EQ(graphs[0], 0u) << what;
    EXPECT_GE(graphs[1], 2u) << what;  // a pass's shape and a drafting's at least
    EXPECT_EQ(runs[1].tokens, runs[0].tokens) << what;
    EXPECT_EQ(runs[1].drafts, runs[0].drafts) << what;
    EXPECT_GT(runs[1].counts.drafted, 0u) << what;
  }
}

// Two slots decoding with drafts (the MTP's and planted ones) and a third prefilling in chunks, then
// decoding with drafts, all in the same steps.
TEST_F(MtpCudaTest, ThreeSlotsAndAChunkedPrefillKeepThePlainTokens) {
  auto off = gpu(false);
  ASSERT_TRUE(off);
  std::vector<std::vector<int32_t>> truth;
  for (uint32_t s = 0; s < 3; ++s) truth.push_back(plain(*off, s, prompts_[s], 20));
  for (uint32_t k : {1u, 3u}) {
    auto p = gpu(true);
    ASSERT_TRUE(p);
    std::vector<std::optional<SpecDecoder>> dec(3);
    std::vector<std::vector<int32_t>> out(3);
    const Oracle oracle0 = planted(truth[0], k);
    for (uint32_t s = 0; s < 2; ++s) {
      SlotRows r;
      r.slot = s;
      r.tokens = prompts_[s];
      r.draft = k;
      const SlotResult f = step1(*p, r);
      out[s] = {f.sampled};
      dec[s].emplace(static_cast<uint32_t>(prompts_[s].size()), f.sampled, s == 0 ? oracle0(out[s]) : f.drafts);
    }
    size_t at2 = 0;
    while (out[0].size() < 20 || out[1].size() < 20 || out[2].size() < 20) {
      std::vector<SlotRows> rows;
      for (uint32_t s = 0; s < 3; ++s) {
        if (dec[s]) rows.push_back(dec[s]->rows(s, {}, k));
      }
      if (!dec[2]) {
        SlotRows c;
        c.slot = 2;
        c.start = static_cast<uint32_t>(at2);
        const size_t n = std::min<size_t>(6, prompts_[2].size() - at2);
        c.tokens.assign(prompts_[2].begin() + at2, prompts_[2].begin() + at2 + n);
        c.sample = at2 + n == prompts_[2].size();
        c.draft = c.sample ? k : 0;
        rows.push_back(c);
        at2 += n;
      }
      auto res = p->step(rows);
      ASSERT_TRUE(res) << res.error().message;
      for (size_t i = 0; i < rows.size(); ++i) {
        const uint32_t s = rows[i].slot;
        SlotResult& r = (*res)[i];
        if (!dec[s]) {
          if (rows[i].sample) {
            out[s] = {r.sampled};
            dec[s].emplace(static_cast<uint32_t>(prompts_[s].size()), r.sampled, r.drafts);
          }
          continue;
        }
        if (s == 0) {
          std::vector<int32_t> next(out[0]);
          const size_t a = std::min(r.accepted, rows[i].verify);
          next.insert(next.end(), rows[i].tokens.end() - rows[i].verify,
                      rows[i].tokens.end() - rows[i].verify + static_cast<ptrdiff_t>(a));
          next.push_back(r.sampled);
          r.drafts = oracle0(next);
        }
        for (int32_t t : dec[s]->apply(rows[i], r)) out[s].push_back(t);
      }
    }
    for (uint32_t s = 0; s < 3; ++s) {
      out[s].resize(20);
      EXPECT_EQ(out[s], truth[s]) << "slot " << s << ", K " << k;
    }
    EXPECT_GT(dec[0]->counts().accepted, 0u);
    EXPECT_GT(dec[1]->counts().drafted, 0u);
  }
}

TEST_F(MtpCudaTest, SampledRowsWithDraftsDrawThePlainSampledTokens) {
  auto off = gpu(false);
  ASSERT_TRUE(off);
  auto p = gpu(true);
  ASSERT_TRUE(p);
  uint64_t accepted = 0, drafted = 0;
  for (uint64_t seed = 0; seed < 6; ++seed) {
    SamplingParams sp;
    sp.temperature = 0.9f;
    sp.top_k = 30;
    sp.top_p = 0.95f;
    sp.seed = seed;
    const std::vector<int32_t>& prompt = prompts_[seed % 3];
    const std::vector<int32_t> truth = plain(*off, 0, prompt, 12, sp);
    const SpecRun run = speculative(*p, 0, prompt, 12, 2, 64, planted(truth, 2), sp);
    EXPECT_EQ(run.tokens, truth) << seed;
    accepted += run.counts.accepted, drafted += run.counts.drafted;
    EXPECT_EQ(speculative(*p, 1, prompt, 12, 1, 9, nullptr, sp).tokens, truth) << seed;
  }
  EXPECT_GT(accepted, 0u);
  EXPECT_LT(accepted, drafted);
}

TEST_F(MtpCudaTest, DraftsAndVerifyRowsAStageCannotTakeAreInvalidPlans) {
  auto off = gpu(false);
  ASSERT_TRUE(off);
  SlotRows r;
  r.tokens = prompts_[0];
  r.draft = 1;
  auto res = off->step({r});
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code, ErrorCode::invalid_plan);
  EXPECT_NE(res.error().message.find("MTP"), std::string::npos) << res.error().message;
  r.draft = 0;
  r.verify = 1;
  res = off->step({r});
  ASSERT_FALSE(res);
  EXPECT_NE(res.error().message.find("--mtp"), std::string::npos) << res.error().message;
  auto p = gpu(true);
  ASSERT_TRUE(p);
  r.verify = 0;
  r.draft = kMaxCudaDrafts + 1;
  EXPECT_FALSE(p->step({r}));
  r.draft = 0;
  ASSERT_TRUE(p->step({r}));
  // A start other than 0 or the tokens held: only after a verify set, at its start.
  r.start = 3;
  r.tokens = {1};
  EXPECT_FALSE(p->step({r}));
}

}  // namespace
}  // namespace ferry::gpu
#endif
