#pragma once
// The bytes of one routed expert — its gate, up and down rows, one after the other as a pool or host
// slot holds them — from the model file's mapping or from the synthetic seed, whichever tier they go
// to (a synthetic expert's bytes are the same wherever it is made).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "gpu/cuda_memory.hpp"
#include "gpu/device_weights.hpp"
#include "gpu/kernels.hpp"

namespace ferry::model {
class Glm5Weights;
}

namespace ferry::gpu {

// One MoE layer's expert: the three matrices (data unset) and where each starts in a slot.
struct ExpertShape {
  DevMatrix gate, up, down;
  uint64_t up_offset = 0, down_offset = 0, bytes = 0;
};

class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  virtual ExpertShape shape(uint32_t layer) const = 0;
  // Writes expert `expert` of `layer` to `dst`: device memory of the current device, or host memory
  // when !on_device. Waits for the copies it makes on `stream`. Throws CudaError.
  virtual void write(uint32_t layer, uint32_t expert, uint8_t* dst, bool on_device, cudaStream_t stream) = 0;
};

std::unique_ptr<ExpertSource> file_experts(const model::Glm5Weights& weights);
std::unique_ptr<ExpertSource> synthetic_experts(const SyntheticModel& model);

}  // namespace ferry::gpu
