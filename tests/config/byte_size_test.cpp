#include "config/byte_size.hpp"

#include <gtest/gtest.h>

using ferry::config::format_byte_size;
using ferry::config::parse_byte_size;

TEST(ByteSize, ParsesBinaryAndDecimalUnits) {
  EXPECT_EQ(*parse_byte_size("25.5GiB"), 27380416512ull);
  EXPECT_EQ(*parse_byte_size("84 GiB"), 84ull << 30);
  EXPECT_EQ(*parse_byte_size("512mib"), 512ull << 20);
  EXPECT_EQ(*parse_byte_size("2GB"), 2000000000ull);
  EXPECT_EQ(*parse_byte_size("1000"), 1000ull);
}

TEST(ByteSize, RejectsWithMessageNamingTheText) {
  auto r = parse_byte_size("12 parsecs");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ferry::ErrorCode::invalid_input);
  EXPECT_NE(r.error().message.find("parsecs"), std::string::npos);
  EXPECT_FALSE(parse_byte_size("GiB").ok());
  EXPECT_FALSE(parse_byte_size("1.2.3GiB").ok());
  EXPECT_FALSE(parse_byte_size("99999999999TiB").ok());
}

TEST(ByteSize, Formats) {
  EXPECT_EQ(format_byte_size(512), "512 B");
  EXPECT_EQ(format_byte_size(1536), "1.50 KiB");
  EXPECT_EQ(format_byte_size(84ull << 30), "84.00 GiB");
}
