// The GGUF reader on hand-built images: every value type, typed getters, and one test per kind of
// corruption, each checking that the error names the problem.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "model/formats/gguf.hpp"
#include "tests/model/gguf_test_util.hpp"

using namespace ferry::model;
using ferry::model::test::GgufBytes;

namespace {

ferry::Expected<GgufFile> parse(const GgufBytes& g) { return GgufFile::parse(g.b); }

// Expects the parse to fail with a message containing every one of `parts`.
void expect_error(const GgufBytes& g, std::initializer_list<std::string_view> parts) {
  auto r = parse(g);
  ASSERT_FALSE(r.ok()) << "parsed a broken file";
  for (std::string_view p : parts) {
    EXPECT_NE(r.error().message.find(p), std::string::npos) << "message: " << r.error().message << "\nmissing: " << p;
  }
}

// A small valid file: metadata of every type, two tensors, ending exactly at the last tensor's data.
GgufBytes valid_file() {
  GgufBytes g;
  g.header(2, 16);
  g.str("general.architecture").u32(8).str("glm5next");
  g.str("k.u8").u32(0).put<uint8_t>(200);
  g.str("k.i8").u32(1).put<int8_t>(-100);
  g.str("k.u16").u32(2).put<uint16_t>(60000);
  g.str("k.i16").u32(3).put<int16_t>(-30000);
  g.kv_u32("k.u32", 4000000000u);
  g.str("k.i32").u32(5).put<int32_t>(-2000000000);
  g.str("k.f32").u32(6).put<float>(0.5f);
  g.str("k.bool").u32(7).put<uint8_t>(1);
  g.str("k.u64").u32(10).put<uint64_t>(1ull << 40);
  g.str("k.i64").u32(11).put<int64_t>(-5);
  g.str("k.f64").u32(12).put<double>(1e-300);
  g.str("k.arr_i32").u32(9).u32(5).u64(3).put<int32_t>(1).put<int32_t>(-2).put<int32_t>(3);
  g.str("k.arr_str").u32(9).u32(8).u64(2).str("a").str("\xc3\xa9t\xc3\xa9");
  // [[1, 2], [], [[true]]] with per-array element types, as gguf-py writes nested arrays.
  g.str("k.nested").u32(9).u32(9).u64(3);
  g.u32(0).u64(2).put<uint8_t>(1).put<uint8_t>(2);
  g.u32(6).u64(0);
  g.u32(9).u64(1).u32(7).u64(1).put<uint8_t>(1);
  g.str("k.arr_empty_f64").u32(9).u32(12).u64(0);
  g.tensor("a.weight", {4, 2}, 0, 0);    // f32, 32 bytes
  g.tensor("b.weight", {32, 1}, 8, 32);  // q8_0, 34 bytes
  g.pad_to(32);
  for (int i = 0; i < 8; ++i) g.put<float>(static_cast<float>(i));
  g.fill(34, 0x5a);
  return g;
}

}  // namespace

TEST(GgufReader, ReadsEveryValueTypeAndTensor) {
  const GgufBytes g = valid_file();
  auto r = parse(g);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const GgufFile& f = *r;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  ASSERT_EQ(f.metadata().size(), 16u);
  EXPECT_EQ(f.metadata()[0].key, "general.architecture");  // file order
  EXPECT_EQ(f.metadata()[15].key, "k.arr_empty_f64");

  EXPECT_EQ(*f.get_string("general.architecture"), "glm5next");
  EXPECT_EQ(*f.get_u8("k.u8"), 200);
  EXPECT_EQ(*f.get_i8("k.i8"), -100);
  EXPECT_EQ(*f.get_u16("k.u16"), 60000);
  EXPECT_EQ(*f.get_i16("k.i16"), -30000);
  EXPECT_EQ(*f.get_u32("k.u32"), 4000000000u);
  EXPECT_EQ(*f.get_i32("k.i32"), -2000000000);
  EXPECT_EQ(*f.get_f32("k.f32"), 0.5f);
  EXPECT_EQ(*f.get_bool("k.bool"), true);
  EXPECT_EQ(*f.get_u64("k.u64"), 1ull << 40);
  EXPECT_EQ(*f.get_i64("k.i64"), -5);
  EXPECT_EQ(*f.get_f64("k.f64"), 1e-300);
  EXPECT_EQ(gguf_value_type(*f.find("k.u16")), GgufValueType::U16);

  const GgufArray* ints = *f.get_array("k.arr_i32");
  ASSERT_NE(ints->as<int32_t>(), nullptr);
  EXPECT_EQ(*ints->as<int32_t>(), (std::vector<int32_t>{1, -2, 3}));
  EXPECT_EQ(**f.get_string_array("k.arr_str"), (std::vector<std::string>{"a", "\xc3\xa9t\xc3\xa9"}));

  const GgufArray* nested = *f.get_array("k.nested");
  ASSERT_EQ(nested->element_type(), GgufValueType::Array);
  const auto& outer = *nested->as<GgufArray>();
  ASSERT_EQ(outer.size(), 3u);
  EXPECT_EQ(*outer[0].as<uint8_t>(), (std::vector<uint8_t>{1, 2}));
  EXPECT_EQ(outer[1].element_type(), GgufValueType::F32);
  EXPECT_EQ(outer[1].size(), 0u);
  EXPECT_EQ(*outer[2].as<GgufArray>()->at(0).as<bool>(), (std::vector<bool>{true}));
  EXPECT_EQ((*f.get_array("k.arr_empty_f64"))->element_type(), GgufValueType::F64);

  ASSERT_EQ(f.tensors().size(), 2u);
  const GgufTensorInfo* a = f.find_tensor("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dims, (std::vector<uint64_t>{4, 2}));
  EXPECT_EQ(a->type, GgmlType::F32);
  EXPECT_EQ(a->n_elements, 8u);
  EXPECT_EQ(a->n_bytes, 32u);
  EXPECT_EQ(a->file_offset, f.data_offset());
  EXPECT_EQ(f.data_offset() % 32, 0u);
  float third = 0;
  std::memcpy(&third, a->data.data() + 12, 4);
  EXPECT_EQ(third, 3.0f);
  const GgufTensorInfo* b = f.find_tensor("b.weight");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->type, GgmlType::Q8_0);
  EXPECT_EQ(b->n_bytes, 34u);
  EXPECT_EQ(b->data.size(), 34u);
  EXPECT_EQ(b->data[33], 0x5a);
  EXPECT_EQ(b->data.data() + 34, g.b.data() + g.b.size());
  EXPECT_EQ(f.find_tensor("c.weight"), nullptr);
}

TEST(GgufReader, IntegerGettersConvertWhenTheValueFits) {
  auto r = parse(valid_file());
  ASSERT_TRUE(r.ok());
  const GgufFile& f = *r;
  EXPECT_EQ(*f.get_u32("k.u8"), 200u);
  EXPECT_EQ(*f.get_i64("k.u32"), 4000000000);
  EXPECT_EQ(*f.get_u64("k.u16"), 60000u);
  EXPECT_EQ(*f.get_i8("k.i64"), -5);
  EXPECT_EQ(*f.get_f64("k.f32"), 0.5);

  auto neg = f.get_u32("k.i8");
  ASSERT_FALSE(neg.ok());
  EXPECT_EQ(neg.error().message, "metadata 'k.i8' is -100 (i8), which does not fit u32");
  auto big = f.get_u16("k.u32");
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().message, "metadata 'k.u32' is 4000000000 (u32), which does not fit u16");
  auto str = f.get_u32("general.architecture");
  ASSERT_FALSE(str.ok());
  EXPECT_EQ(str.error().message, "metadata 'general.architecture' has type string, expected an integer that fits u32");
  EXPECT_FALSE(f.get_u32("k.bool").ok());  // bool is not an integer
  EXPECT_FALSE(f.get_bool("k.u8").ok());
  EXPECT_FALSE(f.get_string("k.u8").ok());
  EXPECT_FALSE(f.get_array("k.u8").ok());
  EXPECT_FALSE(f.get_f32("k.u8").ok());
  auto gone = f.get_u32("glm5next.block_count");
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.error().message, "metadata key 'glm5next.block_count' is missing");
}

TEST(GgufReader, ArrayGettersConvertElementwise) {
  auto r = parse(valid_file());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r->get_i64_array("k.arr_i32"), (std::vector<int64_t>{1, -2, 3}));
  auto u = r->get_u32_array("k.arr_i32");
  ASSERT_FALSE(u.ok());
  EXPECT_EQ(u.error().message, "metadata 'k.arr_i32' element 1 is -2, which does not fit u32");
  EXPECT_TRUE(r->get_f32_array("k.arr_empty_f64")->empty());
  auto s = r->get_f32_array("k.arr_str");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message, "metadata 'k.arr_str' is an array of string, expected an array of f32 or f64");
  EXPECT_FALSE(r->get_string_array("k.arr_i32").ok());
}

TEST(GgufReader, HonoursGeneralAlignmentAndVersion2) {
  GgufBytes g;
  g.header(1, 1, 2).kv_u32("general.alignment", 64).tensor("t", {3}, 0, 0).pad_to(64).fill(12, 1);
  auto r = parse(g);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->version(), 2u);
  EXPECT_EQ(r->alignment(), 64u);
  EXPECT_EQ(r->data_offset(), 128u);  // the infos end at byte 90
}

TEST(GgufReader, ZeroDimsAndEmptyTensorsAreAccepted) {
  GgufBytes g;
  g.header(3, 0).tensor("scalar", {}, 0, 0).tensor("empty", {0, 5}, 12, 32).tensor("after", {1}, 0, 32).pad_to(32);
  g.fill(36, 0);
  auto r = parse(g);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->find_tensor("scalar")->n_elements, 1u);
  EXPECT_EQ(r->find_tensor("scalar")->n_bytes, 4u);
  EXPECT_EQ(r->find_tensor("empty")->n_bytes, 0u);  // no bytes, so sharing offset 32 overlaps nothing

  // Nothing but an empty tensor: the file may end before the (aligned) data section begins.
  GgufBytes bare;
  bare.header(1, 0).tensor("e", {0}, 0, 0);
  auto b = parse(bare);
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_GT(b->data_offset(), b->file_size());
  EXPECT_TRUE(b->tensors()[0].data.empty());
}

TEST(GgufReader, EveryTruncationIsAnErrorWithAnOffset) {
  const GgufBytes full = valid_file();
  for (size_t n = 0; n < full.b.size(); ++n) {
    auto r = GgufFile::parse(std::span<const uint8_t>(full.b.data(), n));
    ASSERT_FALSE(r.ok()) << "prefix of " << n << " bytes parsed";
    EXPECT_LE(r.error().offset, n) << r.error().message;
    EXPECT_FALSE(r.error().message.empty());
  }
}

TEST(GgufReader, SingleByteCorruptionsNeverCrash) {
  // A cheap in-suite cousin of the fuzzer (tests/fuzz): any outcome is fine but a crash or hang.
  const GgufBytes full = valid_file();
  for (size_t i = 0; i < full.b.size(); ++i) {
    for (uint8_t v : {uint8_t{0x00}, uint8_t{0x01}, uint8_t{0x7f}, uint8_t{0x80}, uint8_t{0xff}}) {
      std::vector<uint8_t> copy = full.b;
      copy[i] = v;
      auto r = GgufFile::parse(copy);
      if (!r.ok()) {
        EXPECT_FALSE(r.error().message.empty());
      }
    }
  }
}

TEST(GgufReader, BadMagicAndVersion) {
  GgufBytes g;
  expect_error(g, {"at byte 0", "too short"});
  g.b = {'G', 'G', 'M', 'L', 3, 0, 0, 0};
  expect_error(g, {"magic is 'GGML'", "expected 'GGUF'"});
  expect_error(GgufBytes{}.header(0, 0, 1), {"at byte 4", "version 1 is not supported"});
  expect_error(GgufBytes{}.header(0, 0, 4), {"version 4 is not supported", "2 and 3"});
  expect_error(GgufBytes{}.header(0, 0, 0x03000000), {"byte-swapped"});
}

TEST(GgufReader, ErrorCodesSayWhatKindOfProblem) {
  auto version = parse(GgufBytes{}.header(0, 0, 1));
  ASSERT_FALSE(version.ok());
  EXPECT_EQ(version.error().code, ferry::ErrorCode::unsupported);
  EXPECT_EQ(version.error().offset, 4u);
  auto count = parse(GgufBytes{}.header(0, 1ull << 60));
  ASSERT_FALSE(count.ok());
  EXPECT_EQ(count.error().code, ferry::ErrorCode::invalid_input);
  EXPECT_EQ(count.error().offset, 16u);
  auto missing = GgufFile::open("/nonexistent/none.gguf");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ferry::ErrorCode::io);
  EXPECT_EQ(missing.error().offset, ferry::Error::kNoOffset);
}

TEST(GgufReader, AbsurdCounts) {
  expect_error(GgufBytes{}.header(0, 1ull << 60), {"at byte 16", "metadata count 1152921504606846976 cannot fit"});
  expect_error(GgufBytes{}.header(~0ull, 0), {"at byte 8", "tensor count 18446744073709551615 cannot fit"});
  GgufBytes arr;
  arr.header(0, 1).str("k").u32(9).u32(4).u64(1ull << 62).fill(16, 0);
  expect_error(arr, {"array 'k' claims 4611686018427387904 elements of type u32 but only 16 bytes follow"});
  GgufBytes strs;
  strs.header(0, 1).str("k").u32(9).u32(8).u64(3).str("x");
  expect_error(strs, {"array 'k' claims 3 elements of type string"});
}

TEST(GgufReader, StringsAndKeys) {
  GgufBytes past;
  past.header(0, 1).str("k").u32(8).u64(100).fill(10, 'x');
  expect_error(past, {"the string value of 'k' is 100 bytes long but only 10 bytes follow"});
  GgufBytes long_key;
  long_key.header(0, 1).u64(70000).fill(70000, 'k').u32(4).u32(1);
  expect_error(long_key, {"at byte 24", "metadata key 0 is 70000 bytes long; at most 65535 allowed"});
  GgufBytes bad_utf8;
  bad_utf8.header(0, 1).kv_u32("k\xc0\xaf", 1);  // an overlong '/'
  expect_error(bad_utf8, {"metadata key 0 'k\\xc0\\xaf' is not valid UTF-8"});
  GgufBytes empty;
  empty.header(0, 1).kv_u32("", 1);
  expect_error(empty, {"metadata key 0 is empty"});
  GgufBytes dup;
  dup.header(0, 2).kv_u32("a.b", 1).kv_u32("a.b", 2);
  expect_error(dup, {"duplicate metadata key 'a.b'"});
}

TEST(GgufReader, ValueTypes) {
  GgufBytes unknown;
  unknown.header(0, 1).str("k").u32(13).u32(0);
  expect_error(unknown, {"metadata 'k' has value type 13, expected 0..12"});
  GgufBytes elem;
  elem.header(0, 1).str("k").u32(9).u32(99).u64(0);
  expect_error(elem, {"array 'k' has element type 99"});
  GgufBytes b;
  b.header(0, 1).str("k").u32(7).put<uint8_t>(2);
  expect_error(b, {"bool in 'k' is 2, expected 0 or 1"});
}

TEST(GgufReader, NestingDepthIsBounded) {
  auto nested = [](uint32_t depth) {
    GgufBytes g;
    g.header(0, 1).str("k").u32(9);
    for (uint32_t i = 1; i < depth; ++i) g.u32(9).u64(1);
    g.u32(0).u64(1).put<uint8_t>(7);
    return g;
  };
  EXPECT_TRUE(parse(nested(GgufFile::kMaxArrayDepth)).ok());
  expect_error(nested(GgufFile::kMaxArrayDepth + 1), {"arrays in 'k' nest deeper than 8 levels"});
  expect_error(nested(100000), {"nest deeper"});
}

TEST(GgufReader, Alignment) {
  GgufBytes odd;
  odd.header(0, 1).kv_u32("general.alignment", 48);
  expect_error(odd, {"at byte 24", "general.alignment is 48, expected a power of two"});
  GgufBytes zero;
  zero.header(0, 1).kv_u32("general.alignment", 0);
  expect_error(zero, {"general.alignment is 0"});
  GgufBytes wide;
  wide.header(0, 1).str("general.alignment").u32(10).u64(32);
  expect_error(wide, {"general.alignment has type u64, expected u32"});
}

TEST(GgufReader, TensorInfos) {
  auto one = [](std::vector<uint64_t> dims, uint32_t type) {
    GgufBytes g;
    g.header(1, 0).tensor("t", std::move(dims), type, 0).pad_to(32).fill(4096, 0);
    return g;
  };
  expect_error(one({1, 1, 1, 1, 1}, 0), {"tensor 't' has 5 dimensions, at most 4 allowed"});
  expect_error(one({1ull << 32, 1ull << 32}, 0), {"tensor 't' has more than 2^63-1 elements"});
  expect_error(one({1ull << 63}, 0), {"dimension 0 is 9223372036854775808, larger than 2^63-1"});
  expect_error(one({8}, 4), {"tensor 't' has ggml type 4, which ggml does not define"});
  expect_error(one({8}, 1000), {"ggml type 1000"});
  expect_error(one({48, 2}, 12), {"tensor 't' of type q4_K has rows of 48 elements, not a multiple of its block size 256"});
  expect_error(one({1ull << 62}, 28), {"tensor 't' is too large: its size in bytes overflows 64 bits"});
  GgufBytes long_name;
  long_name.header(1, 0).tensor(std::string(65, 'n'), {1}, 0, 0);
  expect_error(long_name, {"the name of tensor 0 is 65 bytes long; at most 64 allowed"});
  GgufBytes bad_name;
  bad_name.header(1, 0).tensor("\xff", {1}, 0, 0);
  expect_error(bad_name, {"not valid UTF-8"});
  GgufBytes dup;
  dup.header(2, 0).tensor("t", {1}, 0, 0).tensor("t", {1}, 0, 32).pad_to(32).fill(64, 0);
  expect_error(dup, {"duplicate tensor name 't'"});
}

TEST(GgufReader, TensorPlacement) {
  GgufBytes misaligned;
  misaligned.header(1, 0).tensor("t", {1}, 0, 4).pad_to(32).fill(64, 0);
  expect_error(misaligned, {"tensor 't' has data offset 4, not a multiple of the alignment 32"});
  GgufBytes past;
  past.header(1, 0).tensor("t", {16}, 0, 0).pad_to(32).fill(63, 0);
  expect_error(past, {"tensor 't' has data at [0, +64)", "past the end of the file"});
  GgufBytes far;
  far.header(1, 0).tensor("t", {1}, 0, ~0ull - 31).pad_to(32).fill(64, 0);
  expect_error(far, {"past the end"});
  GgufBytes overlap;
  overlap.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {8}, 0, 32).pad_to(32).fill(96, 0);
  expect_error(overlap, {"tensor 'b' at data offset 32 overlaps tensor 'a' at [0, +64)"});
  GgufBytes out_of_order;  // gguf-py accepts any order as long as nothing overlaps
  out_of_order.header(2, 0).tensor("a", {8}, 0, 32).tensor("b", {8}, 0, 0).pad_to(32).fill(64, 0);
  EXPECT_TRUE(parse(out_of_order).ok());
}

TEST(GgufReader, OpensFilesThroughAMapping) {
  const auto dir = std::filesystem::temp_directory_path() / ("ferry_gguf_reader_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const GgufBytes g = valid_file();
  {
    std::ofstream out(dir / "ok.gguf", std::ios::binary);
    out.write(reinterpret_cast<const char*>(g.b.data()), static_cast<std::streamsize>(g.b.size()));
    std::ofstream empty(dir / "empty.gguf", std::ios::binary);
  }
  auto r = GgufFile::open(dir / "ok.gguf");
  ASSERT_TRUE(r.ok()) << r.error().message;
  GgufFile moved = std::move(*r);  // spans into the mapping survive the move
  EXPECT_EQ(moved.file_size(), g.b.size());
  EXPECT_EQ(moved.find_tensor("b.weight")->data[0], 0x5a);

  auto empty = GgufFile::open(dir / "empty.gguf");
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.error().message.find("empty.gguf: at byte 0: file is 0 bytes"), std::string::npos);
  EXPECT_EQ(empty.error().offset, 0u);  // the path in front of the message keeps the offset
  auto missing = GgufFile::open(dir / "none.gguf");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("none.gguf: cannot open: No such file"), std::string::npos);
  auto directory = GgufFile::open(dir);
  EXPECT_FALSE(directory.ok());
  std::filesystem::remove_all(dir);
}

TEST(GgufReader, Utf8Validation) {
  EXPECT_TRUE(is_valid_utf8("plain.ascii"));
  EXPECT_TRUE(is_valid_utf8("\xe2\x82\xac \xf0\x9f\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("\x80"));
  EXPECT_FALSE(is_valid_utf8("\xe2\x82"));          // truncated
  EXPECT_FALSE(is_valid_utf8("\xed\xa0\x80"));      // surrogate
  EXPECT_FALSE(is_valid_utf8("\xf4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(is_valid_utf8("\xe0\x80\xaf"));      // overlong
}
