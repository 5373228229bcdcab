#include "config/stage_split.hpp"

#include <gtest/gtest.h>

namespace ferry::config {
namespace {

std::vector<LayerRange> ranges(const std::string& split, const std::string& devices, uint32_t layers,
                               const std::vector<uint64_t>& bytes = {}) {
  StageSplit s;
  EXPECT_FALSE(parse_split(split, s));
  if (!devices.empty()) {
    EXPECT_FALSE(parse_devices(devices, s));
  }
  auto r = stage_ranges(s, layers, bytes);
  EXPECT_TRUE(r) << r.error().message;
  return r ? r.value() : std::vector<LayerRange>{};
}

TEST(StageSplit, ExplicitBoundariesMakeOneStageMore) {
  EXPECT_EQ(ranges("none", "", 45), (std::vector<LayerRange>{{0, 45}}));
  EXPECT_EQ(ranges("11,23,34", "", 45), (std::vector<LayerRange>{{0, 11}, {11, 23}, {23, 34}, {34, 45}}));
}

TEST(StageSplit, AutoBalancesWeightBytesOverTheDevices) {
  // The user's layout: 3 light dense layers first, then MoE layers of equal size.
  std::vector<uint64_t> bytes(45, 100);
  for (int i = 0; i < 3; ++i) bytes[i] = 20;
  const auto r = ranges("auto", "0,1,2,3", 45, bytes);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r.front().first, 0u);
  EXPECT_EQ(r.back().end, 45u);
  for (size_t i = 0; i + 1 < r.size(); ++i) EXPECT_EQ(r[i].end, r[i + 1].first);
  uint64_t lo = ~0ull, hi = 0;
  for (const LayerRange& x : r) {
    uint64_t sum = 0;
    for (uint32_t l = x.first; l < x.end; ++l) sum += bytes[l];
    lo = std::min(lo, sum);
    hi = std::max(hi, sum);
  }
  EXPECT_LE(hi - lo, 100u);  // within one layer of each other
  // Several devices without --split: the same as auto.
  EXPECT_EQ(ranges("none", "0,1,2,3", 45, bytes), r);
  // As many stages as layers: one layer each.
  EXPECT_EQ(ranges("auto", "0,1,2", 3, {5, 5, 5}), (std::vector<LayerRange>{{0, 1}, {1, 2}, {2, 3}}));
}

TEST(StageSplit, BadBoundariesAreNamed) {
  StageSplit s;
  EXPECT_FALSE(parse_split("11,5", s));
  auto r = stage_ranges(s, 45);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("boundary 5 must be above the previous one (11)"), std::string::npos);
  EXPECT_FALSE(parse_split("11,45", s));
  EXPECT_FALSE(stage_ranges(s, 45));
  EXPECT_FALSE(parse_split("0", s));
  EXPECT_FALSE(stage_ranges(s, 45));
  ASSERT_TRUE(parse_split("11,x", s));
  EXPECT_NE(parse_split("11,,3", s)->message.find("'' is not a non-negative integer"), std::string::npos);
  EXPECT_TRUE(parse_devices("0,-1", s));
  StageSplit four;
  EXPECT_FALSE(parse_split("auto", four));
  EXPECT_FALSE(parse_devices("0,1,2,3", four));
  EXPECT_FALSE(stage_ranges(four, 3, {1, 1, 1}));  // more stages than layers
}

TEST(StageSplit, StagesSpreadOverFewerDevicesInRuns) {
  StageSplit s;
  EXPECT_EQ(stage_device(s, 3, 4), 0);
  EXPECT_FALSE(parse_devices("0,1", s));
  EXPECT_EQ(stage_device(s, 0, 4), 0);
  EXPECT_EQ(stage_device(s, 1, 4), 0);
  EXPECT_EQ(stage_device(s, 2, 4), 1);
  EXPECT_EQ(stage_device(s, 3, 4), 1);
  EXPECT_EQ(distinct_devices(s, 4), 2u);
  EXPECT_EQ(distinct_devices(s, 1), 1u);
  EXPECT_FALSE(parse_devices("2,2,3,3", s));
  EXPECT_EQ(stage_device(s, 2, 4), 3);
  EXPECT_EQ(distinct_devices(s, 4), 2u);
}

}  // namespace
}  // namespace ferry::config
