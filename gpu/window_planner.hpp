#pragma once
// The device side of the resident window's CLOCK (gpu/kv_window.hpp uses it; the rule and the kernels
// are gpu/window_plan.cu): per DSA layer and slot the tables position -> frame (int32 per position of
// the context: 4 B a token and DSA layer, in the memory plan: gpu/stage_sizes.hpp), frame ->
// position, reference bits, pins, the hand and the resident count, and the counters, all on the device. A windowed decode step plans there
// with no host sync (and can be captured); a step whose rows of one slot select more than the window
// pins at once is planned on the host (kv::ResidentWindow, the same rule): to_host() and from_host()
// move the slots' state across around it.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/window_plan.hpp"
#include "kv/resident_window.hpp"

namespace ferry::gpu {

class WindowPlanner {
 public:
  // Every slot starts with nothing resident (the tables are cleared on `stream`).
  WindowPlanner(uint32_t layers, uint32_t slots, uint32_t frames, uint32_t context, cudaStream_t stream);

  WindowTables tables(uint32_t layer) const;
  WindowCounts* counts() const { return counts_.as<WindowCounts>(); }

  void adopt_identity(uint32_t layer, uint32_t slot, uint32_t n, cudaStream_t stream);
  // Every layer of the slot: positions >= cut are no longer resident.
  void invalidate(uint32_t slot, uint32_t cut, cudaStream_t stream);
  // The per-step fetch count starts over (WindowCounts::step_fetched).
  void begin_step(cudaStream_t stream);

  // The slots' state of `layer` into `window`'s clocks (synchronizes the stream), and back from them
  // onto the device (enqueued; the next to_host() synchronizes before its buffer is written again).
  void to_host(uint32_t layer, const std::vector<uint32_t>& slots, kv::ResidentWindow& window, cudaStream_t stream);
  void from_host(uint32_t layer, const std::vector<uint32_t>& slots, kv::ResidentWindow& window, cudaStream_t stream);

  // The counters and the frames each slot has resident (over the layers), as of the last publish():
  // a copy enqueued on the stream, read without waiting (the stats of every step cost no sync).
  void publish(cudaStream_t stream);
  WindowCounts published_counts() const;
  std::vector<uint64_t> published_resident() const;
  // publish() and wait for it.
  WindowCounts read_counts(cudaStream_t stream);
  std::vector<uint64_t> resident(cudaStream_t stream);

 private:
  uint32_t layers_, slots_, frames_, context_;
  DeviceBuffer pos_frame_, frame_pos_, ref_, pin_, hand_, counts_;  // counts_: WindowCounts, then resident
  PinnedBuffer down_, up_;  // one layer's frame_pos, ref, hands and resident counts, [slots] each
  PinnedBuffer published_;
};

}  // namespace ferry::gpu
