#pragma once
// The host expert store: pinned host memory that every device reads directly (mapped, portable), cut
// into slots of the model's largest expert. It holds every routed expert that no device pool holds,
// and copies of some pooled ones (the shadow), within the host budgets of the memory plan; what goes
// in which slot is the expert policy's to say. Made once, shared by the stages of a model: they read
// experts from it inside their steps and write evicted ones into it on their copy streams.
#include <cstdint>
#include <vector>

#include "gpu/cuda_memory.hpp"

namespace ferry::gpu {

class HostExpertStore {
 public:
  // Throws CudaError (out_of_memory) when the pinned memory cannot be had.
  HostExpertStore(uint32_t slots, uint64_t slot_bytes);
  ~HostExpertStore();
  HostExpertStore(const HostExpertStore&) = delete;
  HostExpertStore& operator=(const HostExpertStore&) = delete;

  uint8_t* slot(uint32_t i) const { return arenas_[i / per_arena_] + uint64_t{i % per_arena_} * slot_bytes_; }
  uint32_t slots() const { return slots_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint64_t bytes() const { return uint64_t{slots_} * slot_bytes_; }

 private:
  uint32_t slots_, per_arena_;
  uint64_t slot_bytes_;
  std::vector<uint8_t*> arenas_;  // cudaHostAlloc'ed, portable and mapped
};

}  // namespace ferry::gpu
