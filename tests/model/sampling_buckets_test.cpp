// The bucket walk of model/cpu/sampling_buckets.hpp (the device sampler's way for rows of ties) against
// model::sample_token: over a value histogram built here from each row, whenever the walk holds, its
// token must be the CPU rule's; it must hold on rows of ties at the usual settings (else the device
// path would never be taken), and planning without keys must give the same answer as the walk.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "model/cpu/sampler.hpp"
#include "model/cpu/sampling_buckets.hpp"
#include "tests/model/host_buckets.hpp"
#include "tests/model/sampling_cases.hpp"

namespace ferry::model::sampling {
namespace {

// The walk's token for (row, p, position), or -1 where it does not hold; checks it against the rule.
// `ex` is built from `row` at p.temperature.
int32_t walk_token(HostBuckets& ex, const std::vector<float>& row, const SamplingParams& p, uint64_t position,
                   const std::string& name) {
  ex.set_min_p(p.min_p);
  const auto vocab = static_cast<uint32_t>(row.size());
  const uint64_t bits = draw_bits(p.seed, position);
  const int found = ex.found();
  const BucketDraw plan = bucket_draw(ex, vocab, p.top_k, p.top_p, p.min_p, bits, false);
  EXPECT_EQ(ex.found(), found);  // a plan finds no keys
  const BucketDraw d = bucket_draw(ex, vocab, p.top_k, p.top_p, p.min_p, bits, true);
  EXPECT_EQ(plan.ok, d.ok) << name;
  if (!d.ok) return -1;
  const auto token = static_cast<int32_t>(ex.keys().id(d.key));
  EXPECT_EQ(token, sample_token(row, p, position))
      << name << " vocab " << vocab << " T " << p.temperature << " top_k " << p.top_k << " top_p " << p.top_p
      << " min_p " << p.min_p << " seed " << p.seed << " position " << position;
  return token;
}

TEST(SamplingBuckets, UnitsToReachIsTheCeilingOfTheQuotient) {
  EXPECT_EQ(units_to_reach(1, 1), 1u);
  EXPECT_EQ(units_to_reach(7, 1), 7u);
  EXPECT_EQ(units_to_reach(kTopWeight, kTopWeight), 1u);
  EXPECT_EQ(units_to_reach(u128{kTopWeight} + 1, kTopWeight), 2u);
  const uint64_t w = 0x5a3c96e1f00d1234ull;
  for (uint64_t i : {1ull, 2ull, 3ull, 1000ull, 154880ull, 2147483647ull}) {
    EXPECT_EQ(units_to_reach(u128{i} * w, w), i);
    EXPECT_EQ(units_to_reach(u128{i} * w + 1, w), i + 1);
    EXPECT_EQ(units_to_reach(u128{i} * w - 1, w), i);
  }
}

// Every row kind and the large parameter grid at small vocabularies: wherever the walk holds, the rule's
// token; on the ties row it holds for most settings.
TEST(SamplingBuckets, WalkDrawsTheRuleTokenOnEveryRowKind) {
  for (uint32_t vocab : {97u, 5000u}) {
    const auto rows = testing::sampling_rows(vocab, vocab + 3);
    const auto params = testing::sampling_params(vocab, true);
    for (const auto& [name, row] : rows) {
      size_t held = 0, drawn = 0;
      float built_for = 0.0f;
      std::unique_ptr<HostBuckets> ex;
      for (const SamplingParams& p : params) {
        if (p.temperature <= 0.0f) continue;
        if (!ex || p.temperature != built_for) {
          ex = std::make_unique<HostBuckets>(row, p.temperature);
          built_for = p.temperature;
        }
        ++drawn;
        held += walk_token(*ex, row, p, drawn % 2 == 0 ? 3u : 40961u, name) >= 0;
      }
      if (name == "ties" || name == "flat" || name == "all-masked") {
        EXPECT_GT(held, drawn / 2) << name << " vocab " << vocab;
      }
    }
  }
}

// Rows of the GLM vocabulary built for the walk: one value over many of the device's blocks, a cut
// exactly at the end of a run of one value and one past it, min-p with ties, and the test rows of ties.
TEST(SamplingBuckets, WalkHoldsOnTiesOfTheGlmVocabulary) {
  const uint32_t vocab = 154880;
  std::mt19937 rng(41);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::pair<std::string, std::vector<float>>> rows;
  auto add = [&](std::string name, auto make) {
    std::vector<float> r(vocab);
    for (uint32_t i = 0; i < vocab; ++i) r[i] = make(i);
    rows.emplace_back(std::move(name), std::move(r));
  };
  add("ties", [&](uint32_t) { return std::round(2.0f * normal(rng)) / 2.0f; });
  add("one value over half", [&](uint32_t i) { return i % 2 == 0 ? 1.0f : -8.0f - std::floor(4.0f * std::abs(normal(rng))); });
  add("two values", [&](uint32_t i) { return i % 3 == 0 ? 2.0f : i % 3 == 1 ? 1.5f : -INFINITY; });
  add("flat", [&](uint32_t) { return 0.25f; });
  // the top 51,627 ids (i % 3 == 0) make one value: top-k at, below and past the end of that run
  const uint32_t run = (vocab + 2) / 3;
  struct Cut {
    uint32_t top_k;
    float top_p, min_p;
  };
  const Cut cuts[] = {{0, 0.95f, 0.0f}, {40, 1.0f, 0.0f}, {run, 1.0f, 0.0f}, {run - 1, 1.0f, 0.0f}, {run + 1, 1.0f, 0.0f},
                      {run + 1, 0.7f, 0.0f}, {0, 1.0f, 0.05f}, {0, 0.9f, 0.05f}, {0, 1.0f, 0.7f}, {0, 1.0f, 0.0f},
                      {0, 1e-3f, 0.0f}, {2 * run, 0.95f, 0.1f}};
  for (const auto& [name, row] : rows) {
    size_t held = 0, drawn = 0;
    for (float t : {0.4f, 1.0f}) {
      HostBuckets ex(row, t);
      for (const Cut& c : cuts) {
        for (uint64_t s = 0; s < 2; ++s) {
          SamplingParams p;
          p.temperature = t;
          p.top_k = c.top_k;
          p.top_p = c.top_p;
          p.min_p = c.min_p;
          p.seed = 0x9e3779b97f4a7c15ull * (s + 1) + c.top_k;
          ++drawn;
          held += walk_token(ex, row, p, 100 + s, name) >= 0;
        }
      }
    }
    std::printf("%-20s the walk holds for %zu of %zu draws\n", name.c_str(), held, drawn);
    EXPECT_EQ(held, drawn) << name;  // every bucket a cut can reach holds one value
  }
}

}  // namespace
}  // namespace ferry::model::sampling
