#include "model/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "model/cpu_ops.hpp"

namespace ferry::model {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

double sampling_uniform(uint64_t seed, uint64_t position) {
  const uint64_t h = splitmix64(splitmix64(seed) ^ splitmix64(position + 0x632be59bd9b4e019ull));
  return static_cast<double>(h >> 11) * 0x1p-53;
}

int32_t argmax_token(std::span<const float> logits) {
  if (logits.empty()) return -1;
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;  // strict: ties keep the lower id
  }
  return static_cast<int32_t>(best);
}

int32_t sample_token(std::span<const float> logits, const SamplingParams& p, uint64_t position) {
  if (logits.empty()) return -1;
  if (!(p.temperature > 0.0f)) return argmax_token(logits);

  const size_t n = logits.size();
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  const HigherValueFirst better{logits.data()};
  size_t keep = n;
  if (p.top_k > 0 && p.top_k < n) {
    keep = p.top_k;
    std::partial_sort(order.begin(), order.begin() + static_cast<ptrdiff_t>(keep), order.end(), better);
  } else {
    std::sort(order.begin(), order.end(), better);
  }

  std::vector<double> prob(keep);
  const double top = logits[order[0]];
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    prob[i] = std::exp((double(logits[order[i]]) - top) / double(p.temperature));
    total += prob[i];
  }
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    size_t k = 0;
    while (k < keep) {
      cum += prob[k] / total;
      ++k;
      if (cum >= double(p.top_p)) break;
    }
    keep = std::max<size_t>(k, 1);
  }
  if (p.min_p > 0.0f) {
    const double floor = double(p.min_p) * prob[0];  // prob[0] is the largest
    size_t k = 1;
    while (k < keep && prob[k] >= floor) ++k;
    keep = k;
  }
  total = 0.0;
  for (size_t i = 0; i < keep; ++i) total += prob[i];
  const double target = sampling_uniform(p.seed, position) * total;
  double cum = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    cum += prob[i];
    if (target < cum) return static_cast<int32_t>(order[i]);
  }
  return static_cast<int32_t>(order[keep - 1]);
}

}  // namespace ferry::model
