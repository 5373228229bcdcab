#include "model/cpu/sampler.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <span>
#include <vector>

#include "model/cpu/sampling_rule.hpp"
#include "tests/model/sampling_cases.hpp"

using namespace ferry::model;

TEST(Sampler, GreedyTiesGoToTheLowestId) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  SamplingParams p;
  EXPECT_EQ(sample_token(logits, p, 7), 1);
  EXPECT_EQ(argmax_token(logits), 1);
}

TEST(Sampler, SameSeedAndPositionGiveTheSameToken) {
  std::vector<float> logits(50);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(float(i));
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  for (uint64_t pos = 0; pos < 20; ++pos) EXPECT_EQ(sample_token(logits, p, pos), sample_token(logits, p, pos));
  // Different positions do not all draw the same token.
  std::vector<int32_t> seen;
  for (uint64_t pos = 0; pos < 40; ++pos) seen.push_back(sample_token(logits, p, pos));
  EXPECT_GT(std::set<int32_t>(seen.begin(), seen.end()).size(), 5u);
}

TEST(Sampler, FiltersLeaveOnlyTheBestToken) {
  const std::vector<float> logits = {1.0f, 5.0f, 0.0f, 4.9f};
  SamplingParams p;
  p.temperature = 1.0f;
  for (uint64_t pos = 0; pos < 30; ++pos) {
    p.top_k = 1;
    EXPECT_EQ(sample_token(logits, p, pos), 1);
    p.top_k = 0;
    p.top_p = 0.01f;
    EXPECT_EQ(sample_token(logits, p, pos), 1);
    p.top_p = 1.0f;
    p.min_p = 0.99f;
    EXPECT_EQ(sample_token(logits, p, pos), 1);
    p.min_p = 0.0f;
  }
}

TEST(Sampler, DrawsFollowTheDistribution) {
  // p = (0.5, 0.25, 0.25): frequencies over many positions within a few percent.
  const std::vector<float> logits = {std::log(2.0f), 0.0f, 0.0f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 9;
  int count[3] = {0, 0, 0};
  const int n = 20000;
  for (int pos = 0; pos < n; ++pos) ++count[sample_token(logits, p, pos)];
  EXPECT_NEAR(count[0] / double(n), 0.5, 0.02);
  EXPECT_NEAR(count[1] / double(n), 0.25, 0.02);
  EXPECT_NEAR(count[2] / double(n), 0.25, 0.02);
}

namespace {

using ferry::model::sampling::u128;

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

float order_value(float v) {
  v = std::isnan(v) ? -INFINITY : v;
  return v == 0.0f ? 0.0f : v;
}

// Token ids by logit, higher first, ties to the lower id.
std::vector<uint32_t> sorted_ids(std::span<const float> logits) {
  std::vector<uint32_t> order(logits.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return order_value(logits[a]) > order_value(logits[b]); });
  return order;
}

// The definition in model/cpu/sampler.hpp written out directly: sorted ids, prefix sums, a linear search.
int32_t reference_token(std::span<const float> logits, const std::vector<uint32_t>& order, const SamplingParams& p,
                        uint64_t position) {
  const size_t n = logits.size();
  auto value = [&](size_t i) { return order_value(logits[i]); };
  if (!(p.temperature > 0.0f)) return static_cast<int32_t>(order[0]);
  const ferry::model::sampling::WeightRule weight(value(order[0]), p.temperature);
  std::vector<uint64_t> w(n);
  for (size_t r = 0; r < n; ++r) w[r] = weight(value(order[r]));
  const size_t top_k = p.top_k > 0 && p.top_k < n ? p.top_k : n;
  size_t keep = top_k;
  if (p.top_p < 1.0f) {
    u128 total = 0;
    for (size_t r = 0; r < top_k; ++r) total += w[r];
    const uint64_t tp = p.top_p > 0.0f ? static_cast<uint64_t>(std::ldexp(double(p.top_p), 32)) : 0;
    u128 need = (tp * total + 0xffffffffu) >> 32;
    if (need == 0) need = 1;
    u128 cum = 0;
    for (size_t r = 0; r < top_k; ++r) {
      cum += w[r];
      if (cum >= need) {
        keep = r + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {
    const auto floor = static_cast<uint64_t>(std::ceil(std::ldexp(std::min(double(p.min_p), 1.0), 63)));
    for (size_t r = 1; r < keep; ++r) {
      if (w[r] < floor) {
        keep = r;
        break;
      }
    }
  }
  u128 total = 0;
  for (size_t r = 0; r < keep; ++r) total += w[r];
  const uint64_t bits = mix(mix(p.seed) ^ mix(position + 0x632be59bd9b4e019ull)) >> 11;
  // floor(bits * total / 2^53), with total = hi * 2^53 + lo
  const u128 hi = total >> 53, lo = total & ((u128{1} << 53) - 1);
  const u128 target = bits * hi + ((bits * lo) >> 53);
  u128 cum = 0;
  for (size_t r = 0; r < keep; ++r) {
    cum += w[r];
    if (cum > target) return static_cast<int32_t>(order[r]);
  }
  ADD_FAILURE() << "the running weight never passed the target";
  return -1;
}

void expect_reference_tokens(uint32_t vocab, bool many, int positions) {
  for (const auto& [name, row] : ferry::model::testing::sampling_rows(vocab, vocab)) {
    const std::vector<uint32_t> order = sorted_ids(row);
    for (const SamplingParams& p : ferry::model::testing::sampling_params(vocab, many)) {
      for (int i = 0; i < positions; ++i) {
        const uint64_t pos = 17 + 1000 * static_cast<uint64_t>(i);
        ASSERT_EQ(sample_token(row, p, pos), reference_token(row, order, p, pos))
            << name << " vocab " << vocab << " T " << p.temperature << " top_k " << p.top_k << " top_p " << p.top_p
            << " min_p " << p.min_p << " seed " << p.seed << " position " << pos;
      }
    }
  }
}

}  // namespace

TEST(Sampler, ArgmaxTreatsNanAsMinusInfinityAndMinusZeroAsZero) {
  EXPECT_EQ(argmax_token(std::vector<float>{NAN, 1.0f, 3.0f, 3.0f}), 2);
  EXPECT_EQ(argmax_token(std::vector<float>{NAN, NAN}), 0);
  EXPECT_EQ(argmax_token(std::vector<float>{-INFINITY, NAN, -INFINITY}), 0);
  EXPECT_EQ(argmax_token(std::vector<float>{-0.0f, 0.0f}), 0);
  EXPECT_EQ(argmax_token(std::vector<float>{-1.0f, INFINITY, 2.0f, INFINITY}), 1);
}

TEST(Sampler, ExpOfTheRuleIsWithinAFewUlpOfStdExp) {
  EXPECT_EQ(ferry::model::sampling::exp_nonpositive(0.0), 1.0);
  double worst = 0;
  for (int i = 0; i <= 450000; ++i) {
    const double x = -45.0 * i / 450000.0 - (i % 3) * 1e-9;
    if (x < -45.0) continue;
    const double e = ferry::model::sampling::exp_nonpositive(x), ref = std::exp(x);
    worst = std::max(worst, std::abs(e - ref) / ref);
  }
  EXPECT_LT(worst, 1e-15);
}

TEST(Sampler, WeightsAreTwoToThe63TimesTheRelativeProbability) {
  const ferry::model::sampling::WeightRule w(2.0f, 0.5f);
  EXPECT_EQ(w(2.0f), uint64_t{1} << 63);
  EXPECT_EQ(w(1.0f), static_cast<uint64_t>(std::ldexp(ferry::model::sampling::exp_nonpositive(-2.0), 63)));
  EXPECT_NEAR(double(w(1.0f)) / std::ldexp(1.0, 63), std::exp(-2.0), 1e-15);
  EXPECT_EQ(w(-21.0f), 0u);  // x = -46
  EXPECT_EQ(w(-INFINITY), 0u);
}

TEST(Sampler, RadixDrawMatchesTheSortedDefinitionOnSmallVocabularies) {
  expect_reference_tokens(97, true, 3);
  expect_reference_tokens(1000, true, 1);
}

TEST(Sampler, RadixDrawMatchesTheSortedDefinitionOnTheGlmVocabulary) {
  expect_reference_tokens(154880, false, 1);
}

TEST(Sampler, TopPKeepsTheFewestTokensThatReachIt) {
  // Weights 1, 1/2, 1/4, 1/4 (sum 2): top_p 0.7 needs 1.4, reached by the first two: p = 2/3, 1/3.
  const std::vector<float> logits = {std::log(4.0f), std::log(2.0f), 0.0f, 0.0f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.7f;
  p.seed = 3;
  int count[4] = {0, 0, 0, 0};
  const int n = 30000;
  for (int pos = 0; pos < n; ++pos) ++count[sample_token(logits, p, pos)];
  EXPECT_NEAR(count[0] / double(n), 2.0 / 3.0, 0.015);
  EXPECT_NEAR(count[1] / double(n), 1.0 / 3.0, 0.015);
  EXPECT_EQ(count[2] + count[3], 0);
}

TEST(Sampler, TopKOfOneIsGreedyAndFlatRowsDrawEveryToken) {
  const std::vector<float> flat(50, 0.25f);
  SamplingParams p;
  p.temperature = 1.0f;
  std::set<int32_t> seen;
  for (uint64_t pos = 0; pos < 2000; ++pos) seen.insert(sample_token(flat, p, pos));
  EXPECT_EQ(seen.size(), 50u);
  p.top_k = 1;
  for (uint64_t pos = 0; pos < 50; ++pos) EXPECT_EQ(sample_token(flat, p, pos), 0);
}

TEST(Sampler, GoalsAreTheDocumentedRoundings) {
  using ferry::model::sampling::Goal;
  std::mt19937_64 rng(8);
  for (int i = 0; i < 10000; ++i) {
    const uint64_t bits = rng() >> 11, tp = rng() >> 32;
    const u128 total = (u128{rng() >> 33} << 64) | rng();
    const u128 hi = total >> 53, lo = total & ((u128{1} << 53) - 1);
    EXPECT_TRUE((Goal{Goal::draw, bits, 0}.of(total) == bits * hi + ((bits * lo) >> 53) + 1));
    const u128 product = tp * total, ceil_p = (product >> 32) + ((product & 0xffffffffu) != 0);
    EXPECT_TRUE((Goal{Goal::top_p, tp, 0}.of(total) == std::max<u128>(ceil_p, 1)));
  }
  EXPECT_TRUE((Goal{Goal::top_p, 0, 0}.of(u128{1} << 63) == 1));  // top_p 0 keeps the top token
}
