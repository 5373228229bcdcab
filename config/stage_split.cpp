#include "config/stage_split.hpp"

#include <algorithm>
#include <charconv>
#include <set>

namespace ferry::config {
namespace {

// Comma-separated non-negative integers; `what` names the option in errors.
Expected<std::vector<uint32_t>> parse_list(std::string_view text, const char* what) {
  std::vector<uint32_t> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string_view item = text.substr(at, comma - at);
    uint32_t v = 0;
    const auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || ptr != item.data() + item.size()) {
      return Error(std::string(what) + " '" + std::string(text) + "': '" + std::string(item) +
                   "' is not a non-negative integer (expected a comma-separated list such as 11,23,34)");
    }
    out.push_back(v);
    at = comma + 1;
  }
  return out;
}

}  // namespace

Status parse_split(std::string_view text, StageSplit& split) {
  split.boundaries.clear();
  split.automatic = text == "auto";
  if (split.automatic || text == "none" || text.empty()) return std::nullopt;
  auto list = parse_list(text, "--split");
  if (!list) return list.error();
  split.boundaries = std::move(list.value());
  return std::nullopt;
}

Status parse_devices(std::string_view text, StageSplit& split) {
  auto list = parse_list(text, "--devices");
  if (!list) return list.error();
  split.devices.assign(list->begin(), list->end());
  for (int d : split.devices) {
    if (d > 255) return Error("--devices '" + std::string(text) + "': device " + std::to_string(d) + " is above 255");
  }
  return std::nullopt;
}

std::string format_split(const StageSplit& split) {
  if (split.automatic) return "auto";
  if (split.boundaries.empty()) return "none";
  std::string s;
  for (uint32_t b : split.boundaries) s += (s.empty() ? "" : ",") + std::to_string(b);
  return s;
}

Expected<std::vector<LayerRange>> stage_ranges(const StageSplit& split, uint32_t n_layers,
                                               const std::vector<uint64_t>& layer_bytes) {
  std::vector<uint32_t> cuts = split.boundaries;
  // Several devices and no boundaries given: one stage per device, as --split auto.
  const bool automatic = split.automatic || (cuts.empty() && split.devices.size() > 1);
  if (automatic) {
    const uint32_t stages = static_cast<uint32_t>(std::max<size_t>(1, split.devices.size()));
    if (layer_bytes.size() != n_layers) return Error(ErrorCode::internal, "--split auto needs every layer's bytes");
    if (stages > n_layers) {
      return Error("--split auto: " + std::to_string(n_layers) + " layers cannot make " + std::to_string(stages) +
                   " stages (one per device)");
    }
    uint64_t total = 0;
    for (uint64_t b : layer_bytes) total += b;
    // Stage k ends where the running total comes nearest k/stages of the bytes; every stage keeps at
    // least one layer.
    cuts.clear();
    uint64_t sum = 0;
    uint32_t l = 0;
    for (uint32_t k = 1; k < stages; ++k) {
      const uint64_t goal = total * k / stages;
      const uint32_t last_cut = n_layers - (stages - k);
      sum += layer_bytes[l++];
      while (l < last_cut && sum + layer_bytes[l] / 2 <= goal) sum += layer_bytes[l++];
      cuts.push_back(l);
    }
  }
  std::vector<LayerRange> ranges;
  uint32_t first = 0;
  for (uint32_t cut : cuts) {
    if (cut <= first || cut >= n_layers) {
      return Error("--split " + format_split(split) + ": boundary " + std::to_string(cut) +
                   " must be above the previous one (" + std::to_string(first) + ") and below the " +
                   std::to_string(n_layers) + " layers");
    }
    ranges.push_back({first, cut});
    first = cut;
  }
  ranges.push_back({first, n_layers});
  return ranges;
}

int stage_device(const StageSplit& split, size_t stage, size_t stages) {
  if (split.devices.empty()) return 0;
  if (split.devices.size() >= stages) return split.devices[stage];
  return split.devices[stage * split.devices.size() / stages];
}

size_t distinct_devices(const StageSplit& split, size_t stages) {
  std::set<int> seen;
  for (size_t i = 0; i < stages; ++i) seen.insert(stage_device(split, i, stages));
  return seen.size();
}

}  // namespace ferry::config
