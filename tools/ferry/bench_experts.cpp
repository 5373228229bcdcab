#include "tools/ferry/bench_experts.hpp"

#include <cstdio>

namespace ferry::cli {

model::ExpertTierCounters expert_counters(const model::Pipeline& pipeline) {
  model::ExpertTierCounters sum;
  for (const auto& s : pipeline.stages()) {
    const model::ExpertTier* tier = s->experts();
    if (tier == nullptr) continue;
    const model::ExpertTierCounters c = tier->counters();
    sum.routes += c.routes;
    sum.hits += c.hits;
    sum.misses_mapped += c.misses_mapped;
    sum.misses_uploaded += c.misses_uploaded;
    sum.bytes_mapped += c.bytes_mapped;
    sum.bytes_uploaded += c.bytes_uploaded;
    sum.promotions += c.promotions;
    sum.evictions += c.evictions;
    sum.pool_slots += c.pool_slots;
    sum.pool_used += c.pool_used;
    sum.swaps_in_flight += c.swaps_in_flight;
  }
  return sum;
}

std::string format_expert_rows(const std::vector<ExpertRow>& rows, double device_bw, double host_bw) {
  std::string out =
      "| test | hit rate | host-link bytes/token | device bytes/token | bound t/s | of bound | swaps |\n"
      "| --- | --- | --- | --- | --- | --- | --- |\n";
  for (const ExpertRow& r : rows) {
    const model::ExpertTierCounters& c = r.delta;
    const double hit = c.routes ? static_cast<double>(c.hits) / static_cast<double>(c.routes) : 0;
    const double link = r.tokens ? static_cast<double>(c.bytes_mapped + c.bytes_uploaded) / r.tokens : 0;
    const double on_device = static_cast<double>(r.decode_bytes) - link;
    // A token reads its device bytes at the copy bandwidth (which counts read and write alike) and
    // its missed experts at the host link's.
    const double seconds = (device_bw > 0 ? on_device / device_bw : 0) + (host_bw > 0 ? link / host_bw : 0);
    const double bound = seconds > 0 ? 1.0 / seconds : 0;
    char line[320];
    std::snprintf(line, sizeof line, "| %s | %.1f%% | %.3f GB | %.3f GB | %.2f | %.0f%% | %llu |\n", r.test.c_str(),
                  100.0 * hit, link / 1e9, on_device / 1e9, bound, bound > 0 ? 100.0 * r.tps / bound : 0.0,
                  static_cast<unsigned long long>(c.promotions));
    out += line;
  }
  return out;
}

}  // namespace ferry::cli
