#pragma once
// The resident window's CLOCK on the device (gpu/window_plan.cu; gpu/window_planner.hpp owns the
// tables): a windowed decode step's selections become window rows and a fetch list without the host,
// by the rule of kv::ClockPolicy and kv::ResidentWindow::plan (one row at a time: its hits pinned and
// referenced, then its misses placed in selection order, free frames lowest first, then the hand's
// victims; nothing the step pinned is evicted). A header of its own, like gpu/window_copy.hpp.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ferry::gpu {

// One DSA layer's tables, per slot.
struct WindowTables {
  int32_t* pos_frame = nullptr;  // [slots][context]: the frame holding a position, -1 when none
  int32_t* frame_pos = nullptr;  // [slots][frames]: the position a frame holds, -1 when free
  uint8_t* ref = nullptr;        // [slots][frames]: reference bits
  uint8_t* pin = nullptr;        // [slots][frames]: pinned by the step being planned (zero between steps)
  uint32_t* hand = nullptr;      // [slots]
  uint32_t* resident = nullptr;  // [slots]: frames that hold a position
  uint32_t frames = 0, context = 0;
};

// Accumulated on the device; read when the stats are asked for.
struct WindowCounts {
  unsigned long long hits = 0, misses = 0;
  unsigned long long step_fetched = 0;  // rows fetched since the last reset (one step's, over its layers)
  unsigned long long errors = 0;        // positions out of range, or a step that could not be pinned
};

struct WindowPlanArgs {
  WindowTables t;
  // The step's rows on the device: each row's slot and the first row of its segment (a slot's
  // consecutive rows; a slot has one segment in a step).
  const int32_t* row_slot = nullptr;
  const int32_t* row_first = nullptr;
  uint32_t rows = 0;
  const int32_t* tokens = nullptr;  // [rows][stride] the indexer's selection
  const int32_t* counts = nullptr;  // [rows]
  uint32_t stride = 0;
  int32_t* rows_out = nullptr;  // [rows][stride] window rows: slot * frames + frame
  // The fetches (host tier row, window row) and their count (zeroed by plan_window first).
  uint32_t* fetches = nullptr;
  uint32_t* fetch_count = nullptr;
  uint32_t fetch_capacity = 0;
  // The host tier's row of (slot, position): slot * tier_slot_rows + tier_row0 + position.
  uint32_t tier_slot_rows = 0, tier_row0 = 0;
  WindowCounts* counts_out = nullptr;
};
// Plans the step's rows of one layer, a block per segment (led by its first row). Precondition (checked by the caller
// from the step's shape): a segment's rows select at most `frames` rows together.
void plan_window(const WindowPlanArgs& a, cudaStream_t stream);

// Slot `slot` holds positions [0, n) at frames [0, n), referenced, hand at 0 (kv::ResidentWindow::
// adopt_identity); every other position is not resident.
void window_adopt_identity(const WindowTables& t, uint32_t slot, uint32_t n, cudaStream_t stream);
// The slot's frames holding positions >= cut are freed (kv::ClockPolicy::invalidate).
void window_invalidate(const WindowTables& t, uint32_t slot, uint32_t cut, cudaStream_t stream);
// pos_frame of the slot's frames' positions set to -1 (before its frame_pos is replaced), and set
// from frame_pos (after).
void window_unmap_positions(const WindowTables& t, uint32_t slot, cudaStream_t stream);
void window_map_positions(const WindowTables& t, uint32_t slot, cudaStream_t stream);

}  // namespace ferry::gpu
