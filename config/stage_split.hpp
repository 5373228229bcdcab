#pragma once
// How the trunk's layers are split into pipeline stages and which device runs each stage:
// `--split 11,23,34` (the first layer of every stage after the first: four stages), `--split auto`
// (stages of about equal weight bytes, one per device) and `--devices 0,1,2,3`. Several stages may
// share a device (how the pipeline is tested on one GPU); the CPU backend splits the same way.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "config/expected.hpp"

namespace ferry::config {

// Trunk layers [first, end) of one stage.
struct LayerRange {
  uint32_t first = 0;
  uint32_t end = 0;
  uint32_t size() const { return end - first; }
  bool operator==(const LayerRange&) const = default;
};

struct StageSplit {
  std::vector<int> devices;          // CUDA devices of the stages; empty = device 0 only
  std::vector<uint32_t> boundaries;  // first layer of stages 1..n-1; empty (and not automatic) = one stage
  bool automatic = false;            // --split auto: one stage per device, of about equal weight bytes
  uint32_t micro_batches = 0;        // decode micro-batches kept in flight; 0 = one per distinct device
};

// "11,23,34" or "auto" into `split`; "0,1,2,3" into `split.devices`. Errors name the text.
Status parse_split(std::string_view text, StageSplit& split);
Status parse_devices(std::string_view text, StageSplit& split);
std::string format_split(const StageSplit& split);  // "11,23,34", "auto" or "none"

// The stages' layer ranges for a trunk of `n_layers`. `layer_bytes` (n_layers entries, the weight
// bytes of each layer) is needed only by an automatic split. Errors name the boundary that is out of
// order or outside (0, n_layers).
Expected<std::vector<LayerRange>> stage_ranges(const StageSplit& split, uint32_t n_layers,
                                               const std::vector<uint64_t>& layer_bytes = {});

// The device of stage `stage` of `stages`: the list's entry when it names one device per stage, else
// the stages spread over the listed devices in contiguous runs (4 stages on 2 devices: 0,0,1,1).
int stage_device(const StageSplit& split, size_t stage, size_t stages);
// Distinct devices the stages use.
size_t distinct_devices(const StageSplit& split, size_t stages);

}  // namespace ferry::config
