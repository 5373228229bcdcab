#pragma once
// What the MTP block takes on a CUDA last stage (gpu/mtp_block.hpp, gpu/verify_keep.hpp, with
// --mtp), computed without a device, for the memory plan: the block's weights (its layer, routed
// experts all resident, and the token embedding when neither the block nor the stage has one), its
// per-slot state (a DSA layer's rows and indexer pools, and the block's row buffers), the verify keep
// (every slot's KDA conv + recurrent state) and the workspace's extra (the block's layer and one
// pending row per slot). CudaMtp and VerifyKeep allocate these (their bytes() report them).
#include <cstdint>
#include <functional>

#include "config/kv_type.hpp"
#include "model/glm5/glm5_hparams.hpp"
#include "model/glm5/glm5_tensors.hpp"
#include "model/stage.hpp"

namespace ferry::gpu {

// Drafts a slot may ask for in one step on the CUDA stage.
inline constexpr uint32_t kMaxCudaDrafts = 8;
// sizeof(gpu::SampleRow) (gpu/kernels.hpp; mtp_block.cpp checks it).
inline constexpr uint64_t kSampleRowBytes = 32;

struct MtpBytes {
  uint64_t weights = 0, state = 0, keep = 0, workspace = 0;
  uint64_t total() const { return weights + state + keep + workspace; }
};

// Floats of one slot's kept KDA state (conv + recurrent of every KDA layer of `layers`).
uint64_t verify_keep_slot_floats(const model::Glm5Hparams& hp, model::LayerRange layers);
// The keep buffer VerifyKeep allocates (16 bytes at least, as for a stage without KDA layers).
uint64_t verify_keep_bytes(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t slots);
// CudaMtp's own row buffers for `rows` workspace rows (ids, hidden states, the eh_proj input, the
// block's output, per-slot pending states and drafts, the greedy draw rows).
uint64_t mtp_buffer_bytes(const model::Glm5Hparams& hp, uint32_t slots, uint32_t rows);
// The workspace rows of a stage: a step's, and with the MTP block one pending entry per slot more.
uint32_t mtp_work_rows(uint32_t step_rows, uint32_t slots, bool runs_mtp);

// On the stage `last` (ending at the trunk's last layer) with --mtp: zero when the model has no MTP
// block. `tensor_bytes` as the plan's (0 for a tensor the file lacks); `step_rows` the stage's rows
// a step (with the verify sets).
MtpBytes mtp_stage_bytes(const model::Glm5Hparams& hp,
                         const std::function<uint64_t(const model::Glm5TensorSpec&)>& tensor_bytes,
                         model::LayerRange last, uint32_t slots, uint32_t context, uint32_t step_rows,
                         config::KvType latent);

}  // namespace ferry::gpu
