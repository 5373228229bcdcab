#pragma once
// GGUF (v2 and v3) model files: the value model shared by the reader and the writer
// (model/formats/gguf_writer.hpp), and the reader. The reader maps the file read-only and never reads the
// tensor data itself: a 190 GB file opens in the time it takes to parse its header. Every field of
// the header is validated, so a truncated or hostile file gives an Error naming what was wrong and
// where (its offset), never a crash or an over-read. Errors are values: nothing in the GGUF code throws.
//
// Layout (ggml docs/gguf.md): "GGUF", u32 version, u64 tensor_count, u64 kv_count, kv_count
// metadata pairs, tensor_count tensor infos, zero padding up to `alignment`, then the data section
// in which every tensor starts at a multiple of `alignment`. Little-endian throughout.
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "config/expected.hpp"
#include "model/formats/ggml_type.hpp"
#include "model/formats/mapped_file.hpp"

namespace ferry::model {

// ---- metadata values ------------------------------------------------------------------------------

// On-disk ids of `enum gguf_type`.
enum class GgufValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7, String = 8, Array = 9,
  U64 = 10, I64 = 11, F64 = 12,
};
// "u8", "i8", ..., "f64", "bool", "string", "array"; "type N" for an id outside the enum.
std::string gguf_value_type_name(GgufValueType type);

struct GgufArray;

// A metadata array: elements of one type, held as a vector of that C++ type. The variant's index is
// the element's GgufValueType id, so an empty array still knows its element type. Nested arrays
// are vectors of GgufArray (each inner array has its own element type, as gguf-py writes them).
// Strings are raw bytes as stored (GGUF says UTF-8; ferry does not reject a value that is not).
using GgufArrayItems =
    std::variant<std::vector<uint8_t>, std::vector<int8_t>, std::vector<uint16_t>, std::vector<int16_t>,
                 std::vector<uint32_t>, std::vector<int32_t>, std::vector<float>, std::vector<bool>,
                 std::vector<std::string>, std::vector<GgufArray>, std::vector<uint64_t>,
                 std::vector<int64_t>, std::vector<double>>;

struct GgufArray {
  GgufArrayItems items;

  GgufValueType element_type() const { return static_cast<GgufValueType>(items.index()); }
  size_t size() const;
  // The elements when they are exactly of type T, else nullptr.
  template <class T>
  const std::vector<T>* as() const { return std::get_if<std::vector<T>>(&items); }
  bool operator==(const GgufArray&) const = default;
};

// A metadata value; the variant's index is its GgufValueType id (so `GgufValue{uint32_t{46}}` is a
// GGUF u32 and `GgufValue{std::string("glm5next")}` a GGUF string).
using GgufValue = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool,
                               std::string, GgufArray, uint64_t, int64_t, double>;

inline GgufValueType gguf_value_type(const GgufValue& v) { return static_cast<GgufValueType>(v.index()); }

struct GgufKv {
  std::string key;
  GgufValue value;
};

// ---- tensors --------------------------------------------------------------------------------------

struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> dims;  // as in the file: dims[0] is ne0, the contiguous one; 0 to 4 dims
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;         // from the start of the data section (a multiple of the alignment)
  uint64_t n_elements = 0;     // product of dims (1 for 0 dims)
  uint64_t n_bytes = 0;        // size of the data in the file
  uint64_t file_offset = 0;    // from the start of the file: data_offset() + offset
  // The bytes in the mapping; valid as long as the GgufFile that produced it (moves included).
  std::span<const uint8_t> data;
};

// ---- the reader -----------------------------------------------------------------------------------

class GgufFile {
 public:
  static constexpr uint32_t kDefaultAlignment = 32;
  static constexpr uint32_t kMaxDims = 4;           // GGML_MAX_DIMS
  static constexpr uint64_t kMaxKeyBytes = 65535;   // gguf.md: keys are at most 65535 bytes
  static constexpr uint64_t kMaxNameBytes = 64;     // gguf.md: tensor names are at most 64 bytes
  static constexpr uint32_t kMaxArrayDepth = 8;     // nested arrays deeper than this are refused

  // Maps `path` read-only and parses the header. The error message starts with the path.
  static Expected<GgufFile> open(const std::filesystem::path& path);
  // Parses bytes the caller keeps alive for the lifetime of the result (tests, the fuzzer).
  static Expected<GgufFile> parse(std::span<const uint8_t> bytes);

  GgufFile(GgufFile&&) noexcept = default;
  GgufFile& operator=(GgufFile&&) noexcept = default;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }  // general.alignment, else 32
  uint64_t data_offset() const { return data_offset_; }  // start of the data section in the file
  uint64_t file_size() const { return bytes_.size(); }
  std::span<const uint8_t> bytes() const { return bytes_; }  // the whole mapped file

  // All metadata in file order.
  std::span<const GgufKv> metadata() const { return kvs_; }
  const GgufValue* find(std::string_view key) const;
  bool contains(std::string_view key) const { return find(key) != nullptr; }

  // Typed getters. The error says the key is missing, or its type and value and what was expected.
  // Integer getters accept a value of any integer type (not bool) that fits the requested type.
  Expected<uint8_t> get_u8(std::string_view key) const;
  Expected<uint16_t> get_u16(std::string_view key) const;
  Expected<uint32_t> get_u32(std::string_view key) const;
  Expected<uint64_t> get_u64(std::string_view key) const;
  Expected<int8_t> get_i8(std::string_view key) const;
  Expected<int16_t> get_i16(std::string_view key) const;
  Expected<int32_t> get_i32(std::string_view key) const;
  Expected<int64_t> get_i64(std::string_view key) const;
  Expected<float> get_f32(std::string_view key) const;    // an f32, or an f64 rounded to f32
  Expected<double> get_f64(std::string_view key) const;   // an f32 or an f64
  Expected<bool> get_bool(std::string_view key) const;
  Expected<std::string_view> get_string(std::string_view key) const;  // a view into this object
  Expected<const GgufArray*> get_array(std::string_view key) const;   // never nullptr when ok
  // Arrays converted element-wise under the same rules as the scalar getters (every element must
  // fit); what the hyper-parameter loader needs for per-layer values.
  Expected<std::vector<uint32_t>> get_u32_array(std::string_view key) const;
  Expected<std::vector<int64_t>> get_i64_array(std::string_view key) const;
  Expected<std::vector<float>> get_f32_array(std::string_view key) const;
  Expected<const std::vector<std::string>*> get_string_array(std::string_view key) const;

  // Tensors in file order, and by name.
  std::span<const GgufTensorInfo> tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;

 private:
  GgufFile() = default;
  friend class GgufParser;

  MappedFile mapping_;  // empty when parsed from caller-owned bytes
  std::span<const uint8_t> bytes_;
  uint32_t version_ = 0;
  uint32_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<GgufKv> kvs_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// True when `s` is well-formed UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF).
bool is_valid_utf8(std::string_view s);

}  // namespace ferry::model
