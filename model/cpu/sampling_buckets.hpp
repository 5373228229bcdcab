#pragma once
// The sampling rule (sampling_rule.hpp) decided from a histogram of values alone, when each cut falls
// in a bucket whose keys all have one value: the device sampler's way for rows of many ties
// (gpu/sampling_grid.cu), which would otherwise take every radix pass over all of the row's blocks.
//
// Within a bucket of one value v every key weighs w(v) and the keys are ordered by id, lower first.
// A select whose goal leaves `need` inside such a bucket therefore keeps its first ceil(need / unit)
// keys (unit: 1 counting keys, w(v) adding weights), and its key is the i-th lowest id of value v: no
// radix pass is needed, only a way to find that id (nth_key). The walk's choices depend on the
// histogram alone, never on the keys found, so an executor can also plan a row without finding them.
#include <cmath>
#include <cstdint>

#include "model/cpu/sampling_rule.hpp"

namespace ferry::model::sampling {

inline constexpr int kValueBuckets = 256;
inline constexpr double kBucketsPerUnit = 8.0;  // value buckets per unit of (value - top) / T

// The value histogram's bucket of an (order-normalised) value: 255 for the top, down by one every
// eighth of T below it, 0 for the rest (-inf included). It never decreases with the value, so it never
// does with the key, and equal values share a bucket.
struct ValueBuckets {
  float top;
  double inv_t;
  FERRY_HD explicit ValueBuckets(const WeightRule& w) : top(w.top), inv_t(w.inv_t) {}
  FERRY_HD int operator()(float v) const {
    if (v == top) return kValueBuckets - 1;
    const double t = (static_cast<double>(top) - static_cast<double>(v)) * inv_t * kBucketsPerUnit;
    return t < kValueBuckets - 1.0 ? kValueBuckets - 1 - static_cast<int>(t) : 0;
  }
};

// The fewest i >= 1 with i * unit >= need, for 1 <= need <= 2^32 * unit and unit > 0 (no 128-bit
// division: a double estimate, then exact steps, at most a few).
FERRY_HD uint64_t units_to_reach(u128 need, uint64_t unit) {
  const double n = ldexp(static_cast<double>(static_cast<uint64_t>(need >> 64)), 64) +
                   static_cast<double>(static_cast<uint64_t>(need));
  const double est = n / static_cast<double>(unit);
  uint64_t i = est < 1.0 ? 1 : static_cast<uint64_t>(est);
  while (static_cast<u128>(i) * unit < need) ++i;
  while (i > 1 && static_cast<u128>(i - 1) * unit >= need) --i;
  return i;
}

// The keys >= the rule's lower bound: all keys of the buckets above `low`, and the first `n` keys of
// `low` (weight `mass`).
struct BucketWalk {
  int low = 0;
  uint64_t n = 0;
  u128 mass = 0;
  uint64_t key = 0;    // the last select's key (0 when not asked for)
  bool whole = true;   // no cut yet: the lower bound is 0
};

struct BucketDraw {
  bool ok = false;   // false: a cut falls in a bucket of more than one value
  uint64_t key = 0;  // the drawn key, when asked for
};

// An executor provides, over the value histogram of the whole row:
//   scan(goal, by_mass, low, low_measure) -> Choice: the buckets above `low` with their key count (or
//     weight), `low` with low_measure, none below, scanned from the highest;
//   count(b), mass(b); one_value(b): bucket b is not empty and all its keys have one value, whose
//   weight is weight(b); nth_key(b, i): the i-th largest key of such a bucket (1-based);
//   past(): 1 + the row's largest key lighter than min-p's threshold, 0 if none; bucket_of(key).
FERRY_HD_TEMPLATE
template <class Exec>
FERRY_HD bool bucket_select(Exec& ex, BucketWalk& w, Goal goal, bool by_mass, bool keys) {
  const Choice c = ex.scan(goal, by_mass, w.low, by_mass ? w.mass : static_cast<u128>(w.n));
  const int b = static_cast<int>(c.bucket);
  if (!ex.one_value(b)) return false;
  const uint64_t weight = ex.weight(b);
  const uint64_t unit = by_mass ? weight : 1;
  if (unit == 0 || c.need == 0) return false;  // never: a goal >= 1 is met only where there is weight
  const uint64_t i = units_to_reach(c.need, unit);
  w.low = b;
  w.n = i;
  w.mass = static_cast<u128>(i) * weight;
  w.key = keys ? ex.nth_key(b, i) : 0;
  w.whole = false;
  return true;
}

// draw_token's cuts and draw, in the same order and with the same goals. With keys false nothing is
// found, only whether the walk holds (the same answer).
FERRY_HD_TEMPLATE
template <class Exec>
FERRY_HD BucketDraw bucket_draw(Exec& ex, uint32_t vocab, uint32_t top_k, float top_p, float min_p, uint64_t bits,
                                bool keys) {
  BucketWalk w;
  w.n = ex.count(0);
  w.mass = ex.mass(0);
  BucketDraw out;
  if (top_k > 0 && top_k < vocab && !bucket_select(ex, w, Goal::exactly(top_k), false, keys)) return out;
  if (top_p < 1.0f) {
    if (!bucket_select(ex, w, Goal::nucleus(top_p), true, keys)) return out;
  }
  if (min_p > 0.0f) {
    const uint64_t past = ex.past();
    if (past != 0) {
      // The largest light key is above the lower bound exactly when its bucket is `low` or higher: a
      // cut bucket holds one value, so it is light throughout or not at all.
      const int d = ex.bucket_of(past - 1);
      if (w.whole || d >= w.low) {
        // All of d is light (one value): the keys left are those of the buckets above it.
        if (!ex.one_value(d)) return out;
        w.low = d;
        w.n = 0;
        w.mass = 0;
        w.whole = false;
      }
    }
  }
  if (!bucket_select(ex, w, Goal{Goal::draw, bits, 0}, true, keys)) return out;
  out.ok = true;
  out.key = w.key;
  return out;
}

}  // namespace ferry::model::sampling
