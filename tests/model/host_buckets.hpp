#pragma once
// A host executor over one row's value histogram, for the tests of model/cpu/sampling_buckets.hpp and
// model/cpu/sampling_list.hpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "model/cpu/sampling_buckets.hpp"
#include "model/cpu/sampling_list.hpp"
#include "model/cpu/sampling_rule.hpp"

namespace ferry::model::sampling {

// A value histogram of one row with every key listed per bucket: the executor of the bucket walk
// (sampling_buckets.hpp) and of the list walk (sampling_list.hpp) on the CPU.
class HostBuckets {
 public:
  HostBuckets(const std::vector<float>& row, float temperature) : ks_(static_cast<uint32_t>(row.size())) {
    const auto vocab = static_cast<uint32_t>(row.size());
    uint64_t top = 0;
    for (uint32_t i = 0; i < vocab; ++i) top = std::max(top, ks_.key(row[i], i));
    const WeightRule wr(ks_.value(top), temperature);
    weight_ = [wr](float v) { return wr(v); };
    vb_ = [vb = ValueBuckets(wr)](float v) { return vb(v); };
    for (uint32_t i = 0; i < vocab; ++i) {
      const uint64_t k = ks_.key(row[i], i);
      const uint64_t w = wr(ks_.value(k));
      const int b = vb_(ks_.value(k));
      keys_[b].push_back(k);
      mass_[b] += w;
    }
    for (auto& k : keys_) std::sort(k.begin(), k.end(), std::greater<>());
  }

  Choice scan(const Goal& goal, bool by_mass, int low, u128 low_measure) const {
    auto measure = [&](int b) { return b == low ? low_measure : by_mass ? mass_[b] : u128{keys_[b].size()}; };
    u128 total = 0;
    for (int b = kValueBuckets - 1; b >= low; --b) total += measure(b);
    const u128 want = goal.of(total);
    u128 before = 0;
    Choice c;
    for (int b = kValueBuckets - 1; b >= low; --b) {
      if (want <= before + measure(b)) {
        c.bucket = static_cast<uint32_t>(b);
        c.need = want - before;
        return c;
      }
      before += measure(b);
    }
    ADD_FAILURE() << "a goal beyond the total";
    return c;
  }
  uint64_t count(int b) const { return keys_[b].size(); }
  u128 mass(int b) const { return mass_[b]; }
  bool one_value(int b) const {
    return !keys_[b].empty() && (keys_[b].front() >> (ks_.bits() - 32)) == (keys_[b].back() >> (ks_.bits() - 32));
  }
  uint64_t weight(int b) const { return weight_(ks_.value(keys_[b].front())); }
  uint64_t nth_key(int b, uint64_t i) {
    EXPECT_TRUE(one_value(b));
    EXPECT_GE(i, 1u);
    EXPECT_LE(i, keys_[b].size());
    ++found_;
    return keys_[b][i - 1];
  }
  // min-p's threshold for past(), as draw_token takes it.
  void set_min_p(float min_p) { light_ = min_p > 0.0f ? min_p_weight(min_p) : 0; }
  // The largest light key: weights never grow as keys fall, so the first light one from the top.
  uint64_t past() const {
    for (int b = kValueBuckets - 1; b >= 0; --b) {
      for (uint64_t k : keys_[b]) {
        if (weight_(ks_.value(k)) < light_) return k + 1;
      }
    }
    return 0;
  }
  // The list walk's selects within a bucket: its keys are sorted, larger first.
  Within select_in(int b, uint64_t lb, u128 need, bool by_mass) {
    Within s;
    largest_ = std::max<uint64_t>(largest_, keys_[b].size());
    for (uint64_t k : keys_[b]) {
      if (k < lb) break;
      ++s.at.n;
      s.at.mass += weight_(ks_.value(k));
      if ((by_mass ? s.at.mass : u128{s.at.n}) >= need) {
        s.key = k;
        return s;
      }
    }
    ADD_FAILURE() << "a goal beyond the bucket's keys";
    return s;
  }
  Measure measure_in(int b, uint64_t lb) const {
    Measure m;
    for (uint64_t k : keys_[b]) {
      if (k < lb) break;
      ++m.n;
      m.mass += weight_(ks_.value(k));
    }
    return m;
  }
  // The most keys of a bucket a select_in looked in.
  uint64_t largest() const { return largest_; }
  int bucket_of(uint64_t key) const { return vb_(ks_.value(key)); }
  const KeySpace& keys() const { return ks_; }
  int found() const { return found_; }

 private:
  KeySpace ks_;
  std::function<uint64_t(float)> weight_;
  std::function<int(float)> vb_;
  std::vector<uint64_t> keys_[kValueBuckets];
  u128 mass_[kValueBuckets] = {};
  uint64_t light_ = 0;
  int found_ = 0;
  uint64_t largest_ = 0;
};

}  // namespace ferry::model::sampling
