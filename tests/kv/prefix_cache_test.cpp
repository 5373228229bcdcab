// The prefix cache's index without a GPU: longest match over all slots' checkpoints, token checks on
// a hit (a forced hash collision), LRU eviction within the budget, and holds that block eviction.
#include "kv/prefix_cache.hpp"

#include <gtest/gtest.h>

#include <numeric>

using namespace ferry::kv;

namespace {

std::vector<int32_t> seq(size_t n, int32_t first = 1) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<int32_t> prefix(const std::vector<int32_t>& v, size_t n) { return {v.begin(), v.begin() + static_cast<ptrdiff_t>(n)}; }

// Inserts and lands a checkpoint; its id.
CheckpointId add(PrefixCache& c, std::vector<int32_t> tokens, uint32_t slot, uint64_t bytes = 0) {
  auto in = c.insert(std::move(tokens), slot, bytes);
  EXPECT_TRUE(in.has_value());
  if (!in) return 0;
  c.ready(in->id);
  return in->id;
}

}  // namespace

TEST(PrefixCache, LongestMatchAcrossSlotsOnAndOffBlockBoundaries) {
  PrefixCache c(1 << 20, 4);
  const auto conv = seq(40);
  add(c, prefix(conv, 8), 0);    // on a block boundary
  add(c, prefix(conv, 21), 1);   // off one
  add(c, prefix(conv, 13), 2);
  auto other = seq(30, 500);
  add(c, other, 0);

  auto m = c.longest_match(conv, 39);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->tokens, 21u);
  EXPECT_EQ(m->slot, 1u);
  // A prompt that diverges at token 15 resumes from the checkpoint below it.
  auto diverged = conv;
  diverged[15] = 9999;
  m = c.longest_match(diverged, 39);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->tokens, 13u);
  // max_tokens caps the match (a request must keep one prompt token to compute).
  m = c.longest_match(conv, 20);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->tokens, 13u);
  // A divergence inside the tail of a partial block is seen by the token check.
  diverged = conv;
  diverged[20] = 9999;
  m = c.longest_match(diverged, 39);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->tokens, 13u);
  EXPECT_FALSE(c.longest_match(seq(40, 2), 39));
  m = c.longest_match(other, 30);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->tokens, 30u);
}

TEST(PrefixCache, PendingCheckpointsAreNotMatched) {
  PrefixCache c(1 << 20, 4);
  auto in = c.insert(seq(16), 0, 0);
  ASSERT_TRUE(in);
  EXPECT_FALSE(c.longest_match(seq(20), 19));
  c.ready(in->id);
  EXPECT_TRUE(c.longest_match(seq(20), 19));
}

TEST(PrefixCache, HashCollisionIsCaughtByTheTokenCheck) {
  // Every chain collides: the index files everything under one key, only the tokens tell them apart.
  PrefixCache c(1 << 20, 4, [](uint64_t, std::span<const int32_t>) { return uint64_t{42}; });
  add(c, seq(16, 100), 0);
  EXPECT_FALSE(c.longest_match(seq(20, 1), 19));
  add(c, seq(16, 1), 1);
  auto m = c.longest_match(seq(20, 1), 19);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->slot, 1u);
  EXPECT_EQ(m->tokens, 16u);
}

TEST(PrefixCache, EvictsLeastRecentlyUsedWithinTheBudget) {
  // Each checkpoint: 100 bytes of state + 8 tokens of 4 bytes = 132; room for three.
  PrefixCache c(3 * 132, 4);
  const CheckpointId a = add(c, seq(8, 1), 0, 100);
  const CheckpointId b = add(c, seq(8, 100), 0, 100);
  const CheckpointId d = add(c, seq(8, 200), 1, 100);
  EXPECT_EQ(c.used_bytes(), 3u * 132);
  c.touch(a);  // b is now the oldest
  auto in = c.insert(seq(8, 300), 2, 100);
  ASSERT_TRUE(in);
  ASSERT_EQ(in->evicted.size(), 1u);
  EXPECT_EQ(in->evicted[0], b);
  EXPECT_EQ(c.find(b), nullptr);
  EXPECT_NE(c.find(a), nullptr);
  EXPECT_NE(c.find(d), nullptr);
  EXPECT_EQ(c.used_bytes(), 3u * 132);
  c.ready(in->id);
  // Larger than the whole budget: refused, nothing evicted.
  EXPECT_FALSE(c.insert(seq(8, 400), 0, 1000));
  EXPECT_EQ(c.size(), 3u);
}

TEST(PrefixCache, HeldCheckpointsAreNotEvicted) {
  PrefixCache c(2 * 132, 4);
  const CheckpointId a = add(c, seq(8, 1), 0, 100);
  const CheckpointId b = add(c, seq(8, 100), 0, 100);
  c.acquire(a);
  c.acquire(b);
  // Both held (restores in flight): no room, and nothing evicted.
  EXPECT_FALSE(c.insert(seq(8, 200), 1, 100));
  EXPECT_EQ(c.size(), 2u);
  c.release(a);
  auto in = c.insert(seq(8, 200), 1, 100);
  ASSERT_TRUE(in);
  EXPECT_EQ(in->evicted, std::vector<CheckpointId>{a});
  // A pending checkpoint holds itself until it lands.
  c.release(b);
  EXPECT_EQ(c.find(in->id)->refs, 1u);
  auto next = c.insert(seq(8, 300), 1, 100);
  ASSERT_TRUE(next);
  EXPECT_EQ(next->evicted, std::vector<CheckpointId>{b});
  EXPECT_NE(c.find(in->id), nullptr);
}

TEST(PrefixCache, IdenticalPrefixIsNotCachedTwice) {
  PrefixCache c(1 << 20, 4);
  add(c, seq(12), 0, 10);
  const uint64_t used = c.used_bytes();
  EXPECT_FALSE(c.insert(seq(12), 1, 10));
  EXPECT_EQ(c.used_bytes(), used);
  EXPECT_EQ(c.size(), 1u);
}

TEST(PrefixCache, EraseSlotFreesItsCheckpointsNewestFirst) {
  PrefixCache c(1 << 20, 4);
  const CheckpointId a = add(c, seq(8), 0);
  const CheckpointId b = add(c, seq(16), 1);
  const CheckpointId d = add(c, seq(24), 0);
  EXPECT_EQ(c.erase_slot(0), (std::vector<CheckpointId>{d, a}));
  EXPECT_EQ(c.size(), 1u);
  EXPECT_NE(c.find(b), nullptr);
  auto m = c.longest_match(seq(30), 29);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->id, b);
  EXPECT_TRUE(c.erase_slot(0).empty());
  EXPECT_TRUE(c.erase(b));
  EXPECT_FALSE(c.erase(b));
  EXPECT_EQ(c.used_bytes(), 0u);
}
