#include "actors/step_costs.hpp"

#include <algorithm>

namespace ferry::actors {

void StepCosts::record(uint32_t rows, double ms) {
  if (rows == 0 || !(ms >= 0)) return;
  Mean& m = by_rows_[rows];
  ++m.seen;
  if (m.seen <= kCostWarmup) return;
  const uint64_t counted = m.seen - kCostWarmup;
  m.ms += (ms - m.ms) / static_cast<double>(std::min<uint64_t>(counted, kCostWindow));
}

std::optional<double> StepCosts::ms(uint32_t rows) const {
  const auto it = by_rows_.find(rows);
  if (it == by_rows_.end() || it->second.seen < kCostWarmup + kCostSamples) return std::nullopt;
  return it->second.ms;
}

std::optional<double> StepCosts::ratio(uint32_t rows, uint32_t base) const {
  const auto a = ms(rows), b = ms(base);
  if (!a || !b || *b <= 0) return std::nullopt;
  return *a / *b;
}

}  // namespace ferry::actors
