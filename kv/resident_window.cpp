#include "kv/resident_window.hpp"

#include <string>

namespace ferry::kv {

ResidentWindow::ResidentWindow(uint32_t slots, uint32_t frames)
    : frames_(frames), clocks_(slots, ClockPolicy(frames)), touched_(slots, 0) {}

WindowCounters ResidentWindow::counters() const {
  WindowCounters c = base_;
  for (const ClockPolicy& p : clocks_) {
    c.hits += p.counters().hits;
    c.misses += p.counters().misses;
  }
  c.misses -= adopted_;
  return c;
}

Expected<uint32_t> ResidentWindow::plan(const std::vector<Query>& queries, uint32_t first, int32_t* rows_out,
                                        uint32_t stride, std::vector<WindowFetch>& fetches) {
  uint32_t q = first;
  for (; q < queries.size(); ++q) {
    const Query& row = queries[q];
    ClockPolicy& clock = clocks_[row.slot];
    touched_[row.slot] = 1;
    int32_t* out = rows_out + size_t{q} * stride;
    // First the row's hits are pinned, then its misses placed in selection order: a miss never
    // evicts a row the same row selected (the device planner's order, gpu/window_plan.cu).
    for (int32_t i = 0; i < row.count; ++i) {
      if (row.positions[i] < 0) {
        return Error(ErrorCode::internal, "resident window: query row " + std::to_string(q) + " selected position " +
                                              std::to_string(row.positions[i]));
      }
      const uint32_t frame = clock.lookup(row_key(row.slot, static_cast<uint32_t>(row.positions[i])));
      out[i] = frame == ClockPolicy::kNone ? -1 : static_cast<int32_t>(row.slot * frames_ + frame);
    }
    for (int32_t i = 0; i < row.count; ++i) {
      if (out[i] >= 0) continue;
      const auto pos = static_cast<uint32_t>(row.positions[i]);
      const uint64_t key = row_key(row.slot, pos);
      uint32_t frame = clock.lookup(key);  // a position the row selected twice
      if (frame == ClockPolicy::kNone) {
        const ClockPolicy::Placement p = clock.place(key);
        if (p.frame == ClockPolicy::kNone) {
          // Every frame is pinned by this group: the row starts the next one (what it placed so far
          // is fetched with this group and stays resident).
          if (q == first) {
            return Error(ErrorCode::invalid_plan, "resident window: one query row selects " + std::to_string(row.count) +
                                                      " rows, more than the " + std::to_string(frames_) +
                                                      " a slot's window holds");
          }
          return q;
        }
        frame = p.frame;
        fetches.push_back({row.slot, pos, row.slot * frames_ + frame});
      }
      out[i] = static_cast<int32_t>(row.slot * frames_ + frame);
    }
  }
  return q;
}

void ResidentWindow::end_group() {
  for (size_t s = 0; s < clocks_.size(); ++s) {
    if (touched_[s]) clocks_[s].end_step();
    touched_[s] = 0;
  }
}

void ResidentWindow::reset(uint32_t slot) {
  base_.hits += clocks_[slot].counters().hits;
  base_.misses += clocks_[slot].counters().misses;
  clocks_[slot] = ClockPolicy(frames_);
  touched_[slot] = 0;
}

void ResidentWindow::adopt_identity(uint32_t slot, uint32_t n) {
  reset(slot);
  ClockPolicy& clock = clocks_[slot];
  for (uint32_t p = 0; p < n && p < frames_; ++p) clock.place(row_key(slot, p));  // a fresh clock fills frame 0 up
  clock.end_step();
  adopted_ += clock.counters().misses;  // written in place, not fetched
}

}  // namespace ferry::kv
