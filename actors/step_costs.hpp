#pragma once
// Measured decode step times by the step's row count, for the `--mtp auto` policy
// (actors/spec_policy.hpp): what a step of K + 1 rows a slot costs over a step of one row a slot,
// as the engine sees it (plan to outcome). A row count's first steps are not counted (they run
// eagerly and capture the step's CUDA graph); then the mean of its first kCostWindow steps, then a
// moving average over about that many, so that a changed load (a longer context) shows.
#include <cstdint>
#include <map>
#include <optional>

namespace ferry::actors {

inline constexpr uint32_t kCostWarmup = 2;   // a row count's first steps, not counted
inline constexpr uint32_t kCostSamples = 4;  // counted steps before a row count's cost is known
inline constexpr uint32_t kCostWindow = 32;

class StepCosts {
 public:
  // A decode step of `rows` rows (no prefill rows, none other in flight when it was planned) took `ms`.
  void record(uint32_t rows, double ms);
  // The mean step time at `rows` rows, once kCostSamples steps were counted.
  std::optional<double> ms(uint32_t rows) const;
  // ms(rows) / ms(base) where both are known.
  std::optional<double> ratio(uint32_t rows, uint32_t base) const;

 private:
  struct Mean {
    uint64_t seen = 0;  // steps recorded, the warm-up included
    double ms = 0;
  };
  std::map<uint32_t, Mean> by_rows_;
};

}  // namespace ferry::actors
