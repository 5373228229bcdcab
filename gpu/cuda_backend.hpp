#pragma once
// The CUDA backend: the whole model on one device (a stage running layers [0, n_layers)), behind the
// same model::Backend interface as the CPU reference. Dense weights, experts and per-slot sequence
// state (KDA conv + recurrent state, DSA latent and indexer caches) live in device memory; a step is
// one pass over the batch of rows on the backend's stream, and a decode step of up to 8 rows is
// replayed from a captured CUDA graph. This header has no CUDA types: tools and actors include it.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/backend.hpp"
#include "model/formats/ggml_type.hpp"
#include "model/glm5/glm5_hparams.hpp"

namespace ferry::model {
class Glm5Weights;
}

namespace ferry::gpu {

struct CudaBackendOptions {
  int device = 0;
  uint32_t max_slots = 4;
  uint32_t max_context = 8192;
  uint32_t max_step_rows = 2048;  // rows of one step (a prefill chunk plus decode rows); larger steps are split
  bool graphs = true;             // replay decode steps from CUDA graphs
};

// Deterministic pseudo-random weights of any glm5_next shape, made on the device (no file).
struct SyntheticModel {
  model::Glm5Hparams hparams;
  model::GgmlType type = model::GgmlType::Q4_K;  // of the large matrices; small state stays f32
  uint64_t seed = 1;
};

struct DeviceMemoryReport {
  uint64_t weight_bytes = 0;  // all weights on the device
  uint64_t state_bytes = 0;   // per-slot state and caches
  uint64_t work_bytes = 0;    // step workspace
  uint64_t peak_bytes = 0;    // the device's used memory at its highest seen (cudaMemGetInfo)
};

class CudaBackend final : public model::Backend {
 public:
  // Both throw std::runtime_error (CudaError) naming what failed: no device, out of memory, a weight
  // type the kernels cannot read.
  static std::unique_ptr<CudaBackend> from_weights(const model::Glm5Weights& weights, const CudaBackendOptions& opt);
  static std::unique_ptr<CudaBackend> synthetic(const SyntheticModel& model, const CudaBackendOptions& opt);
  ~CudaBackend() override;

  const model::Glm5Hparams& hparams() const override;
  uint32_t max_slots() const override;
  uint32_t max_context() const override;
  void reset_slot(uint32_t slot) override;
  // Same contract as model::CpuBackend::step: start 0 restarts a slot, else it must equal the tokens
  // the slot holds (std::invalid_argument otherwise); logits when logits_all or !sample.
  std::vector<model::SlotResult> step(const std::vector<model::SlotRows>& rows) override;
  std::string describe() const override;

  bool synthetic_weights() const;
  DeviceMemoryReport memory() const;
  // Bytes a decode step of one row reads from device memory at sequence depth `depth`: every dense
  // weight, the chosen experts (n_experts_used per MoE layer), the head, and the DSA rows it touches.
  uint64_t decode_bytes_per_token(uint64_t depth) const;
  std::string device_name() const;

 private:
  struct Impl;
  explicit CudaBackend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Device-to-device copy bandwidth (bytes read + bytes written per second) of `bytes`-sized buffers,
// the median of `reps` timed copies after a warm-up.
double measure_copy_bandwidth(int device, uint64_t bytes, int reps);

}  // namespace ferry::gpu
