#include "gpu/host_expert_store.hpp"

#include <algorithm>
#include <string>

namespace ferry::gpu {

// Arenas of about 1 GiB: one huge page-locked allocation takes long and fragments badly.
HostExpertStore::HostExpertStore(uint32_t slots, uint64_t slot_bytes)
    : slots_(slots),
      per_arena_(static_cast<uint32_t>(std::max<uint64_t>(1, (uint64_t{1} << 30) / std::max<uint64_t>(1, slot_bytes)))),
      slot_bytes_(slot_bytes) {
  for (uint32_t first = 0; first < slots; first += per_arena_) {
    const uint64_t bytes = uint64_t{std::min(per_arena_, slots - first)} * slot_bytes;
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped);
    if (e != cudaSuccess) {
      for (uint8_t* a : arenas_) cudaFreeHost(a);
      throw CudaError("cannot pin " + std::to_string(uint64_t{slots} * slot_bytes) + " bytes of host memory for " +
                          std::to_string(slots) + " experts (--host-expert-budget, --expert-shadow): " +
                          cudaGetErrorString(e),
                      ErrorCode::out_of_memory);
    }
    arenas_.push_back(static_cast<uint8_t*>(p));
  }
}

HostExpertStore::~HostExpertStore() {
  for (uint8_t* a : arenas_) cudaFreeHost(a);
}

}  // namespace ferry::gpu
