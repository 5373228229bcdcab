// The list walk of model/cpu/sampling_list.hpp (the device sampler's way for rows whose keys near the
// top fit in one block) against model::sample_token: over a value histogram built here from each row,
// its token must be the rule's on every row kind, parameter set and position, at small vocabularies
// and on rows shaped like a model's of the GLM vocabulary.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "model/cpu/sampler.hpp"
#include "model/cpu/sampling_list.hpp"
#include "tests/model/host_buckets.hpp"
#include "tests/model/sampling_cases.hpp"

namespace ferry::model::sampling {
namespace {

void expect_rule_token(HostBuckets& ex, const std::vector<float>& row, const SamplingParams& p, uint64_t position,
                       const std::string& name) {
  ex.set_min_p(p.min_p);
  const auto vocab = static_cast<uint32_t>(row.size());
  const uint64_t key = list_draw(ex, vocab, p.top_k, p.top_p, p.min_p, draw_bits(p.seed, position));
  EXPECT_EQ(static_cast<int32_t>(ex.keys().id(key)), sample_token(row, p, position))
      << name << " vocab " << vocab << " T " << p.temperature << " top_k " << p.top_k << " top_p " << p.top_p
      << " min_p " << p.min_p << " seed " << p.seed << " position " << position;
}

TEST(SamplingList, WalkDrawsTheRuleTokenOnEveryRowKind) {
  for (uint32_t vocab : {97u, 5000u}) {
    const auto rows = testing::sampling_rows(vocab, vocab + 5);
    const auto params = testing::sampling_params(vocab, vocab == 97);
    for (const auto& [name, row] : rows) {
      float built_for = 0.0f;
      size_t drawn = 0;
      std::unique_ptr<HostBuckets> ex;
      for (const SamplingParams& p : params) {
        if (p.temperature <= 0.0f) continue;
        if (!ex || p.temperature != built_for) {
          ex = std::make_unique<HostBuckets>(row, p.temperature);
          built_for = p.temperature;
        }
        expect_rule_token(*ex, row, p, ++drawn % 2 == 0 ? 3u : 40961u, name);
      }
    }
  }
}

// Serve's settings and their neighbours on the GLM vocabulary; prints the most keys of a value bucket
// a select looked in (the device orders a bucket of up to 128 keys by counting, more by radix passes).
TEST(SamplingList, WalkDrawsTheRuleTokenOnTheGlmVocabulary) {
  const uint32_t vocab = 154880;
  for (const auto& [name, row] : testing::sampling_rows(vocab, 9)) {
    if (name != "random" && name != "peaked" && name != "zipf" && name != "ties") continue;
    for (float t : {0.4f, 1.0f}) {
      HostBuckets ex(row, t);
      for (int cut = 0; cut < 4; ++cut) {
        SamplingParams p;
        p.temperature = t;
        p.top_p = cut == 2 ? 1.0f : cut == 1 ? 0.9f : 0.95f;
        p.top_k = cut == 1 ? 40 : 0;
        p.min_p = cut >= 2 ? 0.05f : 0.0f;
        for (uint64_t s = 0; s < 3; ++s) {
          p.seed = 0x243f6a8885a308d3ull * (s + 1) + static_cast<uint64_t>(cut);
          expect_rule_token(ex, row, p, 100 + s, name);
        }
      }
      std::printf("%-8s T %.1f: at most %llu keys in a bucket a select looked in\n", name.c_str(), t,
                  static_cast<unsigned long long>(ex.largest()));
    }
  }
}

}  // namespace
}  // namespace ferry::model::sampling
