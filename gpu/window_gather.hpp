#pragma once
// The kernels of a prefill chunk's gather past the resident window (gpu/prefill_gather.hpp uses them):
// the union of a group of the step's rows' selected (slot, position)s, each given one staging row, the
// rows copied there once (from the window's frame where the window holds the position, else from the
// host tier through its device view), and each selection rewritten as staging rows. A header of its own,
// like gpu/window_copy.hpp.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ferry::gpu {

struct GatherGroup {
  const int32_t* row_slot = nullptr;  // [rows] each step row's slot
  const int32_t* tokens = nullptr;    // [rows][stride] the indexer's selection (positions)
  const int32_t* counts = nullptr;    // [rows]
  uint32_t stride = 0;
  uint32_t first = 0, end = 0;  // the group: step rows [first, end)
  uint32_t context = 0;
  // [slots][context]: the staging row of a (slot, position) the group claimed, -1 otherwise (between
  // groups every entry is -1: gather_release puts back what gather_claim took).
  int32_t* map = nullptr;
  uint32_t* keys = nullptr;  // [capacity]: slot * context + position of each staging row
  uint32_t capacity = 0;
  // [0]: staging rows the group claimed (zeroed by gather_claim; more than capacity: the group does not fit);
  // [1]: selected positions out of range, over all groups (0 unless a bug).
  uint32_t* counters = nullptr;
};
void gather_claim(const GatherGroup& g, cudaStream_t stream);
// out[(r - first) * stride + i]: the staging row of row r's selection i (the group fits).
void gather_remap(const GatherGroup& g, int32_t* out, cudaStream_t stream);
void gather_release(const GatherGroup& g, cudaStream_t stream);

// The claimed rows into staging rows [0, *count) (at most `bound`, at most capacity).
struct GatherCopy {
  const uint32_t* keys = nullptr;
  const uint32_t* count = nullptr;
  uint32_t capacity = 0, context = 0;
  const int32_t* pos_frame = nullptr;  // [slots][context]: the window's frame of a position, -1 when none
  uint32_t frames = 0;                 // per slot
  const uint8_t* window = nullptr;     // [slots][frames] rows
  const float* window_scales = nullptr;
  // The host tier's row of (slot, position): slot * tier_slot_rows + tier_row0 + position.
  const uint8_t* tier = nullptr;
  const float* tier_scales = nullptr;
  uint32_t tier_slot_rows = 0, tier_row0 = 0;
  uint8_t* dst = nullptr;
  float* dst_scales = nullptr;  // int8 scales (null for other formats)
  uint64_t row_bytes = 0;
  unsigned long long* totals = nullptr;  // accumulated: [0] rows copied, [1] of them from the host tier
};
void gather_copy(const GatherCopy& c, uint32_t bound, cudaStream_t stream);

}  // namespace ferry::gpu
