#pragma once
// One DSA layer's GPU resident window over the host KV tier (kv/host_kv_tier.hpp), as plain host
// bookkeeping: `frames` rows per slot, each slot's rows chosen by its own ClockPolicy. A step's
// selections (token positions per query row) become window rows for the attention to read (slot *
// frames + frame) and a fetch list (which host row goes to which window row) for the stage to copy
// before the attention runs. Rows are planned in groups: a group is as many consecutive query rows as
// the window holds pinned at once (CLOCK never evicts a row the group attends to); the stage runs the
// attention once per group.
#include <cstdint>
#include <vector>

#include "config/expected.hpp"
#include "kv/clock_policy.hpp"

namespace ferry::kv {

struct WindowFetch {
  uint32_t slot = 0, position = 0;
  uint32_t row = 0;  // window row: slot * frames + frame
};

struct WindowCounters {
  uint64_t hits = 0, misses = 0;  // selected rows found resident, and fetched
};

class ResidentWindow {
 public:
  ResidentWindow(uint32_t slots, uint32_t frames);

  uint32_t frames() const { return frames_; }
  uint32_t slots() const { return static_cast<uint32_t>(clocks_.size()); }
  // Rows of `slot` resident now.
  uint32_t resident(uint32_t slot) const { return clocks_[slot].resident(); }
  WindowCounters counters() const;

  // One query row: its slot and its selected positions.
  struct Query {
    uint32_t slot = 0;
    const int32_t* positions = nullptr;
    int32_t count = 0;
  };
  // Plans query rows [first, end) for as many as fit, from `first`: writes row q's window rows at
  // rows_out + q * stride and appends the fetches. Returns the group's end (> first), or an error
  // when row `first` alone selects more rows than a slot's window holds, or a position is negative.
  // The group's rows stay pinned until end_group().
  Expected<uint32_t> plan(const std::vector<Query>& queries, uint32_t first, int32_t* rows_out, uint32_t stride,
                          std::vector<WindowFetch>& fetches);
  void end_group();

  // A slot starts over with nothing resident.
  void reset(uint32_t slot);
  // The slot's positions [0, n) are in frames [0, n) (n <= frames): a slot that lived wholly in the
  // window until now (position p at frame p) and is handed to CLOCK.
  void adopt_identity(uint32_t slot, uint32_t n);
  // Rows of `slot` at positions >= from are gone (a truncated or rewritten slot).
  void invalidate(uint32_t slot, uint32_t from) { clocks_[slot].invalidate(slot, from); }
  // The slot's clock, for moving its state to and from the device planner.
  ClockPolicy& clock(uint32_t slot) { return clocks_[slot]; }

 private:
  uint32_t frames_;
  std::vector<ClockPolicy> clocks_;
  std::vector<uint8_t> touched_;
  WindowCounters base_;   // counts of the clocks that reset() replaced
  uint64_t adopted_ = 0;  // placements of adopt_identity(): counted by the clocks, not fetches
};

}  // namespace ferry::kv
