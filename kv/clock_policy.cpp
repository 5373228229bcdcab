#include "kv/clock_policy.hpp"

namespace ferry::kv {

ClockPolicy::ClockPolicy(uint32_t frames)
    : frame_key_(frames, kFree), referenced_(frames, 0), pinned_(frames, 0) {
  free_.reserve(frames);
  for (uint32_t f = frames; f > 0; --f) free_.push_back(f - 1);  // frame 0 first
}

uint32_t ClockPolicy::lookup(uint64_t key) {
  auto it = where_.find(key);
  if (it == where_.end()) return kNone;
  const uint32_t f = it->second;
  referenced_[f] = 1;
  if (!pinned_[f]) {
    pinned_[f] = 1;
    pinned_list_.push_back(f);
  }
  ++counters_.hits;
  return f;
}

ClockPolicy::Placement ClockPolicy::place(uint64_t key) {
  Placement p;
  if (!free_.empty()) {
    p.frame = free_.back();
    free_.pop_back();
  } else {
    // Two sweeps at most: the first clears every reference bit it passes.
    const uint32_t n = frames();
    for (uint32_t seen = 0; seen < 2 * n; ++seen) {
      const uint32_t f = hand_;
      hand_ = hand_ + 1 == n ? 0 : hand_ + 1;
      if (pinned_[f]) continue;
      if (referenced_[f]) {
        referenced_[f] = 0;
        continue;
      }
      p.frame = f;
      break;
    }
    if (p.frame == kNone) return p;
    p.evicted = frame_key_[p.frame];
    where_.erase(frame_key_[p.frame]);
    ++counters_.evictions;
  }
  frame_key_[p.frame] = key;
  where_[key] = p.frame;
  referenced_[p.frame] = 1;
  pinned_[p.frame] = 1;
  pinned_list_.push_back(p.frame);
  ++counters_.misses;
  return p;
}

void ClockPolicy::end_step() {
  for (uint32_t f : pinned_list_) pinned_[f] = 0;
  pinned_list_.clear();
}

void ClockPolicy::invalidate(uint32_t slot, uint32_t from) {
  for (uint32_t f = 0; f < frames(); ++f) {
    const uint64_t k = frame_key_[f];
    if (k == kFree || key_slot(k) != slot || key_position(k) < from) continue;
    where_.erase(k);
    frame_key_[f] = kFree;
    referenced_[f] = 0;
    free_.push_back(f);
    ++counters_.invalidated;
  }
}

std::optional<uint64_t> ClockPolicy::key_of(uint32_t frame) const {
  if (frame >= frames() || frame_key_[frame] == kFree) return std::nullopt;
  return frame_key_[frame];
}

}  // namespace ferry::kv
