#pragma once
// One stage's prefix-cache checkpoints: state images of its layers (Stage::save_slot with rows) in host
// RAM, by the id the scheduler's kv::PrefixCache gave them. The index decides what to keep; this only
// holds, restores and drops images, between a step's rows, on the stage's own thread.
//
// Each checkpoint is a whole copy (rows [0, tokens) included), not a reference to rows shared along a
// conversation: save_slot copies them out of the device either way, a copy keeps the byte budget a
// plain sum, and it outlives its slot being reused. It goes only through save_slot / restore_slot, so
// the stage's own row format (f32 today, INT8 in host tiers later) stays the stage's business.
#include <cstdint>
#include <unordered_map>

#include "config/expected.hpp"
#include "model/stage.hpp"

namespace ferry::kv {

class CheckpointStore {
 public:
  // Saves `slot`'s state on `stage` as checkpoint `id` (a second save of one id replaces the first).
  Status save(model::Stage& stage, uint32_t slot, uint64_t id);
  // Puts checkpoint `id` into `slot` (any slot: the rows come with it). The error names a missing id.
  Status restore(model::Stage& stage, uint32_t slot, uint64_t id) const;
  void drop(uint64_t id) { images_.erase(id); }

  size_t size() const { return images_.size(); }
  uint64_t bytes() const;  // of the images' data
  const model::SlotStateImage* find(uint64_t id) const;

 private:
  std::unordered_map<uint64_t, model::SlotStateImage> images_;
};

}  // namespace ferry::kv
