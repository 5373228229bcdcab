#pragma once
// `ferry bench` on a model whose devices hold only some of its routed experts: per decode test, the
// pool hit rate, what the misses cost over the host link, the swaps the policy made, and the bound
// that says how fast the test could be — the bytes the device reads over its memory bandwidth plus
// the bytes that crossed the host link over that link's measured bandwidth.
#include <cstdint>
#include <string>
#include <vector>

#include "model/expert_tier.hpp"
#include "model/pipeline.hpp"

namespace ferry::cli {

// Every tiered stage's counters, summed.
model::ExpertTierCounters expert_counters(const model::Pipeline& pipeline);

struct ExpertRow {
  std::string test;
  uint32_t tokens = 0;
  double tps = 0;
  uint64_t decode_bytes = 0;  // per token, wherever the experts are
  model::ExpertTierCounters delta;
};

// A Markdown table; `device_bw` is the copy bandwidth (read + write), `host_bw` the host-to-device one.
std::string format_expert_rows(const std::vector<ExpertRow>& rows, double device_bw, double host_bw);

}  // namespace ferry::cli
