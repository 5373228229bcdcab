// The connection cap's policy: admit below the cap, at the cap take the place of the longest-idle
// connection, refuse only when every connection is busy; evictions that arrive too late are undone.
#include "http/connection_limiter.hpp"

#include <gtest/gtest.h>

using namespace ferry::http;
using Verdict = ConnectionLimiter::Verdict;

TEST(ConnectionLimiter, AdmitsBelowTheCapAndEvictsTheLongestIdleAtIt) {
  ConnectionLimiter limiter(3);
  for (ConnectionLimiter::Id id = 1; id <= 3; ++id) EXPECT_EQ(limiter.admit(id).verdict, Verdict::admit);
  limiter.busy(2);
  limiter.busy(1);
  limiter.idle(1);  // 1 went back to waiting after an answer: now newer than 3
  auto a = limiter.admit(4);
  EXPECT_EQ(a.verdict, Verdict::admit_after_evicting);
  EXPECT_EQ(a.evict, 3u);  // idle since it connected: the longest
  EXPECT_EQ(limiter.open(), 4u);
  EXPECT_EQ(limiter.live(), 3u);
  limiter.closed(3);
  EXPECT_EQ(limiter.open(), 3u);
  a = limiter.admit(5);
  EXPECT_EQ(a.evict, 1u);
  limiter.closed(1);
  a = limiter.admit(6);
  EXPECT_EQ(a.evict, 4u);  // the newest ones go last
}

TEST(ConnectionLimiter, RefusesWhenEveryConnectionIsBusy) {
  ConnectionLimiter limiter(2);
  limiter.admit(1);
  limiter.admit(2);
  limiter.busy(1);
  limiter.busy(2);
  EXPECT_EQ(limiter.admit(3).verdict, Verdict::refuse);
  EXPECT_EQ(limiter.open(), 2u);  // a refused connection never counts
  limiter.closed(2);
  EXPECT_EQ(limiter.admit(4).verdict, Verdict::admit);
}

TEST(ConnectionLimiter, AnEvictionThatCameTooLateIsUndone) {
  ConnectionLimiter limiter(1);
  limiter.admit(1);
  const auto a = limiter.admit(2);  // 1 is chosen while its first byte is on the way
  ASSERT_EQ(a.evict, 1u);
  EXPECT_TRUE(limiter.busy(1));  // it began a request before the eviction reached it: it stays
  EXPECT_FALSE(limiter.busy(1));
  EXPECT_EQ(limiter.live(), 2u);  // one over the cap, until a connection closes
  limiter.busy(2);
  EXPECT_EQ(limiter.admit(3).verdict, Verdict::refuse);
  limiter.closed(1);
  limiter.closed(1);  // twice changes nothing
  EXPECT_EQ(limiter.live(), 1u);
}

TEST(ConnectionLimiter, EvictOneForWhenFileDescriptorsRunOut) {
  ConnectionLimiter limiter(100);
  EXPECT_EQ(limiter.evict_one(), std::nullopt);
  limiter.admit(1);
  limiter.admit(2);
  limiter.busy(1);
  EXPECT_EQ(limiter.evict_one(), 2u);
  EXPECT_EQ(limiter.evict_one(), std::nullopt);
  limiter.idle(2);  // a connection being closed does not come back as idle
  EXPECT_EQ(limiter.idle_count(), 0u);
}
