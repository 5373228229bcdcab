#pragma once
// What a CUDA stage allocates, computed without a device: its slots' state, its step workspace, its
// hand-off inbox, and the type and size of each tensor of a synthetic model. The stage allocates
// exactly these (tests/gpu check it), and the memory plan adds them up before anything is allocated.
#include <cstdint>

#include "config/kv_type.hpp"
#include "gpu/sample_scratch.hpp"
#include "model/formats/ggml_type.hpp"
#include "model/glm5/glm5_hparams.hpp"
#include "model/glm5/glm5_tensors.hpp"
#include "model/glm5/glm5_type_rules.hpp"
#include "model/stage.hpp"

namespace ferry::gpu {

// `latent`: the DSA latent rows' format (the indexer's rows are f32).
uint64_t stage_state_bytes(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t slots, uint32_t context,
                           config::KvType latent = config::KvType::f32);
uint64_t stage_workspace_bytes(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t rows,
                               uint32_t context);
// The inbox of a stage that is not the first: one step's streams.
uint64_t stage_inbox_bytes(const model::Glm5Hparams& hp, uint32_t rows);

// A synthetic tensor's type: the one `rules` (--recipe) name for it, else `requested`; F32 where the
// catalogue keeps the tensor f32, Q8_0 (else F32) where its rows are not whole blocks of that type.
model::GgmlType synthetic_tensor_type(const model::Glm5TensorSpec& spec, model::GgmlType requested,
                                      const model::Glm5TypeRules& rules = {});

}  // namespace ferry::gpu
