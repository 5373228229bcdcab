// Speculative decoding on CPU stages (model/speculative.hpp): greedy tokens with drafts to verify equal
// plain greedy decoding token for token, whatever the drafts (the MTP block's, or planted right and
// wrong ones to take every accept and reject path), over 1 or 2 stages, K = 1 and 2, with several slots
// and a chunked prefill in the same steps; the MTP block's drafts through rollbacks equal its drafts
// from one pass over the kept sequence (its cache holds exactly the confirmed positions). Sampled:
// the same tokens as plain sampling with the same seed, and a draft accepted with its probability.
#include "model/speculative.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>

#include "model/cpu/cpu_stage.hpp"
#include "model/cpu/sampler.hpp"
#include "model/pipeline.hpp"
#include "tests/model/random_model.hpp"

namespace ferry::model {
namespace {

Glm5Hparams spec_model() {
  Glm5Hparams hp;
  hp.vocab_size = 61;
  hp.hidden_size = 32;
  hp.n_layers = 4;
  hp.n_nextn_layers = 1;
  hp.dense_ffn = 48;
  hp.moe_ffn = 16;
  hp.n_experts = 4;
  hp.n_experts_used = 2;
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
  hp.hc_mult = 2;
  hp.context_length = 1024;
  hp.layer_kinds = {LayerKind::kda, LayerKind::dsa, LayerKind::kda, LayerKind::dsa};
  hp.ffn_kinds = {FfnKind::dense, FfnKind::moe, FfnKind::dense, FfnKind::moe};
  hp.indexer_full = {true, true, true, true};
  return hp;
}

// Drafts to plant: given the tokens confirmed so far (the last one just drawn), the drafts to verify.
using Oracle = std::function<std::vector<int32_t>(const std::vector<int32_t>& out)>;

class SpeculativeTest : public ::testing::Test {
 protected:
  std::filesystem::path path_ = testing::temp_model_path("speculative_test");

  void SetUp() override {
    const Glm5Hparams hp = spec_model();
    ASSERT_TRUE(hp.validate().empty()) << hp.validate().front();
    ASSERT_TRUE(testing::write_random_model(hp, GgmlType::F32, path_, 11));
    auto w = Glm5Weights::load(path_);
    ASSERT_TRUE(w) << w.error().message;
    weights_ = std::move(w.value());
    std::mt19937 rng(5);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(hp.vocab_size) - 1);
    for (int p = 0; p < 3; ++p) {
      prompts_.emplace_back();
      for (int i = 0; i < 23 + 9 * p; ++i) prompts_.back().push_back(tok(rng));
    }
  }
  void TearDown() override {
    weights_.reset();
    std::filesystem::remove(path_);
  }

  std::unique_ptr<Pipeline> pipeline(const std::vector<LayerRange>& ranges, bool mtp) {
    CpuStageOptions o;
    o.max_slots = 3;
    o.mtp = mtp;
    auto p = Pipeline::make(make_cpu_stages(weights_, ranges, 2, o));
    EXPECT_TRUE(p) << (p ? "" : p.error().message);
    return p ? std::move(p.value()) : nullptr;
  }

  SlotResult step1(Pipeline& p, const SlotRows& r) {
    auto res = p.step({r});
    EXPECT_TRUE(res) << res.error().message;
    return res ? (*res)[0] : SlotResult{};
  }

  // Plain decoding (greedy by default): the prompt in one step, then one row a step.
  std::vector<int32_t> plain(const std::vector<int32_t>& prompt, size_t n, const SamplingParams& sp = {}) {
    auto p = pipeline({{0, spec_model().n_layers}}, false);
    SlotRows r;
    r.tokens = prompt;
    r.sampling = sp;
    std::vector<int32_t> out{step1(*p, r).sampled};
    while (out.size() < n) {
      r.start = static_cast<uint32_t>(prompt.size() + out.size() - 1);
      r.tokens = {out.back()};
      out.push_back(step1(*p, r).sampled);
    }
    return out;
  }

  // Greedy with K drafts a step (the MTP's, or the oracle's), prefill in chunks of `chunk`.
  std::vector<int32_t> speculative(Pipeline& p, uint32_t slot, const std::vector<int32_t>& prompt, size_t n,
                                   uint32_t k, size_t chunk, const Oracle& oracle, SpecCounts* counts = nullptr,
                                   const SamplingParams& sp = {}) {
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
    std::vector<int32_t> out{first.sampled};
    SpecDecoder dec(static_cast<uint32_t>(prompt.size()), first.sampled, oracle ? oracle(out) : first.drafts);
    while (out.size() < n) {
      const SlotRows r = dec.rows(slot, sp, k);
      SlotResult res = step1(p, r);
      if (res.sampled < 0) return out;
      const size_t a = std::min(res.accepted, r.verify);
      std::vector<int32_t> next(out);
      next.insert(next.end(), r.tokens.end() - r.verify, r.tokens.end() - r.verify + static_cast<ptrdiff_t>(a));
      next.push_back(res.sampled);
      if (oracle) res.drafts = oracle(next);
      for (int32_t t : dec.apply(r, res)) out.push_back(t);
      EXPECT_EQ(out, next);
    }
    if (counts) *counts = dec.counts();
    out.resize(n);
    return out;
  }

  std::shared_ptr<const Glm5Weights> weights_;
  std::vector<std::vector<int32_t>> prompts_;
};

// Right drafts but about a third, which are wrong (the reference's next token + 1), chosen by a hash of
// the position so that every pattern of accepted and rejected drafts comes up.
Oracle planted(const std::vector<int32_t>& truth, uint32_t k) {
  return [&truth, k](const std::vector<int32_t>& out) {
    std::vector<int32_t> d;
    for (uint32_t j = 0; j < k && out.size() + j < truth.size(); ++j) {
      const size_t at = out.size() + j;
      const bool wrong = ((at * 2654435761u) >> 7) % 3 == 0;
      d.push_back(wrong ? (truth[at] + 1) % static_cast<int32_t>(spec_model().vocab_size) : truth[at]);
    }
    return d;
  };
}

TEST_F(SpeculativeTest, PlantedDraftsGiveThePlainGreedyTokens) {
  const uint32_t L = spec_model().n_layers;
  const std::vector<int32_t> truth = plain(prompts_[0], 40);
  for (uint32_t k : {1u, 2u}) {
    for (const std::vector<LayerRange>& ranges :
         {std::vector<LayerRange>{{0, L}}, std::vector<LayerRange>{{0, 2}, {2, L}}}) {
      auto p = pipeline(ranges, true);
      SpecCounts c;
      EXPECT_EQ(speculative(*p, 1, prompts_[0], 34, k, 7, planted(truth, k), &c), std::vector<int32_t>(truth.begin(), truth.begin() + 34))
          << "K " << k << ", " << ranges.size() << " stage(s)";
      EXPECT_GT(c.accepted, 0u);
      EXPECT_LT(c.accepted, c.drafted);  // both paths taken
    }
  }
}

TEST_F(SpeculativeTest, MtpDraftsGiveThePlainGreedyTokens) {
  const std::vector<int32_t> truth = plain(prompts_[1], 30);
  auto p = pipeline({{0, spec_model().n_layers}}, true);
  SpecCounts c;
  EXPECT_EQ(speculative(*p, 0, prompts_[1], 30, 1, 64, nullptr, &c), truth);
  EXPECT_GT(c.drafted, 0u);
}

// The MTP block's drafts after rollbacks equal those of one pass over the kept sequence: the trunk's
// final hidden states of every position, each with the token after it, through the block.
TEST_F(SpeculativeTest, MtpDraftsAfterRollbacksEqualOnePass) {
  const std::vector<int32_t> truth = plain(prompts_[2], 20);
  auto p = pipeline({{0, spec_model().n_layers}}, true);
  const std::vector<int32_t> out = speculative(*p, 2, prompts_[2], 20, 1, 5, planted(truth, 1));
  ASSERT_EQ(out, truth);
  // One more step with the MTP's own draft asked for: its result's draft, against one pass.
  std::vector<int32_t> seq(prompts_[2]);
  seq.insert(seq.end(), out.begin(), out.end() - 1);
  SlotRows r;
  r.slot = 2;
  r.tokens = seq;
  r.draft = 1;
  auto fresh = pipeline({{0, spec_model().n_layers}}, true);
  const SlotResult res = step1(*fresh, r);
  ASSERT_EQ(res.sampled, out.back());
  ASSERT_EQ(res.drafts.size(), 1u);

  ThreadPool pool(2);
  Glm5Forward m(*weights_, pool);
  SequenceState st(spec_model());
  std::vector<float> h, mh;
  const ForwardRows rows{&st, seq};
  m.forward(std::span<const ForwardRows>(&rows, 1), h);
  std::vector<int32_t> next(seq.begin() + 1, seq.end());
  next.push_back(out.back());
  m.mtp_forward(st, h.data(), next, mh);
  std::vector<float> logits(spec_model().vocab_size);
  m.mtp_logits(mh.data() + mh.size() - spec_model().hidden_size, 1, logits.data());
  EXPECT_EQ(res.drafts[0], argmax_token(logits));
}

// Two slots decoding with drafts and a third prefilling in chunks, all in the same steps.
TEST_F(SpeculativeTest, SlotsAndAChunkedPrefillInOneStepKeepTheirTokens) {
  const std::vector<int32_t> t0 = plain(prompts_[0], 24), t1 = plain(prompts_[1], 24), t2 = plain(prompts_[2], 8);
  auto p = pipeline({{0, spec_model().n_layers}}, true);
  auto prefill = [&](uint32_t slot, const std::vector<int32_t>& prompt) {
    SlotRows r;
    r.slot = slot;
    r.tokens = prompt;
    r.draft = 1;
    return step1(*p, r);
  };
  const SlotResult f0 = prefill(0, prompts_[0]), f1 = prefill(1, prompts_[1]);
  SpecDecoder d0(static_cast<uint32_t>(prompts_[0].size()), f0.sampled, planted(t0, 1)({f0.sampled}));
  SpecDecoder d1(static_cast<uint32_t>(prompts_[1].size()), f1.sampled, f1.drafts);
  std::vector<int32_t> o0{f0.sampled}, o1{f1.sampled}, o2;
  size_t at2 = 0;
  while (o0.size() < 24 || o1.size() < 24) {
    std::vector<SlotRows> rows{d0.rows(0, {}, 1), d1.rows(1, {}, 1)};
    if (at2 < prompts_[2].size()) {
      SlotRows c;
      c.slot = 2;
      c.start = static_cast<uint32_t>(at2);
      const size_t n = std::min<size_t>(6, prompts_[2].size() - at2);
      c.tokens.assign(prompts_[2].begin() + at2, prompts_[2].begin() + at2 + n);
      c.sample = at2 + n == prompts_[2].size();
      rows.push_back(c);
      at2 += n;
    }
    auto res = p->step(rows);
    ASSERT_TRUE(res) << res.error().message;
    std::vector<int32_t> next(o0);
    const size_t a = std::min((*res)[0].accepted, rows[0].verify);
    next.insert(next.end(), rows[0].tokens.end() - rows[0].verify,
                rows[0].tokens.end() - rows[0].verify + static_cast<ptrdiff_t>(a));
    next.push_back((*res)[0].sampled);
    (*res)[0].drafts = planted(t0, 1)(next);
    for (int32_t t : d0.apply(rows[0], (*res)[0])) o0.push_back(t);
    for (int32_t t : d1.apply(rows[1], (*res)[1])) o1.push_back(t);
    if (rows.size() == 3 && rows[2].sample) o2.push_back((*res)[2].sampled);
  }
  o0.resize(24);
  o1.resize(24);
  EXPECT_EQ(o0, t0);
  EXPECT_EQ(o1, t1);
  ASSERT_EQ(o2.size(), 1u);
  EXPECT_EQ(o2[0], t2[0]);
}

// Sampled rows verify drafts by the same rule (accepted while each equals the draw at its position):
// with the same seed the tokens are exactly those of plain sampling, for the MTP's drafts and planted
// ones alike, over many seeds.
TEST_F(SpeculativeTest, SampledDecodingDrawsThePlainSampledTokens) {
  uint64_t accepted = 0, drafted = 0;
  for (uint64_t seed = 0; seed < 24; ++seed) {
    SamplingParams sp;
    sp.temperature = 0.9f;
    sp.top_k = 30;
    sp.top_p = 0.95f;
    sp.seed = seed;
    const std::vector<int32_t> truth = plain(prompts_[seed % 3], 12, sp);
    auto p = pipeline({{0, spec_model().n_layers}}, true);
    SpecCounts c;
    EXPECT_EQ(speculative(*p, 0, prompts_[seed % 3], 12, 1, 64, planted(truth, 1), &c, sp), truth) << seed;
    accepted += c.accepted, drafted += c.drafted;
    EXPECT_EQ(speculative(*p, 1, prompts_[seed % 3], 12, 2, 9, nullptr, nullptr, sp), truth) << seed;
  }
  EXPECT_GT(accepted, 0u);
  EXPECT_LT(accepted, drafted);
}

// The rule's acceptance of a one-token draft d is p(d), the sampling distribution's probability of d:
// over many seeds, the share of accepted drafts is within 4.5 standard deviations of softmax(l / T)[d]
// (the rule's weights are that softmax to 2^-63), for the likeliest token and a less likely one.
TEST_F(SpeculativeTest, AcceptanceOfADraftIsItsProbabilityUnderSampling) {
  const Glm5Hparams hp = spec_model();
  const std::vector<int32_t>& prompt = prompts_[1];
  auto p = pipeline({{0, hp.n_layers}}, true);
  SlotRows r;
  r.tokens = prompt;
  r.sample = false;  // the last row's logits: the distribution of the token after the prompt
  const std::vector<float> logits = step1(*p, r).logits;
  ASSERT_EQ(logits.size(), hp.vocab_size);
  // The draft verified is the token after x = the prompt's last: feed the prompt but its last token.
  const std::vector<int32_t> head(prompt.begin(), prompt.end() - 1);
  const float T = 1.3f;
  const float top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> prob(hp.vocab_size);
  double sum = 0;
  for (size_t i = 0; i < prob.size(); ++i) sum += prob[i] = std::exp((logits[i] - top) / T);
  for (double& x : prob) x /= sum;
  std::vector<size_t> order(prob.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return prob[a] > prob[b]; });
  for (size_t rank : {0u, 3u}) {
    const auto d = static_cast<int32_t>(order[rank]);
    auto q = pipeline({{0, hp.n_layers}}, true);
    SlotRows pre;
    pre.tokens = head;
    pre.sample = false;
    step1(*q, pre);
    const int n = 600;
    int accepted = 0;
    for (int seed = 0; seed < n; ++seed) {
      SlotRows v;
      v.start = static_cast<uint32_t>(head.size());  // the same start every time: the stage goes back
      v.tokens = {prompt.back(), d};
      v.verify = 1;
      v.sampling.temperature = T;
      v.sampling.seed = static_cast<uint64_t>(seed);
      const SlotResult res = step1(*q, v);
      accepted += static_cast<int>(res.accepted);
    }
    const double pd = prob[static_cast<size_t>(d)], sd = std::sqrt(pd * (1 - pd) / n);
    EXPECT_NEAR(static_cast<double>(accepted) / n, pd, 4.5 * sd) << "rank " << rank << ", p " << pd;
    EXPECT_GT(pd, 0.01);
  }
}

TEST_F(SpeculativeTest, BadSpeculativeRowsAreRefused) {
  auto off = pipeline({{0, spec_model().n_layers}}, false);
  SlotRows r;
  r.tokens = prompts_[0];
  r.draft = 1;
  auto res = off->step({r});
  ASSERT_FALSE(res);
  EXPECT_NE(res.error().message.find("MTP"), std::string::npos) << res.error().message;
  auto p = pipeline({{0, spec_model().n_layers}}, true);
  r.verify = static_cast<uint32_t>(r.tokens.size());  // no real token before the drafts
  EXPECT_FALSE(p->step({r}));
  r.verify = 1;
  r.sample = false;  // drafts to verify need a draw
  EXPECT_FALSE(p->step({r}));
  r.sample = true;
  r.verify = 0;
  ASSERT_TRUE(p->step({r}));
  // A start other than 0 or the tokens held: only after a verify set, at its start.
  r.start = 3;
  r.tokens = {1};
  EXPECT_FALSE(p->step({r}));
}

}  // namespace
}  // namespace ferry::model
