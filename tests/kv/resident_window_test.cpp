#include "kv/resident_window.hpp"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace ferry::kv {
namespace {

using Query = ResidentWindow::Query;

// The window rows a plan gave a query row, back to the positions they hold.
std::vector<int32_t> rows_of(const std::vector<int32_t>& table, uint32_t q, uint32_t stride, int32_t count) {
  return {table.begin() + q * stride, table.begin() + q * stride + count};
}

TEST(ResidentWindow, MissesAreFetchedOnceAndHitsReuseTheirRows) {
  ResidentWindow w(2, 8);
  const std::vector<int32_t> sel{0, 1, 2, 3};
  std::vector<int32_t> table(2 * 4, -1);
  std::vector<WindowFetch> fetches;
  const std::vector<Query> q{{1, sel.data(), 4}, {1, sel.data(), 4}};  // two rows of slot 1, same rows
  auto end = w.plan(q, 0, table.data(), 4, fetches);
  ASSERT_TRUE(end);
  EXPECT_EQ(end.value(), 2u);
  ASSERT_EQ(fetches.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(fetches[i].slot, 1u);
    EXPECT_EQ(fetches[i].position, sel[i]);
    EXPECT_GE(fetches[i].row, 8u);  // slot 1's window rows are [8, 16)
    EXPECT_LT(fetches[i].row, 16u);
    EXPECT_EQ(table[i], static_cast<int32_t>(fetches[i].row));
  }
  EXPECT_EQ(rows_of(table, 0, 4, 4), rows_of(table, 1, 4, 4));
  w.end_group();
  EXPECT_EQ(w.counters().misses, 4u);
  EXPECT_EQ(w.counters().hits, 4u);
  EXPECT_EQ(w.resident(1), 4u);
  EXPECT_EQ(w.resident(0), 0u);
}

TEST(ResidentWindow, AGroupEndsWhereTheWindowIsFullOfPinnedRows) {
  ResidentWindow w(1, 6);
  const std::vector<int32_t> a{0, 1, 2, 3}, b{4, 5, 6, 7};
  std::vector<int32_t> table(3 * 4, -1);
  const std::vector<Query> q{{0, a.data(), 4}, {0, b.data(), 4}, {0, a.data(), 4}};
  // What each window row holds, replaying the fetches: every row of a group reads what it selected.
  std::vector<int32_t> at(6, -1);
  std::vector<uint32_t> ends;
  for (uint32_t first = 0; first < q.size();) {
    std::vector<WindowFetch> fetches;
    auto end = w.plan(q, first, table.data(), 4, fetches);
    ASSERT_TRUE(end);
    for (const WindowFetch& f : fetches) at[f.row] = static_cast<int32_t>(f.position);
    for (uint32_t r = first; r < end.value(); ++r) {
      const std::vector<int32_t> rows = rows_of(table, r, 4, 4);
      EXPECT_EQ(std::set<int32_t>(rows.begin(), rows.end()).size(), 4u);
      for (int i = 0; i < 4; ++i) EXPECT_EQ(at[rows[i]], q[r].positions[i]) << r << " " << i;
    }
    w.end_group();
    ends.push_back(end.value());
    first = end.value();
  }
  // Row 1 needs 8 pinned rows of 6 with row 0, and row 2 needs two of row 0's rows back beside row 1's.
  EXPECT_EQ(ends, (std::vector<uint32_t>{1, 2, 3}));
}

TEST(ResidentWindow, OneRowLargerThanTheWindowIsAnError) {
  ResidentWindow w(1, 3);
  const std::vector<int32_t> a{0, 1, 2, 3};
  std::vector<int32_t> table(4);
  std::vector<WindowFetch> fetches;
  auto end = w.plan({{0, a.data(), 4}}, 0, table.data(), 4, fetches);
  ASSERT_FALSE(end);
  EXPECT_NE(end.error().message.find("more than the 3"), std::string::npos) << end.error().message;
}

TEST(ResidentWindow, AdoptedRowsAreHitsInPlaceAndInvalidationDropsThem) {
  ResidentWindow w(2, 8);
  w.adopt_identity(1, 5);
  EXPECT_EQ(w.counters().misses, 0u);  // written in place, never fetched
  EXPECT_EQ(w.resident(1), 5u);
  const std::vector<int32_t> sel{4, 2, 0};
  std::vector<int32_t> table(3);
  std::vector<WindowFetch> fetches;
  ASSERT_TRUE(w.plan({{1, sel.data(), 3}}, 0, table.data(), 3, fetches));
  w.end_group();
  EXPECT_TRUE(fetches.empty());
  EXPECT_EQ(table, (std::vector<int32_t>{8 + 4, 8 + 2, 8 + 0}));  // position p at frame p
  w.invalidate(1, 2);  // rows 2.. rewritten
  EXPECT_EQ(w.resident(1), 2u);
  ASSERT_TRUE(w.plan({{1, sel.data(), 3}}, 0, table.data(), 3, fetches));
  w.end_group();
  EXPECT_EQ(fetches.size(), 2u);  // 4 and 2 again; 0 still resident
  EXPECT_EQ(table[2], 8);
  w.reset(1);
  EXPECT_EQ(w.resident(1), 0u);
  EXPECT_EQ(w.counters().hits, 4u);  // kept across the reset
}

TEST(ResidentWindow, ARowsMissesNeverEvictTheRowsOwnHits) {
  ResidentWindow w(1, 4);
  std::vector<WindowFetch> fetches;
  std::vector<int32_t> table(4);
  const std::vector<int32_t> first{0, 1, 2, 3}, second{4};
  ASSERT_TRUE(w.plan({{0, first.data(), 4}}, 0, table.data(), 4, fetches));
  w.end_group();
  ASSERT_TRUE(w.plan({{0, second.data(), 1}}, 0, table.data(), 1, fetches));  // clears every bit, takes frame 0
  w.end_group();
  // The hand is at frame 1 (position 1, no bit): placed first, 9 would take it from 1, which the same
  // row selects; 1 is pinned first and 9 takes frame 2.
  const std::vector<int32_t> next{9, 1};
  fetches.clear();
  ASSERT_TRUE(w.plan({{0, next.data(), 2}}, 0, table.data(), 2, fetches));
  w.end_group();
  ASSERT_EQ(fetches.size(), 1u);
  EXPECT_EQ(fetches[0].position, 9u);
  EXPECT_EQ(table[0], 2);
  EXPECT_EQ(table[1], 1);
  EXPECT_EQ(w.counters().hits, 1u);
}

TEST(ResidentWindow, ANegativePositionIsAnError) {
  ResidentWindow w(1, 4);
  const std::vector<int32_t> a{-1};
  std::vector<int32_t> table(1);
  std::vector<WindowFetch> fetches;
  EXPECT_FALSE(w.plan({{0, a.data(), 1}}, 0, table.data(), 1, fetches));
}

}  // namespace
}  // namespace ferry::kv
