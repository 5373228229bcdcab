#include "kv/clock_policy.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace ferry::kv {
namespace {

TEST(ClockPolicy, FillsFreeFramesThenGivesASecondChance) {
  ClockPolicy k(3);
  const uint64_t a = row_key(0, 0), b = row_key(0, 1), cc = row_key(0, 2), d = row_key(0, 3), e = row_key(0, 4);
  EXPECT_EQ(k.lookup(a), ClockPolicy::kNone);
  EXPECT_EQ(k.place(a).frame, 0u);
  EXPECT_EQ(k.place(b).frame, 1u);
  EXPECT_EQ(k.place(cc).frame, 2u);
  k.end_step();
  // All three referenced: the hand clears 0, 1, 2, then takes 0 on the second pass.
  auto p = k.place(d);
  EXPECT_EQ(p.frame, 0u);
  ASSERT_TRUE(p.evicted.has_value());
  EXPECT_EQ(*p.evicted, a);
  k.end_step();
  // b is used again (its bit set); c is not: the hand (at 1) passes b and evicts c.
  EXPECT_EQ(k.lookup(b), 1u);
  k.end_step();
  p = k.place(e);
  EXPECT_EQ(p.frame, 2u);
  EXPECT_EQ(*p.evicted, cc);
  EXPECT_EQ(k.lookup(a), ClockPolicy::kNone);
  EXPECT_EQ(k.lookup(cc), ClockPolicy::kNone);
  EXPECT_EQ(k.lookup(d), 0u);
  EXPECT_EQ(k.counters().misses, 5u);
  EXPECT_EQ(k.counters().evictions, 2u);
  EXPECT_EQ(k.counters().hits, 2u);
  EXPECT_EQ(k.resident(), 3u);
}

TEST(ClockPolicy, NeverEvictsARowPinnedThisStep) {
  ClockPolicy c(2);
  c.place(row_key(0, 0));
  c.place(row_key(0, 1));
  // Same step: both pinned, nothing can be placed.
  EXPECT_EQ(c.place(row_key(0, 2)).frame, ClockPolicy::kNone);
  c.end_step();
  c.lookup(row_key(0, 1));  // pinned again in the next step
  auto p = c.place(row_key(0, 2));
  ASSERT_NE(p.frame, ClockPolicy::kNone);
  EXPECT_EQ(*p.evicted, row_key(0, 0));
  EXPECT_EQ(c.place(row_key(0, 3)).frame, ClockPolicy::kNone);  // both pinned again
}

TEST(ClockPolicy, InvalidatesExactlyTheSlotsRowsFromTheCut) {
  ClockPolicy c(8);
  for (uint32_t pos = 0; pos < 4; ++pos) {
    c.place(row_key(1, pos));
    c.place(row_key(2, pos));
  }
  c.end_step();
  c.invalidate(1, 2);
  EXPECT_EQ(c.resident(), 6u);
  EXPECT_NE(c.lookup(row_key(1, 0)), ClockPolicy::kNone);
  EXPECT_NE(c.lookup(row_key(1, 1)), ClockPolicy::kNone);
  EXPECT_EQ(c.lookup(row_key(1, 2)), ClockPolicy::kNone);
  EXPECT_EQ(c.lookup(row_key(1, 3)), ClockPolicy::kNone);
  for (uint32_t pos = 0; pos < 4; ++pos) EXPECT_NE(c.lookup(row_key(2, pos)), ClockPolicy::kNone) << pos;
  EXPECT_EQ(c.counters().invalidated, 2u);
  // The freed frames are used before anything is evicted.
  c.end_step();
  EXPECT_FALSE(c.place(row_key(1, 2)).evicted.has_value());
  EXPECT_FALSE(c.place(row_key(1, 3)).evicted.has_value());
  EXPECT_TRUE(c.place(row_key(1, 4)).evicted.has_value());
  c.invalidate(2, 0);  // a reset
  for (uint32_t pos = 0; pos < 4; ++pos) EXPECT_EQ(c.lookup(row_key(2, pos)), ClockPolicy::kNone);
}

TEST(ClockPolicy, FreedFramesAreTakenLowestFirst) {
  ClockPolicy c(6);
  for (uint32_t pos = 0; pos < 6; ++pos) c.place(row_key(0, pos));
  c.end_step();
  c.invalidate(0, 4);  // frames 4, 5
  c.invalidate(0, 1);  // frames 1, 2, 3
  for (uint32_t want : {1u, 2u, 3u, 4u, 5u}) EXPECT_EQ(c.place(row_key(0, 10 + want)).frame, want);
}

TEST(ClockPolicy, ExportedStateImportsIntoAnotherClockThatThenChoosesAlike) {
  ClockPolicy a(5), b(5);
  for (uint32_t pos = 0; pos < 5; ++pos) a.place(row_key(3, pos));
  a.end_step();
  a.lookup(row_key(3, 1));
  a.place(row_key(3, 7));  // every bit set (1 pinned): the second sweep takes frame 0
  a.end_step();
  a.invalidate(3, 4);  // positions 4 and 7: frames 4 and 0
  std::vector<int32_t> pos(5);
  std::vector<uint8_t> ref(5);
  a.export_slot(pos.data(), ref.data());
  EXPECT_EQ(pos, (std::vector<int32_t>{-1, 1, 2, 3, -1}));
  ASSERT_TRUE(b.import_slot(3, pos.data(), ref.data(), a.hand()));
  EXPECT_EQ(b.resident(), 3u);
  for (uint32_t next = 20; next < 30; ++next) {
    const auto pa = a.place(row_key(3, next)), pb = b.place(row_key(3, next));
    EXPECT_EQ(pa.frame, pb.frame) << next;
    EXPECT_EQ(pa.evicted, pb.evicted) << next;
    if (next % 3 == 0) {
      a.end_step();
      b.end_step();
    }
  }
  const std::vector<int32_t> twice{1, 1, -1, -1, -1};
  EXPECT_FALSE(b.import_slot(3, twice.data(), ref.data(), 0));  // a position held twice
  EXPECT_FALSE(b.import_slot(3, pos.data(), ref.data(), 5));    // the hand past the frames
}

}  // namespace
}  // namespace ferry::kv
