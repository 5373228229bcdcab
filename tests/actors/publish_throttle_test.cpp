// The telemetry throttle, without actors: when a report goes out, and that an actor at rest stops.
#include <gtest/gtest.h>

#include "actors/publish_throttle.hpp"

using ferry::actors::PublishThrottle;
using namespace std::chrono_literals;

TEST(PublishThrottle, FirstChangePublishesAtOnceAndSchedulesATrailingFlush) {
  PublishThrottle t(50ms);
  const auto t0 = PublishThrottle::Clock::time_point{} + 1s;
  const auto d = t.changed(t0);
  EXPECT_TRUE(d.publish);
  ASSERT_TRUE(d.flush_after);
  EXPECT_EQ(*d.flush_after, PublishThrottle::Duration(50ms));
}

TEST(PublishThrottle, ChangesWithinTheIntervalRideOnOneFlush) {
  PublishThrottle t(50ms);
  const auto t0 = PublishThrottle::Clock::time_point{} + 1s;
  t.changed(t0);
  for (int i = 1; i < 40; ++i) {
    const auto d = t.changed(t0 + std::chrono::milliseconds(i));
    EXPECT_FALSE(d.publish);
    EXPECT_FALSE(d.flush_after);  // the flush already scheduled carries them
  }
  const auto f = t.flush(t0 + 50ms);
  EXPECT_TRUE(f.publish);
  EXPECT_TRUE(f.flush_after);
}

TEST(PublishThrottle, AQuietFlushPublishesOnceMoreThenNothing) {
  PublishThrottle t(50ms);
  const auto t0 = PublishThrottle::Clock::time_point{} + 1s;
  t.changed(t0);
  const auto quiet = t.flush(t0 + 50ms);
  EXPECT_TRUE(quiet.publish);  // the actor at rest ("idle")
  EXPECT_FALSE(quiet.flush_after);
  EXPECT_FALSE(t.flush(t0 + 100ms).publish);  // a stray flush does nothing
  // After the rest, a change publishes at once again.
  EXPECT_TRUE(t.changed(t0 + 200ms).publish);
}

TEST(PublishThrottle, AChangeJustAfterARestWaitsForTheInterval) {
  PublishThrottle t(50ms);
  const auto t0 = PublishThrottle::Clock::time_point{} + 1s;
  t.changed(t0);
  t.flush(t0 + 50ms);  // quiet publish at 50 ms
  const auto d = t.changed(t0 + 60ms);
  EXPECT_FALSE(d.publish);
  ASSERT_TRUE(d.flush_after);
  EXPECT_EQ(*d.flush_after, PublishThrottle::Duration(40ms));
}

TEST(PublishThrottle, ABusyActorPublishesAboutOncePerInterval) {
  PublishThrottle t(50ms);
  const auto t0 = PublishThrottle::Clock::time_point{} + 1s;
  int published = 0;
  std::optional<PublishThrottle::Clock::time_point> flush_at;
  for (int ms = 0; ms <= 1000; ++ms) {  // a step every millisecond for a second
    const auto now = t0 + std::chrono::milliseconds(ms);
    if (flush_at && now >= *flush_at) {
      const auto f = t.flush(now);
      published += f.publish;
      flush_at = f.flush_after ? std::optional(now + *f.flush_after) : std::nullopt;
    }
    const auto d = t.changed(now);
    published += d.publish;
    if (d.flush_after) flush_at = now + *d.flush_after;
  }
  EXPECT_GE(published, 19);
  EXPECT_LE(published, 22);
}
