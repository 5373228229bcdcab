// Resuming from a prefix-cache checkpoint against a full recompute, for any backend: a prompt is
// prefilled into slot 0 in chunks, stopping at each checkpoint position to save every stage's state
// into its kv::CheckpointStore; slot 2 prefills the whole prompt from 0 (the reference). Each
// checkpoint is first restored in place (slot 0 still holds its rows) and the rest of the prompt
// prefilled there; then slot 0's rows are spilled and slot 0 given to another sequence, and each
// checkpoint is restored into slot 1, which held yet another sequence (its rows come from the spill).
// Logits of every resumed row must equal the reference's within `tolerance`, and greedy decoding
// must draw the same tokens.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "kv/checkpoint_store.hpp"
#include "model/pipeline.hpp"

namespace ferry::testing {

inline std::vector<float> prefill_logits(model::Pipeline& p, uint32_t slot, const std::vector<int32_t>& tokens,
                                         uint32_t from, uint32_t to, uint32_t chunk) {
  std::vector<float> all;
  for (uint32_t at = from; at < to; at += chunk) {
    model::SlotRows r;
    r.slot = slot;
    r.start = at;
    r.tokens.assign(tokens.begin() + at, tokens.begin() + std::min(to, at + chunk));
    r.logits_all = true;
    r.sample = false;
    auto res = p.step({r});
    EXPECT_TRUE(res) << res.error().message;
    if (!res) return all;
    all.insert(all.end(), (*res)[0].logits.begin(), (*res)[0].logits.end());
  }
  return all;
}

// Greedy tokens after the slot holds `at` positions: feeds `first`, then each token drawn.
inline std::vector<int32_t> greedy_tokens(model::Pipeline& p, uint32_t slot, uint32_t at, int32_t first, int n) {
  std::vector<int32_t> out;
  int32_t t = first;
  for (int i = 0; i < n; ++i) {
    auto res = p.step({model::SlotRows{slot, at++, {t}, false, true, {}}});
    EXPECT_TRUE(res) << res.error().message;
    if (!res) return out;
    t = (*res)[0].sampled;
    out.push_back(t);
  }
  return out;
}

inline void expect_resume_exact(model::Pipeline& p, const std::vector<int32_t>& prompt, uint32_t chunk,
                                const std::vector<uint32_t>& positions, double tolerance) {
  const auto n = static_cast<uint32_t>(prompt.size());
  const uint32_t vocab = p.hparams().vocab_size;
  std::vector<kv::CheckpointStore> stores(p.stages().size());
  ASSERT_FALSE(p.reset_slot(0));
  std::set<uint32_t> stops(positions.begin(), positions.end());
  uint32_t at = 0;
  for (uint32_t t : stops) {
    for (; at < t; at = std::min(t, at + chunk)) prefill_logits(p, 0, prompt, at, std::min(t, at + chunk), chunk);
    for (size_t s = 0; s < stores.size(); ++s) ASSERT_FALSE(stores[s].save(*p.stages()[s], 0, t, t));
  }

  ASSERT_FALSE(p.reset_slot(2));
  const std::vector<float> reference = prefill_logits(p, 2, prompt, 0, n, chunk);
  ASSERT_EQ(reference.size(), size_t{n} * vocab);
  const auto last = reference.end() - vocab;
  const auto first = static_cast<int32_t>(std::max_element(last, reference.end()) - last);
  const std::vector<int32_t> want = greedy_tokens(p, 2, n, first, 6);

  auto resume = [&](uint32_t slot, uint32_t t) {
    for (size_t s = 0; s < stores.size(); ++s) ASSERT_FALSE(stores[s].restore(*p.stages()[s], slot, t));
    const std::vector<float> resumed = prefill_logits(p, slot, prompt, t, n, chunk);
    ASSERT_EQ(resumed.size(), size_t{n - t} * vocab);
    double worst = 0;
    for (size_t i = 0; i < resumed.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(resumed[i] - reference[size_t{t} * vocab + i])));
    }
    EXPECT_LE(worst, tolerance);
    EXPECT_EQ(greedy_tokens(p, slot, n, first, 6), want);
  };
  for (auto t = stops.rbegin(); t != stops.rend(); ++t) {
    SCOPED_TRACE("resumed in place at " + std::to_string(*t) + " of " + std::to_string(n));
    resume(0, *t);
  }
  const std::vector<uint64_t> ids(stops.begin(), stops.end());
  for (size_t s = 0; s < stores.size(); ++s) ASSERT_FALSE(stores[s].spill(*p.stages()[s], 0, ids));
  const std::vector<int32_t> other(prompt.rbegin(), prompt.rend());
  ASSERT_FALSE(p.reset_slot(0));
  prefill_logits(p, 0, other, 0, n, chunk);  // slot 0 now holds another sequence's rows
  for (uint32_t t : stops) {
    SCOPED_TRACE("resumed from spilled rows at " + std::to_string(t) + " of " + std::to_string(n));
    ASSERT_FALSE(p.reset_slot(1));
    prefill_logits(p, 1, other, 0, 50, chunk);  // rows of another sequence the restore must replace
    resume(1, t);
  }
}

}  // namespace ferry::testing
