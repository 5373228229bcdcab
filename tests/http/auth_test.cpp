// API keys: the bearer scheme in any case, every configured key accepted, the caller's key index
// reported (it owns the requests it makes).
#include "http/auth.hpp"

#include <gtest/gtest.h>

using namespace ferry::http;
using ferry::config::ServerConfig;

TEST(Auth, NoKeysLetsEveryoneIn) {
  const ServerConfig server;
  EXPECT_EQ(authenticate(server, ""), kNoKey);
  EXPECT_EQ(authenticate(server, "Bearer anything"), kNoKey);
  EXPECT_EQ(key_count(server), 0u);
}

TEST(Auth, TheSchemeIsCaseInsensitiveAndTheKeyExact) {
  ServerConfig server;
  server.api_key = "s3cret";
  for (const char* ok : {"Bearer s3cret", "bearer s3cret", "BEARER s3cret", "bEaReR   s3cret", "Bearer\ts3cret ",
                         " Bearer s3cret"}) {
    EXPECT_EQ(authenticate(server, ok), 0) << ok;
  }
  for (const char* refused : {"", "Bearer", "Bearer ", "Bearers3cret", "Basic s3cret", "Bearer S3CRET",
                              "Bearer s3cre", "Bearer s3crett", "Bearer s3cret x", "Token s3cret"}) {
    EXPECT_EQ(authenticate(server, refused), std::nullopt) << refused;
  }
}

TEST(Auth, EveryKeyOfTheFileIsAcceptedAndNamesItsOwner) {
  ServerConfig server;
  server.api_key = "k0";
  server.file_api_keys = {"k1", "k0", "k2"};  // a repeat of --api-key is the same owner
  EXPECT_EQ(key_count(server), 3u);
  EXPECT_EQ(authenticate(server, "Bearer k0"), 0);
  EXPECT_EQ(authenticate(server, "Bearer k1"), 1);
  EXPECT_EQ(authenticate(server, "Bearer k2"), 2);
  EXPECT_EQ(authenticate(server, "Bearer k3"), std::nullopt);
  server.api_key.clear();
  EXPECT_EQ(authenticate(server, "Bearer k1"), 0);
}

TEST(Auth, TheChallengeSaysWhetherATokenWasRefused) {
  EXPECT_EQ(www_authenticate(""), "Bearer realm=\"ferry\"");
  EXPECT_EQ(www_authenticate("Bearer nope"), "Bearer realm=\"ferry\", error=\"invalid_token\"");
}
