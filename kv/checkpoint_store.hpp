#pragma once
// One stage's prefix-cache checkpoints, by the id the scheduler's kv::PrefixCache gave them: each is
// the slot's fixed state (KDA conv and recurrent state; Stage::save_slot without rows) at its token
// boundary, and its rows [0, tokens) are either still the slot's own (the slot has only appended since)
// or, once the slot was spilled, a host copy of the slot's rows shared by every checkpoint that needed
// them. The index decides what to keep and when rows must be spilled; this holds, restores and drops
// images between a step's rows, on the stage's own thread.
//
// Why rows are shared and not copied per checkpoint: a copy of 32K rows of the 12-layer shape is
// 339 MiB and takes ~230 ms on an H200 (save_slot into pageable memory), which a same-again or a next
// turn would wait for; the fixed state is ~36 MiB. Rows are copied once, when the slot goes to
// another sequence. It goes only through save_slot / restore_slot, so the stage's row format stays the
// stage's business.
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>

#include "config/expected.hpp"
#include "model/stage.hpp"

namespace ferry::kv {

class CheckpointStore {
 public:
  // Saves `slot`'s fixed state as checkpoint `id` of `tokens` positions; its rows stay the slot's until
  // spill(). A slot that holds another count (a speculative step left rows past the confirmed ones) is
  // refused with invalid_plan: the checkpoint is not taken.
  Status save(model::Stage& stage, uint32_t slot, uint64_t id, uint32_t tokens);
  // Copies `slot`'s rows to host RAM once, for the checkpoints `ids` (all taken in that slot, each a
  // prefix of what it holds now).
  Status spill(model::Stage& stage, uint32_t slot, std::span<const uint64_t> ids);
  // Puts checkpoint `id` into `slot`: with spilled rows, into any slot (the rows first, then the state
  // cut back to the checkpoint); without, only into the slot it was taken in, whose rows [0, tokens)
  // must be unchanged since. The error names a missing id.
  Status restore(model::Stage& stage, uint32_t slot, uint64_t id) const;
  void drop(uint64_t id) { entries_.erase(id); }

  size_t size() const { return entries_.size(); }
  uint64_t bytes() const;  // of the images' data, each spilled row image once
  // The checkpoint's fixed state (tokens and size), or null.
  const model::SlotStateImage* find(uint64_t id) const;
  bool spilled(uint64_t id) const;
  // Its spilled rows (the slot's whole image when it was spilled), or null.
  const model::SlotStateImage* rows(uint64_t id) const;

 private:
  struct Entry {
    model::SlotStateImage state;                       // without rows
    std::shared_ptr<const model::SlotStateImage> rows;  // null while the rows are the slot's own
  };
  std::unordered_map<uint64_t, Entry> entries_;
};

}  // namespace ferry::kv
