#include "model/cpu/sampler.hpp"

#include <algorithm>
#include <array>
#include <vector>

#include "model/cpu/sampling_rule.hpp"

namespace ferry::model {
namespace {

using sampling::u128;

// The executor of sampling::draw_token on the CPU: one loop over all keys per pass (each skips the
// keys below its lb); a token's weight is computed the first time a pass needs it.
class HostRow {
 public:
  HostRow(std::span<const float> logits, const sampling::KeySpace& ks, const sampling::WeightRule& weight)
      : ks_(ks), weight_(weight) {
    keys_.reserve(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) keys_.push_back({ks.key(logits[i], static_cast<uint32_t>(i)), kUnknown});
  }

  void histogram(uint64_t lb, uint64_t prefix, uint32_t left, uint32_t shift, bool by_mass) {
    count_.fill(0);
    mass_.fill(0);
    by_mass_ = by_mass;
    const uint64_t digit = (uint64_t{1} << (left - shift)) - 1;
    for (Key& k : keys_) {
      if (k.key < lb || (k.key >> left) != prefix) continue;
      const size_t b = (k.key >> shift) & digit;
      ++count_[b];
      if (by_mass) mass_[b] += weight(k);
    }
  }

  sampling::Choice choose(const sampling::Goal& goal) const {
    u128 total = 0;
    for (size_t b = 0; b < 256; ++b) total += measure(b);
    const u128 want = goal.of(total);
    sampling::Choice c;
    u128 before = 0;
    for (size_t b = 256; b-- > 0;) {
      const u128 m = measure(b);
      if (want <= before + m) {
        c.bucket = static_cast<uint32_t>(b);
        c.count = count_[b];
        c.need = want - before;
        return c;
      }
      before += m;
      c.count_before += count_[b];
    }
    return c;  // not reached: 1 <= want <= total
  }

  uint64_t only_key(uint64_t lb, uint64_t prefix, uint32_t left) const {
    for (const Key& k : keys_) {
      if (k.key >= lb && (k.key >> left) == prefix) return k.key;
    }
    return 0;
  }

  uint64_t first_past_lighter(uint64_t lb, uint64_t threshold) {
    uint64_t best = 0;
    for (Key& k : keys_) {
      if (k.key >= lb && k.key + 1 > best && weight(k) < threshold) best = k.key + 1;
    }
    return best;
  }

  // Every pass skips the keys below its lb already; a shorter copy would not pay for itself here.
  void narrow(uint64_t, uint64_t) {}

 private:
  static constexpr uint64_t kUnknown = ~uint64_t{0};  // weights are at most 2^63
  struct Key {
    uint64_t key;
    uint64_t weight;
  };
  uint64_t weight(Key& k) const {
    if (k.weight == kUnknown) k.weight = weight_(ks_.value(k.key));
    return k.weight;
  }
  u128 measure(size_t b) const { return by_mass_ ? mass_[b] : u128{count_[b]}; }

  sampling::KeySpace ks_;
  sampling::WeightRule weight_;
  std::vector<Key> keys_;
  std::array<uint32_t, 256> count_{};
  std::array<u128, 256> mass_{};
  bool by_mass_ = false;
};

}  // namespace

int32_t argmax_token(std::span<const float> logits) {
  if (logits.empty()) return -1;
  size_t best = 0;
  uint32_t best_bits = sampling::order_bits(logits[0]);
  for (size_t i = 1; i < logits.size(); ++i) {
    const uint32_t b = sampling::order_bits(logits[i]);
    if (b > best_bits) {  // strict: ties keep the lower id
      best = i;
      best_bits = b;
    }
  }
  return static_cast<int32_t>(best);
}

int32_t sample_token(std::span<const float> logits, const SamplingParams& p, uint64_t position) {
  const int32_t top = argmax_token(logits);
  if (top < 0 || !(p.temperature > 0.0f)) return top;
  const auto vocab = static_cast<uint32_t>(logits.size());
  const sampling::KeySpace ks(vocab);
  const float top_value = ks.value(ks.key(logits[top], static_cast<uint32_t>(top)));
  HostRow row(logits, ks, sampling::WeightRule(top_value, p.temperature));
  return static_cast<int32_t>(sampling::draw_token(row, ks, vocab, p.top_k, p.top_p, p.min_p,
                                                   sampling::draw_bits(p.seed, position)));
}

}  // namespace ferry::model
