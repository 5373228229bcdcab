#pragma once
// Prefill past the resident window (issue 12; gpu/kv_window.hpp calls it for a step of more rows than
// a decode step). A chunk's rows select heavily overlapping positions, so per DSA layer the union of
// the selections of a group of its rows is brought into a staging area on the device once, each
// (slot, position) to one staging row: from the window's frame where the window holds the position
// (device to device), else from the host tier through its device view (the host link). The sparse
// attention then reads device memory only; the bytes are those the all-resident path reads, in the
// same order per selection, so the logits are the same bit for bit.
//
// A staging area rather than the window's frames through CLOCK: a chunk's union can be larger than
// the window (pp2048 at depth 32,768 selects from 34,816 positions), the device CLOCK walks a step's
// rows one after another (2,048 of them per layer and chunk), and decode finds the window as it left
// it (a prefill neither evicts nor references its frames). The staging holds `capacity` rows (the
// stage's --kv-resident: one slot's window of one layer, shared by the layers and slots; in the
// memory plan through gpu/stage_sizes.hpp's kv_prefill_gather_bytes). A group whose union is larger
// is split: its claim is read back, and a group of fewer rows tried (a row's own selection always
// fits, the window is at least one selection); a group of rows x selection <= capacity cannot
// overflow and needs no read-back.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "gpu/window_plan.hpp"

namespace ferry::gpu {

class PrefillGather {
 public:
  // `stride`: a row's selection (SparseMlaArgs::max_tokens); `max_rows`: the largest step.
  PrefillGather(uint32_t slots, uint32_t context, uint32_t capacity, uint32_t max_rows, uint32_t stride,
                uint64_t row_bytes, bool int8_scales);

  // Where one DSA layer's rows are.
  struct Source {
    WindowTables window;  // the layer's planner tables (pos_frame, frames)
    const uint8_t* window_rows = nullptr;
    const float* window_scales = nullptr;
    // The host tier's device view: row (slot, p) at slot * tier_slot_rows + tier_row0 + p.
    const uint8_t* tier = nullptr;
    const float* tier_scales = nullptr;
    uint32_t tier_slot_rows = 0, tier_row0 = 0;
  };
  // The sparse attention of the step's rows `a` (as for sparse_mla over all-resident rows) from the staging.
  void attend(const SparseMlaArgs& a, const Source& src, cudaStream_t stream);

  struct Counts {
    uint64_t groups = 0, retries = 0;  // attention launches; groups read back and found too large
    uint64_t rows = 0, tier_rows = 0;  // staging rows copied, of them from the host tier (as of the last attend)
    uint64_t errors = 0;               // selected positions out of range (0 unless a bug)
  };
  // Without waiting: the device's totals as of the last attend's end.
  Counts counts() const;

 private:
  // The claim of group g read back (synchronizes the stream): staging rows claimed.
  uint32_t read_claim(cudaStream_t stream);

  uint32_t context_, capacity_, max_rows_, stride_;
  uint64_t row_bytes_;
  bool scales_;
  DeviceBuffer map_, keys_, staging_, staging_scales_, remap_, counters_;  // counters_: 2 x u32, then 2 x u64
  PinnedBuffer claim_host_, totals_host_;
  uint64_t groups_ = 0, retries_ = 0;
};

}  // namespace ferry::gpu
