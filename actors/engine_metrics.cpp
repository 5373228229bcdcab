#include "actors/engine_metrics.hpp"

#include <algorithm>
#include <utility>

namespace ferry::actors {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), buckets_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const auto it = std::lower_bound(bounds_.begin(), bounds_.end(), value);
  ++buckets_[static_cast<size_t>(it - bounds_.begin())];
  sum_ += value;
  ++count_;
}

HistogramSnapshot Histogram::snapshot() const {
  HistogramSnapshot out;
  out.bounds = bounds_;
  out.counts.resize(buckets_.size());
  uint64_t running = 0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    running += buckets_[i];
    out.counts[i] = running;
  }
  out.sum = sum_;
  out.count = count_;
  return out;
}

}  // namespace ferry::actors
