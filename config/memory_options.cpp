#include "config/memory_options.hpp"

#include "config/byte_size.hpp"

namespace ferry::config {

void for_each_memory_option(MemoryOptionsText& t,
                            const std::function<void(const std::string&, std::string&, const std::string&)>& add) {
  add("expert-pool-cap", t.expert_pool_cap,
      "device memory for routed experts, one size per device in use or one for all (e.g. 25.5GiB,26.5GiB); "
      "default: what each device has left after the dense weights, state and workspace");
  add("host-expert-budget", t.host_expert_budget,
      "pinned host memory for the routed experts no device pool holds (default: as much as they need)");
  add("expert-shadow", t.expert_shadow, "pinned host copies of pooled experts, so that evicting one costs no copy");
  add("ram-floor", t.ram_floor, "host memory that must stay free");
  add("device-margin", t.device_margin, "device memory left free for the CUDA context, cuBLAS and graphs");
  add("prefill-staging", t.prefill_staging,
      "device memory per stage for uploading a layer's missing experts during prefill (two layers' worth)");
  add("miss-path", t.miss_path,
      "how a prefill chunk reads experts that are not in the pool: auto, mapped (from host memory, by the "
      "kernels) or upload (copied to the device first); decode always reads them from host memory");
  add("expert-stats", t.expert_stats, "file of route counts: read at start (warm start), written at shutdown");
}

std::vector<std::string> parse_memory_options(const MemoryOptionsText& t, MemoryConfig& out) {
  std::vector<std::string> errors;
  auto size = [&](const char* option, const std::string& text, uint64_t& into) {
    auto v = parse_byte_size(text);
    if (v) into = v.value();
    else errors.push_back(std::string("--") + option + ": " + v.error().message);
  };
  out.expert_pool_caps.clear();
  size_t at = 0;
  while (!t.expert_pool_cap.empty() && at <= t.expert_pool_cap.size()) {
    const size_t comma = std::min(t.expert_pool_cap.find(',', at), t.expert_pool_cap.size());
    uint64_t cap = 0;
    size("expert-pool-cap", t.expert_pool_cap.substr(at, comma - at), cap);
    out.expert_pool_caps.push_back(cap);
    at = comma + 1;
  }
  out.host_expert_budget.reset();
  if (!t.host_expert_budget.empty()) {
    uint64_t budget = 0;
    size("host-expert-budget", t.host_expert_budget, budget);
    out.host_expert_budget = budget;
  }
  size("expert-shadow", t.expert_shadow, out.expert_shadow);
  size("ram-floor", t.ram_floor, out.ram_floor);
  size("device-margin", t.device_margin, out.device_margin);
  size("prefill-staging", t.prefill_staging, out.prefill_staging);
  if (t.miss_path != "auto" && t.miss_path != "mapped" && t.miss_path != "upload") {
    errors.push_back("--miss-path = " + t.miss_path + ": expected auto, mapped or upload");
  }
  out.miss_path = t.miss_path;
  out.expert_stats = t.expert_stats;
  return errors;
}

}  // namespace ferry::config
