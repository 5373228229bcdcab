#include "model/formats/ggml_type.hpp"

#include <gtest/gtest.h>

using namespace ferry::model;

TEST(GgmlType, KnownBlockGeometry) {
  EXPECT_EQ(ggml_type_traits(GgmlType::Q4_K).block_bytes, 144u);
  EXPECT_EQ(ggml_type_traits(GgmlType::IQ3_S).block_bytes, 110u);
  EXPECT_EQ(ggml_type_traits(GgmlType::Q6_K).block_elems, 256u);
  EXPECT_FALSE(ggml_type_traits(4u).has_value());  // Q4_2 was retired
  EXPECT_FALSE(ggml_type_traits(1000u).has_value());
}

TEST(GgmlType, NamesAndBytes) {
  EXPECT_EQ(ggml_type_from_name("Q4_K"), GgmlType::Q4_K);
  EXPECT_EQ(ggml_type_from_name("iq4_xs"), GgmlType::IQ4_XS);
  EXPECT_FALSE(ggml_type_from_name("q9_k").has_value());
  EXPECT_EQ(ggml_bytes(GgmlType::Q8_0, 64), 68u);
  EXPECT_FALSE(ggml_bytes(GgmlType::Q8_0, 33).has_value());
  EXPECT_FALSE(ggml_bytes(GgmlType::F32, ~0ull).has_value());
}
