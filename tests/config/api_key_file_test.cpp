// --api-key-file: one key per line, comments and blank lines skipped, bad lines named.
#include "config/api_key_file.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

using ferry::config::read_api_key_file;

namespace {

std::string write_file(const std::string& text) {
  const std::string path = ::testing::TempDir() + "ferry_api_keys_" +
                           std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
                           ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

}  // namespace

TEST(ApiKeyFile, OneKeyPerLineTrimmedWithCommentsAndDuplicatesDropped) {
  const auto path = write_file("# team keys\nalpha-1\r\n\n  beta_2  \nalpha-1\n\tgamma.3\n");
  auto keys = read_api_key_file(path);
  ASSERT_TRUE(keys.ok()) << keys.error().message;
  EXPECT_EQ(*keys, (std::vector<std::string>{"alpha-1", "beta_2", "gamma.3"}));
  std::remove(path.c_str());
}

TEST(ApiKeyFile, ProblemsNameTheFileAndTheLine) {
  const auto two = write_file("good\nkey one\n");
  auto keys = read_api_key_file(two);
  ASSERT_FALSE(keys.ok());
  EXPECT_EQ(keys.error().message, "--api-key-file " + two + ": line 2 holds a space or a control character inside "
                                  "the key (one key per line)");
  const auto empty = write_file("# nothing\n\n");
  keys = read_api_key_file(empty);
  ASSERT_FALSE(keys.ok());
  EXPECT_NE(keys.error().message.find("no key in the file"), std::string::npos);
  keys = read_api_key_file("/nonexistent/keys.txt");
  ASSERT_FALSE(keys.ok());
  EXPECT_EQ(keys.error().message, "--api-key-file /nonexistent/keys.txt: cannot be read");
  std::remove(two.c_str());
  std::remove(empty.c_str());
}
