#pragma once
// Counters and histograms the scheduler keeps for /metrics: plain data, updated by the step planner
// on its own thread of control (the scheduler actor), copied out as a snapshot.
#include <cstdint>
#include <vector>

#include "actors/messages.hpp"

namespace ferry::actors {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  HistogramSnapshot snapshot() const;  // cumulative counts, Prometheus style

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> buckets_;  // per bucket (not cumulative); one more than bounds: +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct EngineMetrics {
  uint64_t steps = 0;
  uint64_t prompt_tokens = 0;  // computed prompt tokens (cache hits excluded)
  uint64_t cached_tokens = 0;
  uint64_t generated_tokens = 0;
  uint64_t draft_tokens = 0;     // MTP drafts verified
  uint64_t accepted_tokens = 0;  // of them, accepted
  std::vector<uint64_t> finished_by_status = std::vector<uint64_t>(8, 0);  // by RequestStatus
  Histogram step_seconds{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}};
  Histogram ttft_seconds{{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}};
  Histogram itl_seconds{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}};
  Histogram queue_seconds{{0.001, 0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}};
};

}  // namespace ferry::actors
