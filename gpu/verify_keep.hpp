#pragma once
// A CUDA stage's state at the start of a verify row set (model::SlotRows::verify), kept on the device
// until the slot's next rows: those start there again when a draft was rejected, and the state goes
// back to it. Only the KDA layers' conv and recurrent state is copied: the DSA rows past the start
// (latents, indexer keys and gates) are written again by the rows that follow, and the complete pools'
// keys are recomputed from them. Keeping costs one device copy of the KDA state a verify step and a
// rejection one copy back (9 layers x 4.3 MB on the 12-layer shape: 39 MB, some 25 us at the H200's
// copy rate, computed, not measured); recomputing it would re-run the rows before the set's start.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/stage_state.hpp"

namespace ferry::gpu {

class VerifyKeep {
 public:
  // Throws CudaError when the device has no room.
  VerifyKeep(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t slots);

  // Keeps the slot's KDA state and the positions it holds (the set's start), on `stream`.
  void save(StageState& state, uint32_t slot, cudaStream_t stream);
  // Puts the kept state back (the slot holds the kept start again) and forgets it.
  void restore(StageState& state, uint32_t slot, cudaStream_t stream);
  void forget(uint32_t slot) { start_[slot].reset(); }
  // The start a slot's next rows may go back to, when it has a kept state.
  std::optional<uint32_t> start(uint32_t slot) const { return start_[slot]; }
  uint64_t bytes() const { return buffer_.bytes(); }

 private:
  // Copies the slot's KDA state of every layer between the stage's state and the keep buffer.
  void copy(StageState& state, uint32_t slot, bool to_keep, cudaStream_t stream);

  model::LayerRange layers_;
  std::vector<bool> kda_;
  uint64_t conv_floats_ = 0, recurrent_floats_ = 0, slot_floats_ = 0;
  DeviceBuffer buffer_;
  std::vector<std::optional<uint32_t>> start_;
};

}  // namespace ferry::gpu
