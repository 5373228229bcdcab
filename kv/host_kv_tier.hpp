#pragma once
// The host KV tier: every slot's full logical DSA latent rows, in host memory (pinned on CUDA) within
// a budget, for the layers of one stage.
//
// How the tiers fit the stage and the slot state (the CUDA stage's window is gpu/kv_window.hpp, its
// planning kv/resident_window.hpp):
// - Rows: one per token per DSA layer, kv_lora_rank wide, in the stage's KV format (config/kv_type.hpp,
//   kv/kv_codec.hpp). The indexer's pool keys stay on the device whole (context / kpool rows of
//   index_dim f32: small), so scoring never waits for the host; the per-token indexer keys and gates
//   are only needed for the pool being filled.
// - Host tier (this class): slot s, layer l, position p has a fixed place, allocated up front for
//   max_tokens rows per slot, so that the budget is checked once at start-up (create() refuses a budget
//   that cannot hold the slots, naming it) and a row is never moved. A stage writes each step's new
//   rows here as well as on the device (prefill does it from the copy stream).
// - Resident window (per DSA layer on the device, `--kv-resident` rows): a ClockPolicy
//   (kv/clock_policy.hpp) maps (slot, position) keys to window frames. Per step the indexer selects
//   rows; resident ones are pinned (hits), missing ones are placed (misses) and copied from here
//   before attention (on the compute stream, by a kernel reading this memory through the device's
//   view); attention reads frames through a per-row frame table. A context no longer than the window
//   lives wholly on the device, every row where it was written, and never comes here.
// - Invalidation, the same on both tiers: write() at a position before a slot's end (a rewritten
//   prefix) and truncate() drop exactly the rows from the cut on, in every layer, and tell the
//   listeners (the windows' ClockPolicy::invalidate) the slot and the cut; reset() is a cut at 0.
//   Slots never share rows: keys carry the slot.
// - Slot state images (model/slot_state.hpp) are unchanged by the tiers: a save reads the logical
//   rows [0, tokens) (from here once the window exists), a restore writes them back through write(),
//   which invalidates what followed.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "config/expected.hpp"
#include "config/kv_type.hpp"

namespace ferry::kv {

struct HostKvShape {
  uint32_t slots = 0;
  uint32_t layers = 0;      // DSA layers of the stage
  uint32_t max_tokens = 0;  // rows per slot and layer (--ctx)
  uint32_t width = 0;       // kv_lora_rank
  config::KvType type = config::KvType::int8;
};

// Where the tier's memory comes from: plain host memory unless a backend gives its own (pinned).
struct HostAllocator {
  std::function<void*(uint64_t bytes)> allocate;  // nullptr when it cannot
  std::function<void(void*)> release;
};

class HostKvTier {
 public:
  // Bytes the tier of this shape allocates.
  static uint64_t bytes_for(const HostKvShape& shape);
  // A tier within `budget` bytes; refused when the shape needs more (the message names the budget,
  // the numbers and what to lower) or the allocator has no room.
  static Expected<std::unique_ptr<HostKvTier>> create(const HostKvShape& shape, uint64_t budget,
                                                      HostAllocator allocator = {});
  ~HostKvTier();
  HostKvTier(const HostKvTier&) = delete;
  HostKvTier& operator=(const HostKvTier&) = delete;

  const HostKvShape& shape() const { return shape_; }
  uint32_t tokens(uint32_t slot, uint32_t layer) const { return tokens_[index(slot, layer)]; }
  // Bytes of rows a slot holds now, over its layers.
  uint64_t slot_bytes(uint32_t slot) const;
  uint64_t capacity_bytes() const { return bytes_; }

  // Rows [pos, pos + n) of (slot, layer), row i at src + i * stride. pos may not pass the layer's end;
  // before it, the rows from pos on are invalidated first in every layer (a rewritten prefix).
  Status write(uint32_t slot, uint32_t layer, uint32_t pos, const float* src, uint32_t n, uint64_t stride);
  // Rows [pos, pos + n) of (slot, layer) for a caller that writes them already encoded (a device
  // copy): the same checks and invalidation as write(), then the layer holds pos + n rows. `data`
  // holds n rows of width elements, `scales` (int8, else nullptr) n floats; both contiguous.
  struct RawRows {
    void* data = nullptr;
    float* scales = nullptr;
  };
  Expected<RawRows> claim(uint32_t slot, uint32_t layer, uint32_t pos, uint32_t n);
  // Every layer of the slot keeps rows [0, t) (t at or past the end changes nothing).
  void truncate(uint32_t slot, uint32_t t);
  void reset(uint32_t slot) { truncate(slot, 0); }
  // Row `pos` of (slot, layer) as floats. Precondition: pos < tokens(slot, layer).
  void decode(uint32_t slot, uint32_t layer, uint32_t pos, float* out) const;
  // The stored row (f32 values, f16 bits or int8 codes) and its int8 scale (nullptr otherwise): what
  // a fetch copies to the device.
  const void* row_data(uint32_t slot, uint32_t layer, uint32_t pos) const;
  const float* row_scale(uint32_t slot, uint32_t layer, uint32_t pos) const;

  // The whole allocation (for mapping it into a device's address space).
  void* memory() const { return memory_; }

  // Called with (slot, cut) whenever rows from `cut` on are invalidated.
  void on_invalidate(std::function<void(uint32_t slot, uint32_t cut)> listener) { listeners_.push_back(std::move(listener)); }

 private:
  HostKvTier(const HostKvShape& shape, HostAllocator allocator, uint8_t* memory);
  size_t index(uint32_t slot, uint32_t layer) const { return size_t{slot} * shape_.layers + layer; }
  uint8_t* data_at(uint32_t slot, uint32_t layer, uint32_t pos) const;
  float* scale_at(uint32_t slot, uint32_t layer, uint32_t pos) const;

  HostKvShape shape_;
  HostAllocator allocator_;
  uint8_t* memory_ = nullptr;
  uint64_t bytes_ = 0, data_bytes_ = 0;  // all of it; the rows' part (int8 scales follow it)
  std::vector<uint32_t> tokens_;         // per (slot, layer)
  std::vector<std::function<void(uint32_t, uint32_t)>> listeners_;
};

}  // namespace ferry::kv
