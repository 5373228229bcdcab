#pragma once
// The sampling rule, written once for the CPU sampler (model/cpu/sampler.cpp) and the CUDA kernel
// (gpu/sampling.cu). Weights are integers made from one exp with explicit fma steps, and every sum is
// an integer sum, so both sides compute the same numbers bit for bit in any order and draw the same
// token; see model/cpu/sampler.hpp for the definition in words.
//
// The draw never sorts: each cut (top-k, top-p, the draw itself) is a radix select on a 64-bit key
// that orders tokens (value bits, then the id reversed), one 8-bit digit at a time, counting tokens or
// adding weights per digit bucket. An executor supplies the per-digit passes: a loop on the CPU, a
// thread block on the GPU.
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FERRY_HD __host__ __device__ inline
#else
#define FERRY_HD inline
#endif
// The two algorithm templates call their executor's methods, which are host-only on the CPU and
// device-only on the GPU: nvcc is told not to check the side it never instantiates.
#if defined(__NVCC__)
#define FERRY_HD_TEMPLATE _Pragma("nv_exec_check_disable")
#else
#define FERRY_HD_TEMPLATE
#endif

namespace ferry::model::sampling {

__extension__ typedef unsigned __int128 u128;

inline constexpr uint64_t kTopWeight = uint64_t{1} << 63;  // the weight of the most likely token

FERRY_HD uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The 53 random bits of the draw at (seed, position).
FERRY_HD uint64_t draw_bits(uint64_t seed, uint64_t position) {
  return splitmix64(splitmix64(seed) ^ splitmix64(position + 0x632be59bd9b4e019ull)) >> 11;
}

// Unsigned bits that order logits like their values: NaN counts as -inf and -0 as +0.
FERRY_HD uint32_t order_bits(float v) {
  if (v != v) v = -INFINITY;
  if (v == 0.0f) v = 0.0f;
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
FERRY_HD float order_value(uint32_t bits) {
  const uint32_t u = (bits & 0x80000000u) ? (bits & 0x7fffffffu) : ~bits;
  float v;
  memcpy(&v, &u, sizeof v);
  return v;
}

// A token's place in the order as one integer: the value's order bits, then the id reversed, so the
// larger key is the higher value, among equal values the lower id. Keys of a vocabulary of at most
// 2^31 ids take at most 63 bits, and every key is above 0.
struct KeySpace {
  uint32_t id_bits = 1;
  FERRY_HD explicit KeySpace(uint32_t vocab) {
    while (id_bits < 31 && ((vocab - 1) >> id_bits) != 0) ++id_bits;
  }
  FERRY_HD uint32_t bits() const { return 32 + id_bits; }
  FERRY_HD uint64_t id_mask() const { return (uint64_t{1} << id_bits) - 1; }
  FERRY_HD uint64_t key(float v, uint32_t id) const { return (uint64_t{order_bits(v)} << id_bits) | (id_mask() - id); }
  FERRY_HD uint32_t id(uint64_t key) const { return static_cast<uint32_t>(id_mask() - (key & id_mask())); }
  FERRY_HD float value(uint64_t key) const { return order_value(static_cast<uint32_t>(key >> id_bits)); }
};

// e^x for x in [-45, 0]: x = k ln2 + r (Cody-Waite, |r| <= ln2 / 2), e^r by its Taylor series to r^13
// (truncation below 1e-17), times 2^k. Only fma, exact scalings and one rounding to an integer: IEEE
// double gives the same bits on every machine. Within a few ulp of exp.
FERRY_HD double exp_nonpositive(double x) {
  const double k = rint(x * 0x1.71547652b82fep+0);  // x / ln2
  double r = fma(-k, 0x1.62e42fefa39efp-1, x);      // ln2, high part
  r = fma(-k, 0x1.abc9e3b39803fp-56, r);            // ln2, low part
  double p = 0x1.6124613a86d09p-33;                 // 1/13!
  p = fma(p, r, 0x1.1eed8eff8d898p-29);
  p = fma(p, r, 0x1.ae64567f544e4p-26);
  p = fma(p, r, 0x1.27e4fb7789f5cp-22);
  p = fma(p, r, 0x1.71de3a556c734p-19);
  p = fma(p, r, 0x1.a01a01a01a01ap-16);
  p = fma(p, r, 0x1.a01a01a01a01ap-13);
  p = fma(p, r, 0x1.6c16c16c16c17p-10);
  p = fma(p, r, 0x1.1111111111111p-7);
  p = fma(p, r, 0x1.5555555555555p-5);
  p = fma(p, r, 0x1.5555555555555p-3);
  p = fma(p, r, 0.5);
  p = fma(p, r, 1.0);
  p = fma(p, r, 1.0);
  return ldexp(p, static_cast<int>(k));
}

// The weight of a token of (order-normalised) value v: 2^63 for the top value, else
// floor(e^((v - top) / T) * 2^63), 0 below e^-45 (where that floor is 0 anyway).
struct WeightRule {
  float top = 0.0f;
  double inv_t = 1.0;
  FERRY_HD WeightRule(float top_value, float temperature) : top(top_value), inv_t(1.0 / static_cast<double>(temperature)) {}
  FERRY_HD uint64_t operator()(float v) const {
    if (v == top) return kTopWeight;
    const double x = (static_cast<double>(v) - static_cast<double>(top)) * inv_t;
    if (!(x >= -45.0)) return 0;
    const double e = exp_nonpositive(x);
    return e >= 1.0 ? kTopWeight : static_cast<uint64_t>(ldexp(e, 63));
  }
};

// floor(bits * total / 2^53) for bits < 2^53 and total < 2^95, without overflow.
FERRY_HD u128 scale_by_draw(uint64_t bits, u128 total) {
  const u128 low = static_cast<u128>(bits) * static_cast<uint64_t>(total);
  const u128 high = static_cast<u128>(bits) * static_cast<uint64_t>(total >> 64);
  return (high << 11) + (low >> 53);
}

// min-p's bound (min_p > 0): min_p times the top token's weight; keys lighter than it are cut.
FERRY_HD uint64_t min_p_weight(float min_p) {
  const double f = min_p < 1.0f ? static_cast<double>(min_p) : 1.0;
  return static_cast<uint64_t>(ceil(ldexp(f, 63)));
}

// What a radix select looks for: the largest key whose measure (token count or weight) taken over
// the keys above and at it reaches the goal. Top-p and the draw know their goal only once the total
// is counted, in the first digit's pass.
struct Goal {
  enum Kind : uint8_t { fixed, top_p, draw };
  Kind kind = fixed;
  uint64_t arg = 0;  // top_p: floor(top_p * 2^32); draw: the 53 random bits
  u128 value = 0;    // fixed
  FERRY_HD static Goal exactly(u128 v) { return Goal{fixed, 0, v}; }
  FERRY_HD static Goal nucleus(float top_p) {
    return Goal{Goal::top_p, top_p > 0.0f ? static_cast<uint64_t>(ldexp(static_cast<double>(top_p), 32)) : 0, 0};
  }
  FERRY_HD u128 of(u128 total) const {
    switch (kind) {
      case top_p: {  // ceil(top_p * total), at least the top token
        const u128 p = (static_cast<u128>(arg) * total + 0xffffffffu) >> 32;
        return p == 0 ? 1 : p;
      }
      case draw:  // the first key whose running weight exceeds floor(u * total)
        return scale_by_draw(arg, total) + 1;
      case fixed:
        break;
    }
    return value;
  }
};

// The bucket an executor chose in one digit's histogram (buckets scanned from the highest down).
struct Choice {
  uint32_t bucket = 0;
  uint32_t count = 0;         // keys in it
  uint64_t count_before = 0;  // keys in the buckets above it
  u128 need = 0;              // the goal left inside it
};

struct Selected {
  uint64_t key = 0;
  uint64_t rank = 0;  // keys >= key among those searched (the selected one included)
};

// Radix select over the keys >= lb. An executor provides:
//   histogram(lb, prefix, left, shift, by_mass): per bucket (key >> shift) & (2^(left-shift) - 1), the
//     count (and weight) of the keys >= lb with key >> left == prefix;
//   choose(goal) -> Choice on that histogram;
//   only_key(lb, prefix, left): the one key >= lb with key >> left == prefix.
FERRY_HD_TEMPLATE
template <class Exec>
FERRY_HD Selected select_key(Exec& ex, const KeySpace& ks, uint64_t lb, Goal goal, bool by_mass) {
  uint64_t prefix = 0, above = 0;
  uint32_t left = ks.bits();
  while (left > 0) {
    const uint32_t shift = left > 8 ? left - 8 : 0;
    ex.histogram(lb, prefix, left, shift, by_mass);
    const Choice c = ex.choose(goal);
    prefix = (prefix << (left - shift)) | c.bucket;
    above += c.count_before;
    goal = Goal::exactly(c.need);
    left = shift;
    if (c.count == 1) return Selected{left > 0 ? ex.only_key(lb, prefix, left) : prefix, above + 1};
  }
  return Selected{prefix, above + 1};
}

// The draw for temperature > 0 (model/cpu/sampler.hpp). The executor also provides
//   narrow(lb, rank): only keys >= lb matter from now on (`rank` of them, or more when unknown);
//   first_past_lighter(lb, threshold): 1 + the largest key >= lb whose weight is below threshold, or 0.
FERRY_HD_TEMPLATE
template <class Exec>
FERRY_HD uint32_t draw_token(Exec& ex, const KeySpace& ks, uint32_t vocab, uint32_t top_k, float top_p, float min_p,
                             uint64_t bits) {
  uint64_t lb = 0;
  if (top_k > 0 && top_k < vocab) {
    lb = select_key(ex, ks, lb, Goal::exactly(top_k), false).key;
    ex.narrow(lb, top_k);
  }
  if (top_p < 1.0f) {
    const Selected s = select_key(ex, ks, lb, Goal::nucleus(top_p), true);
    lb = s.key;
    ex.narrow(lb, s.rank);
  }
  if (min_p > 0.0f) {
    const uint64_t past = ex.first_past_lighter(lb, min_p_weight(min_p));
    if (past > lb) {
      lb = past;
      ex.narrow(lb, ~uint64_t{0});
    }
  }
  return ks.id(select_key(ex, ks, lb, Goal{Goal::draw, bits, 0}, true).key);
}

}  // namespace ferry::model::sampling
