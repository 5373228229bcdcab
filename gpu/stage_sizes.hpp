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

// DSA layers among `layers`.
uint32_t dsa_layer_count(const model::Glm5Hparams& hp, model::LayerRange layers);
// The most positions a row's selection holds: index_topk rounded down to whole pools, plus the pool
// the row is in.
uint32_t max_selected_rows(const model::Glm5Hparams& hp);

// `latent`: the DSA latent rows' format (the indexer's rows are f32). `resident` (--kv-resident, 0:
// none): when smaller than `context`, each slot keeps that many latent rows per DSA layer on the device
// (gpu/kv_window.hpp), the rest in the host tier (kv_host_tier_bytes).
// `step_rows` (0: unbounded) sizes the ring of the indexer's per-token keys and gates
// (index_key_rows).
uint64_t stage_state_bytes(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t slots, uint32_t context,
                           config::KvType latent = config::KvType::f32, uint32_t resident = 0,
                           uint32_t step_rows = 0);
// Rows per slot and indexer layer of the per-token keys and gates on the device, a ring (position %
// rows): a step of at most `step_rows` rows makes the pools its rows complete, and the earliest of
// them starts at most kpool - 1 positions before the step; nothing else reads a token's key (the
// scores read pool keys). A rollback goes back at most to a step's start (a verify set's), so the
// ring still holds what it needs; a restore brings the incomplete pool's keys with the image
// (model/slot_state.hpp). `step_rows` 0 (the MTP block, whose restore keeps its own rows past any
// step): every position.
uint32_t index_key_rows(uint32_t context, uint32_t kpool, uint32_t step_rows);
// Latent rows per slot and DSA layer on the device: the window, or the whole context.
uint32_t device_latent_rows(uint32_t context, uint32_t resident);
// Host bytes of the stage's host KV tier (0 without a window: every row on the device).
uint64_t kv_host_tier_bytes(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t slots, uint32_t context,
                            config::KvType latent, uint32_t resident);
// Device bytes of the resident window's planner tables (gpu/window_planner.hpp; part of the state): per
// DSA layer and slot 4 B a token of the context (position -> frame) and 6 B a window row; 0 without a window.
uint64_t kv_window_table_bytes(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t slots,
                               uint32_t context, uint32_t resident);
// Device bytes of the prefill gather past the window (gpu/prefill_gather.hpp; part of the state): a
// staging of `resident` rows (and their keys), 4 B a token of the context per slot (the claims) and
// a step's rewritten selections; 0 without a window.
uint64_t kv_prefill_gather_bytes(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t slots,
                                 uint32_t context, config::KvType latent, uint32_t resident, uint32_t step_rows);
uint64_t stage_workspace_bytes(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t rows,
                               uint32_t context);
// The inbox of a stage that is not the first: one step's streams.
uint64_t stage_inbox_bytes(const model::Glm5Hparams& hp, uint32_t rows);

// A synthetic tensor's type: the one `rules` (--recipe) name for it, else `requested`; F32 where the
// catalogue keeps the tensor f32, Q8_0 (else F32) where its rows are not whole blocks of that type.
model::GgmlType synthetic_tensor_type(const model::Glm5TensorSpec& spec, model::GgmlType requested,
                                      const model::Glm5TypeRules& rules = {});

}  // namespace ferry::gpu
