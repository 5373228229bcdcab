#pragma once
// A slot state of `tokens` positions drawn at random in a stage's layout (bench --fill random): every
// part a prefill of that many tokens would leave (KDA state, DSA latent rows in the layout's KV format,
// indexer keys, gates and pool keys), with values no forward pass computed. A decode after it reads as
// many rows and scores as many pools as after a real prefill, so its speed is the depth's speed; what
// the indexer selects (and so a resident window's hit rate) is not what real text gives. Speed only.
#include <cstdint>

#include "model/slot_state.hpp"

namespace ferry::kv {

// Values in [-1, 1) (KDA state scaled by 1/64); int8 rows whole codes in [-127, 127] with a scale in
// (0, 0.02]; f16 rows exact halves. Deterministic in `seed`.
model::SlotStateImage random_slot_state(const model::SlotStateLayout& layout, uint32_t tokens, uint64_t seed);

}  // namespace ferry::kv
