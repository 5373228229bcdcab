#pragma once
// The memory budgets as a user writes them (sizes such as "25.5GiB", lists for the per-device pool
// caps), the same options for `serve`, `bench`, `eval-ref` and `plan`.
#include <functional>
#include <string>
#include <vector>

#include "config/serve_config.hpp"

namespace ferry::config {

struct MemoryOptionsText {
  std::string expert_pool_cap;      // "25.5GiB,26.5GiB,26.5GiB,25.4GiB" or one size for every device
  std::string host_expert_budget;   // empty: what the experts beyond the pools need
  std::string expert_shadow = "8GiB";
  std::string ram_floor = "20GiB";
  std::string device_margin = "1.5GiB";
  std::string prefill_staging = "2GiB";
  std::string miss_path = "auto";
  std::string expert_stats;
};

// Calls `add(name, value, help)` for each option (name without "--"), so a command registers them
// its own way.
void for_each_memory_option(MemoryOptionsText& text,
                            const std::function<void(const std::string&, std::string&, const std::string&)>& add);

// The text into `out`; one line per problem, naming the option, the value and what it must be.
std::vector<std::string> parse_memory_options(const MemoryOptionsText& text, MemoryConfig& out);

}  // namespace ferry::config
