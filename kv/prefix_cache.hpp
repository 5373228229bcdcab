#pragma once
// The prefix cache's index (STYLE rules 4 and 6): which checkpoints exist, for which token prefix, how
// many bytes they take and who holds them; no state images, no actors. A checkpoint is a copy of a
// slot's whole state after its first `tokens` tokens (kv::CheckpointStore keeps the images on each
// stage); GLM-5.3's KDA layers carry a recurrent state that cannot be rolled back, so a cached prefix
// can only be resumed where a checkpoint was taken, never at an arbitrary shorter length.
//
// Keys are hash chains over whole blocks of `block_tokens` tokens (h_j = XXH64(block j, seed h_{j-1}));
// a checkpoint of T tokens is filed under the chain of its floor(T / block) whole blocks and keeps its
// tokens, which a hit compares in full (a hash collision is caught there, and the tokens after the last
// whole block are checked the same way). The longest match over every checkpoint of every slot wins.
//
// Room: checkpoints live within a byte budget; making room evicts the least recently used one that
// nobody holds (reference count 0). A pending checkpoint (its save not yet done on the stages) is held
// until it lands and is never matched.
//
// It lives in kv/ (ARCHITECTURE: kv/ owns "checkpoints for the prefix cache") next to the store of the
// images; the scheduler's planner owns one.
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace ferry::kv {

using CheckpointId = uint64_t;

// The chain hash of one block given the previous block's (0 before the first block).
using BlockHasher = std::function<uint64_t(uint64_t previous, std::span<const int32_t> block)>;
uint64_t xxhash_block(uint64_t previous, std::span<const int32_t> block);

struct CheckpointInfo {
  CheckpointId id = 0;
  uint32_t slot = 0;    // the slot it was taken in: releasing that slot frees it
  uint32_t tokens = 0;  // prefix length
  uint64_t bytes = 0;
  uint32_t refs = 0;    // holders: a pending save, a restore in flight
  bool ready = false;   // saved on every stage
};

struct CheckpointMatch {
  CheckpointId id = 0;
  uint32_t tokens = 0;
  uint32_t slot = 0;
};

class PrefixCache {
 public:
  explicit PrefixCache(uint64_t budget_bytes, uint32_t block_tokens = 64, BlockHasher hasher = xxhash_block);

  struct Inserted {
    CheckpointId id = 0;
    std::vector<CheckpointId> evicted;  // to drop from the stores, in eviction order
  };
  // A new pending checkpoint (held once, not matched until ready()) of `tokens`, taken in `slot`, of
  // `bytes` (its state; the kept tokens are added). Evicts least recently used unheld ones for room.
  // Nothing when it cannot fit (larger than the budget, or held ones fill it) or when an identical
  // prefix is already cached (that one is touched instead): the caller then takes no checkpoint.
  std::optional<Inserted> insert(std::vector<int32_t> tokens, uint32_t slot, uint64_t bytes);
  // The save landed on every stage: matchable, and the insert's hold is released.
  void ready(CheckpointId id);
  // The longest ready checkpoint whose tokens are a prefix of `prompt`, of at most `max_tokens`.
  std::optional<CheckpointMatch> longest_match(std::span<const int32_t> prompt, uint32_t max_tokens) const;

  void acquire(CheckpointId id);
  void release(CheckpointId id);
  // Marks it most recently used.
  void touch(CheckpointId id);
  // Forgets a checkpoint (held or not): its save failed, or its slot was released. False if unknown.
  bool erase(CheckpointId id);
  // Every checkpoint taken in `slot`, newest first (freed in reverse order of taking): the ids erased.
  std::vector<CheckpointId> erase_slot(uint32_t slot);

  const CheckpointInfo* find(CheckpointId id) const;
  size_t size() const { return entries_.size(); }
  uint64_t used_bytes() const { return used_; }
  uint64_t budget_bytes() const { return budget_; }
  uint32_t block_tokens() const { return block_; }

 private:
  struct Entry {
    CheckpointInfo info;
    std::vector<int32_t> tokens;
    uint64_t key = 0;     // the chain hash of its whole blocks
    uint64_t last_use = 0;
  };
  // h_1..h_n of the first n whole blocks of `tokens` (h_0 = 0 is not stored).
  std::vector<uint64_t> chain(std::span<const int32_t> tokens, size_t blocks) const;
  void unlink(const Entry& e);

  uint64_t budget_;
  uint32_t block_;
  BlockHasher hasher_;
  std::unordered_map<CheckpointId, Entry> entries_;
  std::unordered_map<uint64_t, std::vector<CheckpointId>> by_key_;
  uint64_t used_ = 0;
  uint64_t clock_ = 0;
  CheckpointId next_id_ = 1;
};

}  // namespace ferry::kv
