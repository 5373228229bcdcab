// Stop strings over streamed text: held back while they might match, cut at the first match,
// and the same result for any split of the text.
#include <gtest/gtest.h>

#include <random>

#include "http/generation_stream.hpp"

using ferry::http::StopMatcher;

namespace {

std::string run(const std::vector<std::string>& stops, const std::vector<std::string>& pieces, bool* matched = nullptr) {
  StopMatcher m(stops);
  std::string out;
  for (const auto& p : pieces) out += m.feed(p);
  out += m.flush();
  if (matched) *matched = m.matched();
  return out;
}

}  // namespace

TEST(StopMatcher, CutsAtTheFirstStopStringAcrossPieces) {
  bool matched = false;
  EXPECT_EQ(run({"END"}, {"hello E", "N", "D and more"}, &matched), "hello ");
  EXPECT_TRUE(matched);
  EXPECT_EQ(run({"###", "\n\n"}, {"a\n", "b#", "#", "\n\nc"}, &matched), "a\nb##");
  EXPECT_TRUE(matched);
}

TEST(StopMatcher, HoldsBackOnlyWhatMayStillMatch) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.feed("abc S"), "abc ");
  EXPECT_EQ(m.feed("T"), "");
  EXPECT_EQ(m.feed("x"), "STx");  // not a stop after all: released
  EXPECT_EQ(m.feed("ST"), "");
  EXPECT_EQ(m.flush(), "ST");  // the end of the stream releases what was held
  EXPECT_FALSE(m.matched());
}

TEST(StopMatcher, NoStopsPassesEverythingThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.feed("anything"), "anything");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, MultiByteTextStaysWhole) {
  bool matched = false;
  EXPECT_EQ(run({"é!"}, {"caf", "é", "é", "!", "x"}, &matched), "café");
  EXPECT_TRUE(matched);
}

TEST(StopMatcher, AnySplitGivesTheSameResult) {
  const std::string text = "the quick brown fox says STOP-NOW then jumps; STO and ST end";
  const std::vector<std::vector<std::string>> stop_sets = {{"STOP-NOW"}, {"jumps", "fox s"}, {"zzz"}, {"ST end"}};
  std::mt19937 rng(7);
  for (const auto& stops : stop_sets) {
    const std::string whole = run(stops, {text});
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<std::string> pieces;
      size_t at = 0;
      while (at < text.size()) {
        const size_t n = 1 + rng() % 6;
        pieces.push_back(text.substr(at, n));
        at += n;
      }
      EXPECT_EQ(run(stops, pieces), whole);
    }
  }
}
