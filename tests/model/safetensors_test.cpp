// The safetensors reader on files written by hand (u64 header length + JSON + data): dtypes,
// shapes, sharded checkpoints, and one test per kind of broken header.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "model/formats/safetensors.hpp"

using namespace ferry::model;

namespace {

std::vector<uint8_t> make_file(std::string_view header, const std::vector<uint8_t>& data) {
  // Sized once and filled with memcpy: GCC 12 -O3 reports a false -Warray-bounds on inserts here.
  std::vector<uint8_t> out(8 + header.size() + data.size());
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  if (!header.empty()) std::memcpy(out.data() + 8, header.data(), header.size());
  if (!data.empty()) std::memcpy(out.data() + 8 + header.size(), data.data(), data.size());
  return out;
}

std::vector<uint8_t> iota(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + 1);
  return v;
}

void expect_error(std::string_view header, const std::vector<uint8_t>& data, std::string_view part) {
  const auto bytes = make_file(header, data);
  auto r = Safetensors::parse(bytes, "x.safetensors");
  ASSERT_FALSE(r.ok()) << "parsed: " << header;
  EXPECT_NE(r.error().message.find(part), std::string::npos) << r.error().message << "\nmissing: " << part;
  EXPECT_EQ(r.error().message.rfind("x.safetensors: ", 0), 0u) << r.error().message;
  EXPECT_EQ(r.error().code, ferry::ErrorCode::invalid_input);
}

void write(const std::filesystem::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}
void write(const std::filesystem::path& p, std::string_view text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
}

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const char* tag)
      : path(std::filesystem::temp_directory_path() / (std::string("ferry_st_") + tag + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

}  // namespace

TEST(Safetensors, ReadsDtypesShapesAndMetadata) {
  // Listed out of data order on purpose: tensors() comes back in data order.
  const std::string header = R"({
    "b.bf16": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [16, 28]},
    "__metadata__": {"format": "pt", "note": "caf\u00e9"},
    "a.f32": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
    "c.f8": {"dtype": "F8_E4M3", "shape": [2, 2], "data_offsets": [28, 32]},
    "d.scale": {"dtype": "F32", "shape": [1, 1], "data_offsets": [32, 36], "extra": [1, {"x": 2}]},
    "e.i64": {"dtype": "I64", "shape": [1], "data_offsets": [36, 44]},
    "f.i32": {"dtype": "I32", "shape": [], "data_offsets": [44, 48]},
    "g.u8": {"dtype": "U8", "shape": [3], "data_offsets": [48, 51]},
    "h.bool": {"dtype": "BOOL", "shape": [1], "data_offsets": [51, 52]},
    "i.empty": {"dtype": "F16", "shape": [0, 5], "data_offsets": [52, 52]}
  }   )";  // trailing spaces pad headers to 8 bytes in the crate's writer
  const auto data = iota(52);
  const auto bytes = make_file(header, data);
  auto r = Safetensors::parse(bytes);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const Safetensors& s = *r;
  ASSERT_EQ(s.tensors().size(), 9u);
  EXPECT_EQ(s.tensors()[0].name, "a.f32");
  EXPECT_EQ(s.tensors()[1].name, "b.bf16");
  EXPECT_EQ(s.tensors()[8].name, "i.empty");
  const SafetensorsTensor* b = s.find("b.bf16");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, SafetensorsDtype::BF16);
  EXPECT_EQ(b->shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(b->n_elements, 6u);
  EXPECT_EQ(b->n_bytes, 12u);
  EXPECT_EQ(b->file_offset, 8 + header.size() + 16);
  EXPECT_EQ(b->data.data(), bytes.data() + b->file_offset);
  EXPECT_EQ(b->data[0], data[16]);
  EXPECT_EQ(s.find("c.f8")->dtype, SafetensorsDtype::F8_E4M3);
  EXPECT_EQ(s.find("f.i32")->n_elements, 1u);  // a scalar
  EXPECT_EQ(s.find("h.bool")->dtype, SafetensorsDtype::BOOL);
  EXPECT_EQ(s.find("i.empty")->n_bytes, 0u);
  EXPECT_EQ(s.find("nope"), nullptr);
  EXPECT_EQ(s.metadata().at("format"), "pt");
  EXPECT_EQ(s.metadata().at("note"), "caf\xc3\xa9");
  EXPECT_TRUE(s.shards().empty());
}

TEST(Safetensors, DtypeNames) {
  EXPECT_EQ(safetensors_dtype_from_name("F8_E4M3"), SafetensorsDtype::F8_E4M3);
  EXPECT_EQ(safetensors_dtype_name(SafetensorsDtype::BF16), "BF16");
  EXPECT_EQ(safetensors_dtype_size(SafetensorsDtype::I64), 8u);
  EXPECT_FALSE(safetensors_dtype_from_name("f32").has_value());  // the format spells them upper-case
}

TEST(Safetensors, BrokenHeaders) {
  const auto d16 = iota(16);
  {
    const std::vector<uint8_t> tiny = {1, 2, 3};
    auto r = Safetensors::parse(tiny, "x.safetensors");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message, "x.safetensors: file is 3 bytes, too short for a header");
  }
  {
    std::vector<uint8_t> huge(16, 0);
    const uint64_t n = 1ull << 40;
    std::memcpy(huge.data(), &n, 8);
    auto r = Safetensors::parse(huge, "x.safetensors");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("header length 1099511627776 is larger than the 100000000 bytes"), std::string::npos);
    const uint64_t m = 100;
    std::memcpy(huge.data(), &m, 8);
    r = Safetensors::parse(huge, "x.safetensors");
    EXPECT_NE(r.error().message.find("header length 100 runs past the end of the file (16 bytes)"), std::string::npos);
  }
  expect_error("[1, 2]", {}, "header does not start with '{'");
  expect_error("", {}, "header does not start with '{'");
  expect_error("{\"a\": ", {}, "header JSON");
  // simdjson 3.0.1 reports some trailing content in its own words (the document looks unbalanced).
  expect_error("{} trailing", {}, "header JSON: ");
  expect_error("{} {}", {}, "header JSON: unexpected content after the top-level object");
  expect_error(R"({"__metadata__": {}}})", {}, "header JSON: unexpected content after the top-level object");
  expect_error(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                   "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})",
               d16, "the header names 'a' twice");
  expect_error(R"({"a": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 16]}})", d16,
               "tensor 'a' has dtype 'Q4', expected one of");
  expect_error(R"({"a": {"dtype": 3, "shape": [4], "data_offsets": [0, 16]}})", d16, "tensor 'a' dtype is not a string");
  expect_error(R"({"a": {"dtype": "F32", "data_offsets": [0, 16]}})", d16, "tensor 'a' lacks shape");
  expect_error(R"({"a": {"dtype": "F32", "shape": [4]}})", d16, "tensor 'a' lacks data_offsets");
  expect_error(R"({"a": [1]})", d16, "tensor 'a' is not an object");
  expect_error(R"({"a": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}})", d16,
               "tensor 'a' shape holds a value that is not a non-negative integer");
  expect_error(R"({"a": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 16]}})", d16, "not a non-negative integer");
  expect_error(R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 16]}})", d16,
               "tensor 'a' has a shape whose size overflows");
  expect_error(R"({"a": {"dtype": "F64", "shape": [4611686018427387904], "data_offsets": [0, 16]}})", d16,
               "size overflows");
  expect_error(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16, 32]}})", d16,
               "tensor 'a' data_offsets has 3 numbers, expected 2");
  expect_error(R"({"a": {"dtype": "F32", "shape": [0], "data_offsets": [16, 0]}})", d16,
               "tensor 'a' data_offsets [16, 0] run backwards");
  expect_error(R"({"a": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}})", d16,
               "tensor 'a' data_offsets [0, 32] run past the end of the data (16 bytes)");
  expect_error(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [18446744073709551615, 18446744073709551615]}})",
               d16, "run past the end");
  expect_error(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}})", d16,
               "tensor 'a' holds 16 bytes but its dtype F32 and shape need 12");
  expect_error(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},
                   "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
               d16, "tensor 'b' at data offset 8 overlaps tensor 'a' at [0, 12)");
  expect_error(R"({"__metadata__": {"k": 1}})", {}, "__metadata__ 'k' is not a string");
  expect_error(R"({"__metadata__": [1]})", {}, "__metadata__ is not an object of strings");
  expect_error("{\"\xff\": {}}", {}, "header JSON");  // simdjson validates UTF-8
}

TEST(Safetensors, OpensOneFileOrADirectory) {
  TempDir dir("single");
  write(dir.path / "model.safetensors", make_file(R"({"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}})", iota(4)));
  for (const auto& p : {dir.path, dir.path / "model.safetensors"}) {
    auto r = Safetensors::open(p);
    ASSERT_TRUE(r.ok()) << r.error().message;
    ASSERT_EQ(r->tensors().size(), 1u);
    EXPECT_EQ(r->tensors()[0].data[3], iota(4)[3]);
    ASSERT_EQ(r->shards().size(), 1u);
    EXPECT_EQ(r->shards()[0], dir.path / "model.safetensors");
  }
  TempDir empty("empty");
  auto none = Safetensors::open(empty.path);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("neither model.safetensors.index.json nor model.safetensors"), std::string::npos);
  EXPECT_EQ(none.error().code, ferry::ErrorCode::io);
  auto missing = Safetensors::open(empty.path / "x.safetensors");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("x.safetensors: cannot open"), std::string::npos);
  EXPECT_EQ(missing.error().code, ferry::ErrorCode::io);
}

TEST(Safetensors, ShardedCheckpointIsOneTensorSet) {
  TempDir dir("sharded");
  write(dir.path / "model-00002-of-00002.safetensors",
        make_file(R"({"layers.1.w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]},
                      "lm_head.weight": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
                  iota(16)));
  write(dir.path / "model-00001-of-00002.safetensors",
        make_file(R"({"__metadata__": {"format": "pt"},
                      "layers.0.w": {"dtype": "F8_E4M3", "shape": [2, 4], "data_offsets": [0, 8]},
                      "layers.0.w_scale_inv": {"dtype": "F32", "shape": [1, 1], "data_offsets": [8, 12]}})",
                  iota(12)));
  write(dir.path / "model.safetensors.index.json", R"({
    "metadata": {"total_size": 28},
    "weight_map": {
      "layers.0.w": "model-00001-of-00002.safetensors",
      "layers.0.w_scale_inv": "model-00001-of-00002.safetensors",
      "layers.1.w": "model-00002-of-00002.safetensors",
      "lm_head.weight": "model-00002-of-00002.safetensors"
    }})");
  for (const auto& p : {dir.path, dir.path / "model.safetensors.index.json"}) {
    auto r = Safetensors::open(p);
    ASSERT_TRUE(r.ok()) << r.error().message;
    const Safetensors& s = *r;
    ASSERT_EQ(s.shards().size(), 2u);
    EXPECT_EQ(s.shards()[0].filename(), "model-00001-of-00002.safetensors");
    ASSERT_EQ(s.tensors().size(), 4u);
    EXPECT_EQ(s.tensors()[0].name, "layers.0.w");
    EXPECT_EQ(s.tensors()[0].shard, 0u);
    EXPECT_EQ(s.tensors()[3].name, "lm_head.weight");
    EXPECT_EQ(s.find("lm_head.weight")->shard, 1u);
    EXPECT_EQ(s.find("lm_head.weight")->data[0], iota(16)[8]);
    EXPECT_EQ(s.find("layers.0.w_scale_inv")->dtype, SafetensorsDtype::F32);
    EXPECT_EQ(s.metadata().at("format"), "pt");
  }
}

TEST(Safetensors, BrokenIndexes) {
  TempDir dir("bad_index");
  const auto shard = make_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", iota(4));
  write(dir.path / "s1.safetensors", shard);
  write(dir.path / "s2.safetensors", shard);
  const auto index = dir.path / "model.safetensors.index.json";
  auto expect_open_error = [&](std::string_view text, std::string_view part) {
    write(index, text);
    auto r = Safetensors::open(dir.path);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.error().message.find(part), std::string::npos) << r.error().message << "\nmissing: " << part;
  };
  expect_open_error(R"({"metadata": {}})", "model.safetensors.index.json: no weight_map");
  expect_open_error(R"({"weight_map": {"a": "../s1.safetensors"}})",
                    "weight_map 'a' names shard '../s1.safetensors', not a plain file name");
  expect_open_error(R"({"weight_map": {"a": "/etc/passwd"}})", "not a plain file name");
  expect_open_error(R"({"weight_map": {"a": 5}})", "weight_map 'a' is not a file name");
  expect_open_error(R"({"weight_map": {"a": "s1.safetensors", "a": "s1.safetensors"}})", "weight_map names 'a' twice");
  expect_open_error(R"({"weight_map": {"a": "s3.safetensors"}})", "s3.safetensors: cannot open");
  expect_open_error(R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})",
                    "tensor 'a' is in both");
  write(dir.path / "s2.safetensors",
        make_file(R"({"b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", iota(4)));
  expect_open_error(R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors", "c": "s2.safetensors"}})",
                    "weight_map puts 'b' in s1.safetensors, but it is in s2.safetensors");
  expect_open_error(R"({"weight_map": {"a": "s1.safetensors", "z": "s1.safetensors"}})",
                    "weight_map puts 'z' in s1.safetensors, but no shard holds it");
  expect_open_error("{\"weight_map\": {}} x", "model.safetensors.index.json: ");
  expect_open_error("{\"weight_map\": {}} x", "JSON");
}
