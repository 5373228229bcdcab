// Before listening: the connection cap from the open-file limit, and the warning for an address other
// machines can reach without an API key. (No socket is opened: tests bind loopback only.)
#include "http/server_limits.hpp"

#include <gtest/gtest.h>
#include <sys/resource.h>

using namespace ferry::http;

TEST(ServerLimits, TheAutoCapIsWellBelowTheOpenFileLimit) {
  ferry::config::ServerConfig server;
  EXPECT_EQ(connection_limit(server, 20000), 10000u);
  EXPECT_EQ(connection_limit(server, 1048576), 32768u);
  EXPECT_EQ(connection_limit(server, 20), 16u);
  server.max_connections = 500;
  EXPECT_EQ(connection_limit(server, 20000), 500u);  // as configured, even above the limit
}

TEST(ServerLimits, TheSoftOpenFileLimitIsRaisedToTheHardOne) {
  const OpenFileLimit limit = raise_open_file_limit();
  rlimit now{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &now), 0);
  EXPECT_EQ(limit.now, now.rlim_cur);
  EXPECT_EQ(now.rlim_cur, now.rlim_max);
  EXPECT_GE(limit.now, limit.before);
}

TEST(ServerLimits, APublicAddressWithoutAKeyIsWarnedAbout) {
  for (const char* open : {"0.0.0.0", "::", "192.0.2.7", "2001:db8::1"}) {
    const auto warning = public_bind_warning(open, 0);
    ASSERT_TRUE(warning) << open;
    EXPECT_NE(warning->find("without an API key"), std::string::npos);
    EXPECT_NE(warning->find("--api-key"), std::string::npos);
    EXPECT_EQ(public_bind_warning(open, 1), std::nullopt) << open;
  }
  EXPECT_NE(public_bind_warning("0.0.0.0", 0)->find("every interface"), std::string::npos);
  for (const char* loopback : {"127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1"}) {
    EXPECT_EQ(public_bind_warning(loopback, 0), std::nullopt) << loopback;
  }
}
