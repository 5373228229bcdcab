#pragma once
// The sampling rule (sampling_rule.hpp) walked over the value histogram of sampling_buckets.hpp, with
// each select finished inside the one value bucket that holds its key: the device sampler's way for a
// row whose keys near the top fit in one block (gpu/sampling_grid.cu), in place of a radix select of
// up to 8 digit passes per cut. Value buckets are intervals of keys, so a select's key is in the
// first bucket, scanned from the top, where its goal is reached, and it is the key of that bucket
// where the goal left there is reached: only that bucket's keys are ordered, never the row's.
#include <cstdint>

#include "model/cpu/sampling_buckets.hpp"
#include "model/cpu/sampling_rule.hpp"

namespace ferry::model::sampling {

// Keys of one value bucket, as a count and a weight.
struct Measure {
  uint64_t n = 0;
  u128 mass = 0;
};

// A select within one bucket: its key, and the measure of the bucket's keys at and above it.
struct Within {
  uint64_t key = 0;
  Measure at;
};

// An executor provides, over the value histogram of the whole row:
//   scan(goal, by_mass, low, low_measure) -> Choice, count(b), mass(b), past(), bucket_of(key), as for
//     bucket_draw;
//   select_in(b, lb, need, by_mass) -> Within: the largest key of bucket b and >= lb whose count (or
//     weight) over b's keys >= lb at and above it reaches need (>= 1, at most their total);
//   measure_in(b, lb) -> Measure: b's keys >= lb.
// The walk's lower bound is the last cut's key: all keys of the buckets above `low` and those of `low`
// at or above `key` (measured by w.n, w.mass), as in BucketWalk.
FERRY_HD_TEMPLATE
template <class Exec>
FERRY_HD void list_select(Exec& ex, BucketWalk& w, Goal goal, bool by_mass) {
  const Choice c = ex.scan(goal, by_mass, w.low, by_mass ? w.mass : static_cast<u128>(w.n));
  const int b = static_cast<int>(c.bucket);
  // Keys of buckets above `low` are all above w.key, so the bound matters in `low` alone.
  const Within s = ex.select_in(b, w.key, c.need, by_mass);
  w.low = b;
  w.n = s.at.n;
  w.mass = s.at.mass;
  w.key = s.key;
  w.whole = false;
}

// draw_token's cuts and draw, in the same order and with the same goals; returns the drawn key.
FERRY_HD_TEMPLATE
template <class Exec>
FERRY_HD uint64_t list_draw(Exec& ex, uint32_t vocab, uint32_t top_k, float top_p, float min_p, uint64_t bits) {
  BucketWalk w;
  w.n = ex.count(0);
  w.mass = ex.mass(0);
  if (top_k > 0 && top_k < vocab) list_select(ex, w, Goal::exactly(top_k), false);
  if (top_p < 1.0f) {
    list_select(ex, w, Goal::nucleus(top_p), true);
  }
  if (min_p > 0.0f) {
    // draw_token's first_past_lighter over the whole row: the largest light key is at or above the
    // bound exactly when some key there is light, and then it is the same key.
    const uint64_t past = ex.past();
    if (past > w.key) {
      // The keys >= past: those of the buckets above the light key's, and its bucket's above it.
      const int d = ex.bucket_of(past - 1);
      const Measure m = ex.measure_in(d, past);
      w.low = d;
      w.n = m.n;
      w.mass = m.mass;
      w.key = past;
      w.whole = false;
    }
  }
  list_select(ex, w, Goal{Goal::draw, bits, 0}, true);
  return w.key;
}

}  // namespace ferry::model::sampling
