// The admin console's and the log's options in the [server] section, and the default thinking effort.
#include <gtest/gtest.h>

#include "config/serve_config.hpp"

using ferry::config::ServeConfig;
using ferry::config::validate;

TEST(AdminOptions, DefaultsAreTheConsoleOnTheApiPortAndTextLogs) {
  const ServeConfig c;
  EXPECT_TRUE(c.server.admin_token.empty());
  EXPECT_EQ(c.server.admin_port, 0);
  EXPECT_EQ(c.server.admin_host, "127.0.0.1");
  EXPECT_EQ(c.server.admin_queue_limit, 64u);
  EXPECT_EQ(c.server.telemetry_interval_ms, 50);
  EXPECT_EQ(c.server.log_format, "text");
  EXPECT_TRUE(c.sampling.reasoning_effort.empty());
}

TEST(AdminOptions, EachBadValueIsNamed) {
  ServeConfig c;
  c.server.admin_port = c.server.port;
  c.server.admin_queue_limit = 1;
  c.server.telemetry_interval_ms = 0;
  c.server.log_format = "xml";
  c.sampling.reasoning_effort = "extreme";
  const auto errors = validate(c);
  ASSERT_EQ(errors.size(), 5u);
  EXPECT_EQ(errors[0], "--admin-port = 9527: expected a port other than --port (0: the console on the API's port)");
  EXPECT_EQ(errors[1], "--admin-queue-limit = 1: expected 4 to 65536 messages");
  EXPECT_EQ(errors[2], "--telemetry-interval = 0: expected milliseconds in [1, 10000]");
  EXPECT_EQ(errors[3], "--log-format = xml: expected text or json");
  EXPECT_EQ(errors[4], "--reasoning-effort = extreme: expected low, medium, high, xhigh or max");
}
