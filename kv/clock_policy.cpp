#include "kv/clock_policy.hpp"

#include <algorithm>
#include <functional>

namespace ferry::kv {

ClockPolicy::ClockPolicy(uint32_t frames)
    : frame_key_(frames, kFree), referenced_(frames, 0), pinned_(frames, 0) {
  free_.reserve(frames);
  for (uint32_t f = 0; f < frames; ++f) free_.push_back(f);  // ascending: already a min-heap
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
    std::pop_heap(free_.begin(), free_.end(), std::greater<>());
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
    std::push_heap(free_.begin(), free_.end(), std::greater<>());
    ++counters_.invalidated;
  }
}

std::optional<uint64_t> ClockPolicy::key_of(uint32_t frame) const {
  if (frame >= frames() || frame_key_[frame] == kFree) return std::nullopt;
  return frame_key_[frame];
}

void ClockPolicy::export_slot(int32_t* positions, uint8_t* referenced) const {
  for (uint32_t f = 0; f < frames(); ++f) {
    positions[f] = frame_key_[f] == kFree ? -1 : static_cast<int32_t>(key_position(frame_key_[f]));
    referenced[f] = referenced_[f];
  }
}

bool ClockPolicy::import_slot(uint32_t slot, const int32_t* positions, const uint8_t* referenced, uint32_t hand) {
  const uint32_t n = frames();
  if (hand >= n && n > 0) return false;
  std::unordered_map<uint64_t, uint32_t> where;
  for (uint32_t f = 0; f < n; ++f) {
    if (positions[f] >= 0 && !where.emplace(row_key(slot, static_cast<uint32_t>(positions[f])), f).second) return false;
  }
  end_step();
  where_ = std::move(where);
  free_.clear();
  for (uint32_t f = 0; f < n; ++f) {
    frame_key_[f] = positions[f] < 0 ? kFree : row_key(slot, static_cast<uint32_t>(positions[f]));
    referenced_[f] = positions[f] < 0 ? 0 : referenced[f];
    if (positions[f] < 0) free_.push_back(f);  // ascending: a min-heap
  }
  hand_ = hand;
  return true;
}

}  // namespace ferry::kv
