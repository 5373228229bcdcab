#pragma once
// The per-slot state of a CUDA stage's layers, in device memory: per KDA layer the conv inputs and the
// recurrent state, per DSA layer the latent rows, the indexer's keys and gates and the complete pools'
// keys: latent rows and pool keys sized for `context` positions per slot, the keys and gates a ring
// of a step's rows (gpu/stage_sizes.hpp, index_key_rows). The latent rows are kept in the stage's KV format
// (config/kv_type.hpp); the indexer's rows in f32. With a resident window smaller than the context
// (gpu/kv_window.hpp) the device keeps `resident` latent rows per slot and DSA layer, the host tier
// the rest. Saved to and restored from the host in the
// layout every stage shares (model/slot_state.hpp).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "config/expected.hpp"
#include "gpu/cuda_memory.hpp"
#include "gpu/kv_window.hpp"
#include "model/slot_state.hpp"
#include "model/stage.hpp"

namespace ferry::gpu {

struct LayerState {
  float* conv = nullptr;       // [slots][3C][kernel-1]: each channel's inputs together (the image: [kernel-1][3C])
  float* recurrent = nullptr;  // [slots][heads][head_dim][head_dim]
  void* latents = nullptr;     // [slots][latent rows][kv_lora_rank] in the latent format (f32, f16 bits, int8 codes)
  float* latent_scales = nullptr;  // int8: [slots][latent rows]
  float* keys = nullptr;       // [slots][key rows][index_dim]: position p at p % key rows
  float* gates = nullptr;      // [slots][key rows][index_dim]
  float* pools = nullptr;      // [slots][context/kpool][index_dim]
};

class StageState {
 public:
  // Throws CudaError when the device has no room. `stream` zeroes the KDA state. `resident` (0: none)
  // and `max_rows` (the largest step) size the resident window; `max_rows` the ring of the indexer's
  // keys and gates (0: every position, for a state whose rollbacks go back further than a step).
  StageState(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t slots, uint32_t context,
             config::KvFormats formats, cudaStream_t stream, uint32_t resident = 0, uint32_t max_rows = 0);

  // Device bytes the state of `slots` slots of `context` positions takes (what the constructor allocates).
  static uint64_t bytes_for(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t slots, uint32_t context,
                            config::KvType latent = config::KvType::f32, uint32_t resident = 0,
                            uint32_t max_rows = 0);

  LayerState& layer(uint32_t index) { return layers_[index - first_]; }
  uint32_t slots() const { return slots_; }
  uint32_t context() const { return context_; }
  // Latent rows per slot on the device: the window's, or the context.
  uint32_t latent_rows() const { return latent_rows_; }
  // Rows per slot of the indexer's keys and gates: the ring's (position % key_rows()).
  uint32_t key_rows() const { return key_rows_; }
  // The resident window, when the context is larger than it (else null).
  KvWindow* window() { return window_.get(); }
  const KvWindow* window() const { return window_.get(); }
  // Before a step's layers (the window's begin_step): whether it takes the windowed path.
  bool begin_step(const std::vector<model::SlotRows>& rows, cudaStream_t stream);
  config::KvType latent_type() const { return formats_.latent; }
  uint64_t bytes() const { return bytes_; }
  const model::SlotStateLayout& layout() const { return layout_; }

  // Positions each slot holds.
  std::vector<uint32_t> tokens;

  // The slot starts over: its KDA state zeroed (the DSA rows are overwritten as it goes).
  void zero_slot(uint32_t slot, cudaStream_t stream);
  // Host images of the shared layout; both wait for `stream` and throw CudaError on a device error.
  Expected<model::SlotStateImage> save(uint32_t slot, bool with_rows, cudaStream_t stream);
  Status restore(uint32_t slot, const model::SlotStateImage& image, cudaStream_t stream);

 private:
  // Where part `p` of `slot` starts on the device.
  float* where(const model::StatePartSpec& p, uint32_t slot);

  // The latent part of an image: rows [0, tokens) of `slot` in `l`, to or from the image encoding.
  void save_latents(uint32_t il, uint32_t slot, uint32_t tokens, float* out, cudaStream_t stream);
  Status restore_latents(uint32_t il, uint32_t slot, const float* in, uint32_t tokens, cudaStream_t stream);
  // The tail part `p` of an image of `tokens` positions (the incomplete pool's keys or gates): out of
  // the slot's ring into `out`, or (out null) from `in` into the ring.
  void copy_tail(const model::StatePartSpec& p, uint32_t slot, uint32_t tokens, float* out, const float* in,
                 cudaStream_t stream);

  uint32_t first_ = 0, slots_ = 0, context_ = 0, latent_rows_ = 0, key_rows_ = 0, kpool_ = 1;
  config::KvFormats formats_;
  uint64_t conv_taps_ = 1, conv_floats_ = 0, recurrent_floats_ = 0, latent_width_ = 0, index_width_ = 0;
  model::SlotStateLayout layout_;
  std::vector<LayerState> layers_;
  std::vector<DeviceBuffer> buffers_;
  uint64_t bytes_ = 0;
  std::unique_ptr<KvWindow> window_;
};

}  // namespace ferry::gpu
