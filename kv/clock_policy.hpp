#pragma once
// CLOCK (second chance) over a fixed number of frames: which rows a DSA layer's GPU resident window
// holds (kv/host_kv_tier.hpp says how the window and the host tier fit together). A key is a row's
// identity (slot and position, kv::row_key); a frame is a row of the window. Plain bookkeeping, no
// device: the stage copies what it says.
//
// Each step first pins the rows it needs (lookup of a resident row, place of a missing one); a pinned
// frame is never chosen as a victim, so every row one step attends to is resident at once. The hand
// sweeps the frames: a referenced frame loses its bit and is passed over, the first unreferenced,
// unpinned one is evicted. end_step() unpins. Free frames are taken lowest first, before any sweep.
// The device planner (gpu/window_plan.cu) follows the same rule on its own tables; export_slot() and
// import_slot() move a slot's state between them.
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

namespace ferry::kv {

constexpr uint64_t row_key(uint32_t slot, uint32_t position) { return (uint64_t{slot} << 32) | position; }
constexpr uint32_t key_slot(uint64_t key) { return static_cast<uint32_t>(key >> 32); }
constexpr uint32_t key_position(uint64_t key) { return static_cast<uint32_t>(key); }

struct ClockCounters {
  uint64_t hits = 0;       // lookups that found the row resident
  uint64_t misses = 0;     // rows placed (fetched)
  uint64_t evictions = 0;  // resident rows that made room
  uint64_t invalidated = 0;
};

class ClockPolicy {
 public:
  static constexpr uint32_t kNone = ~0u;

  explicit ClockPolicy(uint32_t frames);

  uint32_t frames() const { return static_cast<uint32_t>(frame_key_.size()); }
  uint32_t resident() const { return static_cast<uint32_t>(where_.size()); }
  const ClockCounters& counters() const { return counters_; }

  // The frame of a resident key, pinned and referenced (a hit); kNone when not resident (no count).
  uint32_t lookup(uint64_t key);
  struct Placement {
    uint32_t frame = kNone;            // kNone: every frame is pinned (the window is smaller than the step)
    std::optional<uint64_t> evicted;   // the key that frame held
  };
  // A frame for a key that is not resident: a free one, else the hand's victim; pinned (a miss).
  Placement place(uint64_t key);
  // The step is over: nothing is pinned.
  void end_step();
  // Forgets every key of `slot` at positions >= `from` (a truncated or rewritten slot; from 0: reset).
  void invalidate(uint32_t slot, uint32_t from);
  // The key a frame holds, if any.
  std::optional<uint64_t> key_of(uint32_t frame) const;
  uint32_t hand() const { return hand_; }

  // The state between steps (nothing pinned) of a clock that holds one slot's rows: per frame the
  // position it holds (-1: free) and its reference bit, and the hand. import_slot() replaces the
  // frames and the hand (the counters stay); it refuses a position held twice or a hand out of range.
  void export_slot(int32_t* positions, uint8_t* referenced) const;
  bool import_slot(uint32_t slot, const int32_t* positions, const uint8_t* referenced, uint32_t hand);

 private:
  static constexpr uint64_t kFree = ~uint64_t{0};
  std::vector<uint64_t> frame_key_;  // kFree when empty
  std::vector<uint8_t> referenced_, pinned_;
  std::vector<uint32_t> free_;  // a min-heap: the lowest free frame first
  std::vector<uint32_t> pinned_list_;
  std::unordered_map<uint64_t, uint32_t> where_;
  uint32_t hand_ = 0;
  ClockCounters counters_;
};

}  // namespace ferry::kv
