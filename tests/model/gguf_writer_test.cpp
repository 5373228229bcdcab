// The GGUF writer: round trips through ferry's reader, refusals, producer failures. The files of
// GgufWriterFiles are also read by the PyPI gguf package: tests/python/test_gguf_format.py runs
// this binary with FERRY_GGUF_OUT set and checks them against the same expectations.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <limits>
#include <string>

#include <unistd.h>

#include "model/formats/gguf.hpp"
#include "model/formats/gguf_writer.hpp"

using namespace ferry::model;

namespace {

// Byte j of the k-th tensor of a test file (test_gguf_format.py computes the same).
uint8_t pattern(uint64_t k, uint64_t j) { return static_cast<uint8_t>((j * 131 + k * 17 + 7) & 0xff); }

// Streams the pattern in uneven chunks, as a converter producing rows would.
GgufTensorProducer pattern_producer(uint64_t k, uint64_t n_bytes) {
  return [k, n_bytes](GgufSink& out) {
    std::vector<uint8_t> chunk;
    for (uint64_t j = 0; j < n_bytes;) {
      const uint64_t n = std::min<uint64_t>(n_bytes - j, 7 + (j % 5));
      chunk.resize(n);
      for (uint64_t i = 0; i < n; ++i) chunk[i] = pattern(k, j + i);
      out.write(chunk);
      j += n;
    }
  };
}

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> dims;
  GgmlType type;
};

void add_pattern_tensors(GgufWriter& w, const std::vector<TensorSpec>& specs) {
  for (size_t k = 0; k < specs.size(); ++k) {
    uint64_t n = 1;
    for (uint64_t d : specs[k].dims) n *= d;
    const uint64_t bytes = *ggml_bytes(specs[k].type, n);
    ASSERT_FALSE(w.add_tensor(specs[k].name, specs[k].dims, specs[k].type, pattern_producer(k, bytes)));
  }
}

GgufArray arr(GgufArrayItems items) { return GgufArray{std::move(items)}; }

const std::vector<TensorSpec> kAllTypesTensors = {
    {"t0.f32", {5, 3}, GgmlType::F32},          {"t1.f16", {8}, GgmlType::F16},
    {"t2.bf16", {4, 2}, GgmlType::BF16},        {"t3.q8_0", {64, 2}, GgmlType::Q8_0},
    {"t4.q4_k", {256, 2}, GgmlType::Q4_K},      {"t5.iq3_s", {256}, GgmlType::IQ3_S},
    {"t6.i32", {3}, GgmlType::I32},             {"t7.f32_3d", {2, 3, 4}, GgmlType::F32},
    {"t8.f32_4d", {1, 2, 1, 2}, GgmlType::F32}, {"t9.q6_k", {512}, GgmlType::Q6_K},
};
const std::vector<TensorSpec> kAlign64Tensors = {
    {"a.f32", {3}, GgmlType::F32}, {"b.q5_k", {256}, GgmlType::Q5_K}, {"c.f16", {7}, GgmlType::F16}};

// Three files: every metadata type and several tensor types; general.alignment 64 with odd sizes;
// an empty file.
void write_interop_files(const std::filesystem::path& dir) {
  using Strings = std::vector<std::string>;
  GgufWriter w;
  auto set = [&](std::string key, GgufValue v) { ASSERT_FALSE(w.set(std::move(key), std::move(v))); };
  set("general.architecture", std::string("glm5next"));
  set("general.name", std::string("h\xc3\xa9llo \xe2\x9c\x93"));
  set("t.empty_string", std::string());
  set("t.u8", uint8_t{255});
  set("t.i8", int8_t{-128});
  set("t.u16", uint16_t{65535});
  set("t.i16", int16_t{-32768});
  set("t.u32", uint32_t{4294967295u});
  set("t.i32", std::numeric_limits<int32_t>::min());
  set("t.f32", -1.25e-7f);
  set("t.bool_true", true);
  set("t.bool_false", false);
  set("t.u64", std::numeric_limits<uint64_t>::max());
  set("t.i64", std::numeric_limits<int64_t>::min());
  set("t.f64", 3.141592653589793);
  set("t.arr.u8", arr(std::vector<uint8_t>{0, 1, 255}));
  set("t.arr.i8", arr(std::vector<int8_t>{-128, 0, 127}));
  set("t.arr.u16", arr(std::vector<uint16_t>{0, 65535}));
  set("t.arr.i16", arr(std::vector<int16_t>{-32768, 32767}));
  set("t.arr.u32", arr(std::vector<uint32_t>{0, 4294967295u}));
  set("t.arr.i32", arr(std::vector<int32_t>{std::numeric_limits<int32_t>::min(), 2147483647}));
  set("t.arr.f32", arr(std::vector<float>{0.5f, -2.0f, 1e30f}));
  set("t.arr.bool", arr(std::vector<bool>{true, false, true}));
  set("t.arr.string", arr(Strings{"a", "", "\xc3\xbc"}));
  set("t.arr.u64", arr(std::vector<uint64_t>{0, std::numeric_limits<uint64_t>::max()}));
  set("t.arr.i64", arr(std::vector<int64_t>{std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()}));
  set("t.arr.f64", arr(std::vector<double>{0.1, -1e300}));
  set("t.arr.empty_u32", arr(std::vector<uint32_t>{}));
  set("t.nested.i32", arr(std::vector<GgufArray>{arr(std::vector<int32_t>{1, 2}), arr(std::vector<int32_t>{3}),
                                                 arr(std::vector<int32_t>{})}));
  set("t.nested.mixed", arr(std::vector<GgufArray>{arr(std::vector<uint8_t>{7}), arr(Strings{"x", "y"})}));
  set("t.nested.deep", arr(std::vector<GgufArray>{arr(std::vector<GgufArray>{arr(std::vector<bool>{true})})}));
  add_pattern_tensors(w, kAllTypesTensors);
  auto r = w.write_file(dir / "ferry_all_types.gguf");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(*r, w.file_size());
  EXPECT_EQ(*r, std::filesystem::file_size(dir / "ferry_all_types.gguf"));

  GgufWriter a;
  ASSERT_FALSE(a.set("general.alignment", uint32_t{64}));
  add_pattern_tensors(a, kAlign64Tensors);
  ASSERT_TRUE(a.write_file(dir / "ferry_align64.gguf").ok());

  GgufWriter empty;
  ASSERT_TRUE(empty.write_file(dir / "ferry_empty.gguf").ok());
}

std::filesystem::path temp_dir(const char* tag) {
  auto dir = std::filesystem::temp_directory_path() / (std::string("ferry_") + tag + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

void expect_pattern(const GgufFile& f, const std::vector<TensorSpec>& specs) {
  ASSERT_EQ(f.tensors().size(), specs.size());
  for (size_t k = 0; k < specs.size(); ++k) {
    const GgufTensorInfo& t = f.tensors()[k];
    EXPECT_EQ(t.name, specs[k].name);
    EXPECT_EQ(t.dims, specs[k].dims);
    EXPECT_EQ(t.type, specs[k].type);
    EXPECT_EQ(t.offset % f.alignment(), 0u);
    for (uint64_t j = 0; j < t.n_bytes; ++j) {
      ASSERT_EQ(t.data[j], pattern(k, j)) << t.name << " byte " << j;
    }
  }
}

}  // namespace

TEST(GgufWriterFiles, WriteForPython) {
  const char* out = std::getenv("FERRY_GGUF_OUT");
  if (out == nullptr) GTEST_SKIP() << "FERRY_GGUF_OUT is not set (test_gguf_format.py sets it)";
  write_interop_files(out);
}

TEST(GgufWriter, RoundTripsThroughTheReader) {
  const auto dir = temp_dir("gguf_writer");
  write_interop_files(dir);
  auto f = GgufFile::open(dir / "ferry_all_types.gguf");
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->version(), 3u);
  ASSERT_EQ(f->metadata().size(), 31u);
  EXPECT_EQ(f->metadata()[0].key, "general.architecture");
  EXPECT_EQ(*f->get_string("general.name"), "h\xc3\xa9llo \xe2\x9c\x93");
  EXPECT_EQ(*f->get_u64("t.u64"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(*f->get_i64("t.i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(*f->get_f32("t.f32"), -1.25e-7f);
  EXPECT_EQ(*f->get_bool("t.bool_false"), false);
  EXPECT_EQ(*(*f->get_array("t.arr.bool"))->as<bool>(), (std::vector<bool>{true, false, true}));
  const GgufArray& mixed = *std::get_if<GgufArray>(f->find("t.nested.mixed"));
  EXPECT_EQ((*mixed.as<GgufArray>())[1], arr(std::vector<std::string>{"x", "y"}));
  EXPECT_EQ((*f->get_array("t.arr.empty_u32"))->element_type(), GgufValueType::U32);
  expect_pattern(*f, kAllTypesTensors);

  auto a = GgufFile::open(dir / "ferry_align64.gguf");
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_EQ(a->alignment(), 64u);
  EXPECT_EQ(a->data_offset() % 64, 0u);
  expect_pattern(*a, kAlign64Tensors);
  // Each tensor is padded, the last one too, as ggml sizes its data section.
  EXPECT_EQ(a->file_size() - a->data_offset(), 64u + 192u + 64u);

  auto e = GgufFile::open(dir / "ferry_empty.gguf");
  ASSERT_TRUE(e.ok()) << e.error().message;
  EXPECT_EQ(e->file_size(), 32u);  // a 24-byte header padded to the alignment
  std::filesystem::remove_all(dir);
}

TEST(GgufWriter, ReplacesAnExistingKeyInPlace) {
  GgufWriter w;
  ASSERT_FALSE(w.set("a", uint32_t{1}));
  ASSERT_FALSE(w.set("b", uint32_t{2}));
  ASSERT_FALSE(w.set("a", std::string("x")));
  const auto dir = temp_dir("gguf_replace");
  ASSERT_TRUE(w.write_file(dir / "r.gguf").ok());
  auto f = GgufFile::open(dir / "r.gguf");
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(f->metadata().size(), 2u);
  EXPECT_EQ(f->metadata()[0].key, "a");
  EXPECT_EQ(*f->get_string("a"), "x");
  std::filesystem::remove_all(dir);
}

TEST(GgufWriter, RefusesBadMetadata) {
  GgufWriter w;
  EXPECT_EQ(w.set("", uint8_t{1})->message, "metadata key is empty");
  EXPECT_NE(w.set(std::string(65536, 'k'), uint8_t{1})->message.find("65536 bytes long; at most 65535"), std::string::npos);
  EXPECT_EQ(w.set("k\xff", uint8_t{1})->message, "metadata key is not valid UTF-8");
  EXPECT_EQ(w.set("general.alignment", uint64_t{32})->message, "general.alignment must be a u32, not u64");
  EXPECT_EQ(w.set("general.alignment", uint32_t{24})->message, "general.alignment must be a power of two, not 24");
  GgufArray deep = arr(std::vector<uint8_t>{1});
  for (int i = 0; i < 8; ++i) deep = arr(std::vector<GgufArray>{deep});
  EXPECT_EQ(w.set("deep", deep)->message, "metadata 'deep' nests arrays 9 deep; at most 8 allowed");
  EXPECT_EQ(w.tensor_count(), 0u);
}

TEST(GgufWriter, RefusesBadTensors) {
  GgufWriter w;
  auto noop = [](GgufSink&) {};
  EXPECT_EQ(w.add_tensor("", {1}, GgmlType::F32, noop)->message, "tensor name is empty");
  EXPECT_NE(w.add_tensor(std::string(64, 'n'), {1}, GgmlType::F32, noop)->message.find("64 bytes long; at most 63"),
            std::string::npos);
  EXPECT_EQ(w.add_tensor("t", {1, 1, 1, 1, 1}, GgmlType::F32, noop)->message,
            "tensor 't' has 5 dimensions, at most 4 allowed");
  EXPECT_EQ(w.add_tensor("t", {100}, GgmlType::Q4_K, noop)->message,
            "tensor 't' of type q4_K has rows of 100 elements, not a multiple of its block size 256");
  EXPECT_EQ(w.add_tensor("t", {1ull << 40, 1ull << 40}, GgmlType::F32, noop)->message,
            "tensor 't' has more than 2^63-1 elements");
  EXPECT_EQ(w.add_tensor("t", {1}, GgmlType::F32, nullptr)->message, "tensor 't' has no producer for its data");
  EXPECT_EQ(w.add_tensor("t", {1}, static_cast<GgmlType>(4), noop)->message, "tensor 't' has ggml type id 4, unknown");
  EXPECT_FALSE(w.add_tensor("t", {1}, GgmlType::F32, noop));
  EXPECT_EQ(w.add_tensor("t", {2}, GgmlType::F32, noop)->message, "duplicate tensor name 't'");
  EXPECT_EQ(w.tensor_count(), 1u);
}

TEST(GgufWriter, ProducerFailuresLeaveNoFile) {
  const auto dir = temp_dir("gguf_producer");
  const auto path = dir / "out.gguf";
  struct Case {
    GgufTensorProducer produce;
    std::string message;
    ferry::ErrorCode code;  // a producer that miscounts is a bug; one that fails says the input is bad
  };
  const uint8_t bytes[12] = {};
  const std::vector<Case> cases = {
      {[&](GgufSink& s) { s.write(bytes, 8); }, "tensor 'b': the producer wrote 8 bytes, expected 12",
       ferry::ErrorCode::internal},
      {[&](GgufSink& s) {
         s.write(bytes, 12);
         s.write(bytes, 1);
       },
       "tensor 'b': the producer wrote more than the tensor's 12 bytes", ferry::ErrorCode::internal},
      {[&](GgufSink& s) {
         s.fail("shard 3 is truncated");
         EXPECT_TRUE(s.failed());
       },
       "tensor 'b': shard 3 is truncated", ferry::ErrorCode::invalid_input},
  };
  for (const Case& c : cases) {
    GgufWriter w;
    ASSERT_FALSE(w.add_tensor("a", {1}, GgmlType::F32, [&](GgufSink& s) { s.write(bytes, 4); }));
    ASSERT_FALSE(w.add_tensor("b", {3}, GgmlType::F32, c.produce));
    auto r = w.write_file(path);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message, c.message);
    EXPECT_EQ(r.error().code, c.code);
    EXPECT_FALSE(std::filesystem::exists(path));
    EXPECT_FALSE(std::filesystem::exists(dir / "out.gguf.partial"));
  }
  GgufWriter w;
  auto r = w.write_file(dir / "no_such_dir" / "x.gguf");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("x.gguf.partial: cannot create: No such file or directory"), std::string::npos);
  EXPECT_EQ(r.error().code, ferry::ErrorCode::io);
  std::filesystem::remove_all(dir);
}
