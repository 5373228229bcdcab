// Where the admin console may answer without a token (only where it listens on loopback) and which
// requests are its WebSocket's. The refusal itself is tested end to end in test_admin_ws.py, which
// binds loopback addresses only; this covers the addresses tests do not bind.
#include <gtest/gtest.h>

#include "http/admin_ws.hpp"

using ferry::config::ServerConfig;
using ferry::http::admin_listens_on_loopback;
using ferry::http::is_admin_websocket;

TEST(AdminWs, OnlyALoopbackListenerMayGoWithoutAToken) {
  ServerConfig s;
  EXPECT_TRUE(admin_listens_on_loopback(s));  // 127.0.0.1
  s.host = "::1";
  EXPECT_TRUE(admin_listens_on_loopback(s));
  s.host = "0.0.0.0";
  EXPECT_FALSE(admin_listens_on_loopback(s));
  s.host = "192.168.1.5";
  EXPECT_FALSE(admin_listens_on_loopback(s));
  // With its own port the console's address is --admin-host, whatever --host is.
  s.admin_port = 9528;
  EXPECT_TRUE(admin_listens_on_loopback(s));
  s.admin_host = "::";
  EXPECT_FALSE(admin_listens_on_loopback(s));
  s.admin_host = "not an address";
  EXPECT_FALSE(admin_listens_on_loopback(s));
}

TEST(AdminWs, TheSocketsPathWithAnyQuery) {
  EXPECT_TRUE(is_admin_websocket("/admin/ws"));
  EXPECT_TRUE(is_admin_websocket("/admin/ws?x=1"));
  EXPECT_FALSE(is_admin_websocket("/admin"));
  EXPECT_FALSE(is_admin_websocket("/admin/ws/more"));
  EXPECT_FALSE(is_admin_websocket("/v1/admin/ws"));
}
