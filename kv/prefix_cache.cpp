#include "kv/prefix_cache.hpp"

#include <xxhash.h>

#include <algorithm>
#include <functional>

namespace ferry::kv {

uint64_t xxhash_block(uint64_t previous, std::span<const int32_t> block) {
  return XXH64(block.data(), block.size_bytes(), previous);
}

PrefixCache::PrefixCache(uint64_t budget_bytes, uint32_t block_tokens, BlockHasher hasher)
    : budget_(budget_bytes), block_(std::max<uint32_t>(1, block_tokens)), hasher_(std::move(hasher)) {}

std::vector<uint64_t> PrefixCache::chain(std::span<const int32_t> tokens, size_t blocks) const {
  std::vector<uint64_t> out;
  out.reserve(blocks);
  uint64_t h = 0;
  for (size_t j = 0; j < blocks; ++j) {
    h = hasher_(h, tokens.subspan(j * block_, block_));
    out.push_back(h);
  }
  return out;
}

std::optional<PrefixCache::Inserted> PrefixCache::insert(std::vector<int32_t> tokens, uint32_t slot, uint64_t bytes) {
  const size_t blocks = tokens.size() / block_;
  const std::vector<uint64_t> hashes = chain(tokens, blocks);
  const uint64_t key = blocks == 0 ? 0 : hashes.back();
  if (auto it = by_key_.find(key); it != by_key_.end()) {
    for (CheckpointId id : it->second) {
      Entry& e = entries_.at(id);
      if (e.tokens == tokens) {
        e.last_use = ++clock_;
        return std::nullopt;
      }
    }
  }
  bytes += tokens.size() * sizeof(int32_t);
  if (bytes > budget_) return std::nullopt;
  // Evict in LRU order among the unheld until it fits; if the held ones leave no room, evict nothing.
  std::vector<const Entry*> unheld;
  uint64_t freeable = 0;
  for (const auto& [id, e] : entries_) {
    if (e.info.refs == 0) {
      unheld.push_back(&e);
      freeable += e.info.bytes;
    }
  }
  if (used_ + bytes > budget_ + freeable) return std::nullopt;
  std::sort(unheld.begin(), unheld.end(), [](const Entry* a, const Entry* b) { return a->last_use < b->last_use; });
  Inserted out;
  uint64_t freed = 0;
  for (const Entry* e : unheld) {
    if (used_ - freed + bytes <= budget_) break;
    freed += e->info.bytes;
    out.evicted.push_back(e->info.id);
  }
  for (CheckpointId id : out.evicted) erase(id);
  out.id = next_id_++;
  Entry e;
  e.info = CheckpointInfo{out.id, slot, static_cast<uint32_t>(tokens.size()), bytes, 1, false};
  e.tokens = std::move(tokens);
  e.key = key;
  e.last_use = ++clock_;
  by_key_[key].push_back(out.id);
  used_ += bytes;
  entries_.emplace(out.id, std::move(e));
  return out;
}

void PrefixCache::ready(CheckpointId id) {
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.info.ready) return;
  it->second.info.ready = true;
  release(id);
}

std::optional<CheckpointMatch> PrefixCache::longest_match(std::span<const int32_t> prompt, uint32_t max_tokens) const {
  const size_t limit = std::min<size_t>(prompt.size(), max_tokens);
  const size_t blocks = limit / block_;
  const std::vector<uint64_t> hashes = chain(prompt, blocks);
  // A checkpoint under j whole blocks has fewer tokens than any under j + 1: the first j (from the
  // top) with a verified hit holds the longest.
  for (size_t j = blocks + 1; j-- > 0;) {
    const auto it = by_key_.find(j == 0 ? 0 : hashes[j - 1]);
    if (it == by_key_.end()) continue;
    const Entry* best = nullptr;
    for (CheckpointId id : it->second) {
      const Entry& e = entries_.at(id);
      const size_t t = e.tokens.size();
      if (!e.info.ready || t / block_ != j || t > limit || (best != nullptr && t <= best->tokens.size())) continue;
      if (std::equal(e.tokens.begin(), e.tokens.end(), prompt.begin())) best = &e;
    }
    if (best != nullptr) return CheckpointMatch{best->info.id, best->info.tokens, best->info.slot};
  }
  return std::nullopt;
}

void PrefixCache::acquire(CheckpointId id) {
  if (auto it = entries_.find(id); it != entries_.end()) ++it->second.info.refs;
}

void PrefixCache::release(CheckpointId id) {
  if (auto it = entries_.find(id); it != entries_.end() && it->second.info.refs > 0) --it->second.info.refs;
}

void PrefixCache::touch(CheckpointId id) {
  if (auto it = entries_.find(id); it != entries_.end()) it->second.last_use = ++clock_;
}

void PrefixCache::unlink(const Entry& e) {
  auto it = by_key_.find(e.key);
  if (it == by_key_.end()) return;
  std::erase(it->second, e.info.id);
  if (it->second.empty()) by_key_.erase(it);
}

bool PrefixCache::erase(CheckpointId id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  unlink(it->second);
  used_ -= it->second.info.bytes;
  entries_.erase(it);
  return true;
}

std::vector<CheckpointId> PrefixCache::erase_slot(uint32_t slot) {
  std::vector<CheckpointId> out;  // ids grow in the order of taking
  for (const auto& [id, e] : entries_) {
    if (e.info.slot == slot) out.push_back(id);
  }
  std::sort(out.begin(), out.end(), std::greater<>());
  for (CheckpointId id : out) erase(id);
  return out;
}

const CheckpointInfo* PrefixCache::find(CheckpointId id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second.info;
}

}  // namespace ferry::kv
