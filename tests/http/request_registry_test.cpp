// Which requests exist and whose they are: unknown ids, late cancels, and keys that may not see
// each other's requests.
#include "http/request_registry.hpp"

#include <gtest/gtest.h>

#include <set>

using namespace ferry::http;
using Found = RequestIndex::Found;

TEST(RequestIndex, LiveEndedAndUnknown) {
  RequestIndex index(2);
  index.add(10, 0);
  EXPECT_EQ(index.find(10, 0, false), Found::live);
  EXPECT_EQ(index.find(11, 0, false), Found::unknown);
  index.end(10);
  EXPECT_EQ(index.find(10, 0, false), Found::ended);  // a late cancel is still a no-op, not a 404
  index.end(10);                                      // twice changes nothing
  index.add(11, 0);
  index.add(12, 0);
  index.end(11);
  index.end(12);
  EXPECT_EQ(index.find(10, 0, false), Found::unknown);  // only the last 2 ended are remembered
  EXPECT_EQ(index.find(12, 0, false), Found::ended);
  EXPECT_EQ(index.live(), 0u);
}

TEST(RequestIndex, AnotherKeysRequestDoesNotExistForTheCaller) {
  RequestIndex index;
  index.add(7, 1);
  EXPECT_EQ(index.find(7, 1, false), Found::live);
  EXPECT_EQ(index.find(7, 2, false), Found::unknown);
  EXPECT_EQ(index.find(7, 2, true), Found::live);  // one key (or none): every caller is the same client
  index.end(7);
  EXPECT_EQ(index.find(7, 2, false), Found::unknown);
  EXPECT_EQ(index.find(7, 1, false), Found::ended);
}

TEST(RequestIndex, RequestNumbersAreRandomAndSafeInJson) {
  std::set<RequestNumber> seen;
  RequestNumber previous = 0;
  int sequential = 0;
  for (int i = 0; i < 1000; ++i) {
    const RequestNumber n = random_request_number();
    EXPECT_NE(n, 0u);
    EXPECT_LT(n, uint64_t{1} << 53);
    sequential += n == previous + 1 ? 1 : 0;
    previous = n;
    seen.insert(n);
  }
  EXPECT_EQ(seen.size(), 1000u);
  EXPECT_EQ(sequential, 0);
  EXPECT_GT(*seen.rbegin(), uint64_t{1} << 48);  // the high bits are used too
}
