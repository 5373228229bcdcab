#include "model/formats/gguf.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "model/formats/quoted.hpp"

namespace ferry::model {

static_assert(std::endian::native == std::endian::little, "GGUF is read by reinterpreting little-endian bytes");

namespace {

std::string quoted_name(std::string_view s) { return quoted(s, 80); }

// Bytes of a value of this type when it is not an array or string (0 for those).
uint64_t fixed_size(uint32_t type) {
  switch (static_cast<GgufValueType>(type)) {
    case GgufValueType::U8: case GgufValueType::I8: case GgufValueType::Bool: return 1;
    case GgufValueType::U16: case GgufValueType::I16: return 2;
    case GgufValueType::U32: case GgufValueType::I32: case GgufValueType::F32: return 4;
    case GgufValueType::U64: case GgufValueType::I64: case GgufValueType::F64: return 8;
    default: return 0;
  }
}

bool known_value_type(uint32_t type) { return type <= static_cast<uint32_t>(GgufValueType::F64); }

// The fewest bytes one element of `type` takes in a file: what bounds an untrusted count before
// anything is allocated for it.
uint64_t min_encoded_size(uint32_t type) {
  if (type == static_cast<uint32_t>(GgufValueType::String)) return 8;   // u64 length
  if (type == static_cast<uint32_t>(GgufValueType::Array)) return 12;   // u32 type + u64 count
  return fixed_size(type);
}

}  // namespace

std::string gguf_value_type_name(GgufValueType type) {
  switch (type) {
    case GgufValueType::U8: return "u8";
    case GgufValueType::I8: return "i8";
    case GgufValueType::U16: return "u16";
    case GgufValueType::I16: return "i16";
    case GgufValueType::U32: return "u32";
    case GgufValueType::I32: return "i32";
    case GgufValueType::F32: return "f32";
    case GgufValueType::Bool: return "bool";
    case GgufValueType::String: return "string";
    case GgufValueType::Array: return "array";
    case GgufValueType::U64: return "u64";
    case GgufValueType::I64: return "i64";
    case GgufValueType::F64: return "f64";
  }
  return "type " + std::to_string(static_cast<uint32_t>(type));
}

size_t GgufArray::size() const {
  return std::visit([](const auto& v) { return v.size(); }, items);
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0;
    if ((c & 0xe0) == 0xc0) {
      len = 2, cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3, cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4, cp = c & 0x07;
    } else {
      return false;
    }
    if (s.size() - i < len) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    static constexpr uint32_t kMinForLength[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLength[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += len;
  }
  return true;
}

// ---- parsing --------------------------------------------------------------------------------------

// Reads the header of a GGUF image front to back. Every read is bounds-checked against the image;
// the first failure records an error (with its byte offset) and every caller returns false.
class GgufParser {
 public:
  explicit GgufParser(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  bool parse(GgufFile& f) {
    f.bytes_ = bytes_;
    if (!parse_preamble(f)) return false;
    if (!parse_metadata(f)) return false;
    if (!apply_alignment(f)) return false;
    if (!parse_tensor_infos(f)) return false;
    return place_tensors(f);
  }

  Error take_error() { return std::move(error_); }

 private:
  uint64_t remaining() const { return bytes_.size() - pos_; }

  bool fail(uint64_t at, std::string message, ErrorCode code = ErrorCode::invalid_input) {
    error_ = Error(code, "at byte " + std::to_string(at) + ": " + std::move(message), at);
    return false;
  }

  bool need(uint64_t n, const std::string& what) {
    if (remaining() < n) {
      return fail(pos_, "file ends inside " + what + " (needs " + std::to_string(n) + " bytes, " +
                            std::to_string(remaining()) + " left of " + std::to_string(bytes_.size()) + ")");
    }
    return true;
  }

  template <class T>
  bool read(T& out, const std::string& what) {
    if (!need(sizeof(T), what)) return false;
    std::memcpy(&out, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }

  // A u64 length then that many bytes. `max_len` bounds names; strings may be as long as the file.
  bool read_string(std::string& out, const std::string& what, uint64_t max_len) {
    const uint64_t at = pos_;
    uint64_t len = 0;
    if (!read(len, "the length of " + what)) return false;
    if (len > max_len) {
      return fail(at, what + " is " + std::to_string(len) + " bytes long; at most " + std::to_string(max_len) +
                          " allowed");
    }
    if (len > remaining()) {
      return fail(at, what + " is " + std::to_string(len) + " bytes long but only " +
                          std::to_string(remaining()) + " bytes follow in the file");
    }
    out.assign(reinterpret_cast<const char*>(bytes_.data() + pos_), static_cast<size_t>(len));
    pos_ += len;
    return true;
  }

  bool parse_preamble(GgufFile& f) {
    if (bytes_.size() < 4) return fail(0, "file is " + std::to_string(bytes_.size()) + " bytes, too short for a GGUF header");
    if (std::memcmp(bytes_.data(), "GGUF", 4) != 0) {
      return fail(0, "magic is " + quoted_name({reinterpret_cast<const char*>(bytes_.data()), 4}) +
                         ", expected 'GGUF': not a GGUF file");
    }
    pos_ = 4;
    uint32_t version = 0;
    if (!read(version, "the version")) return false;
    if (version == 1) {
      return fail(4, "GGUF version 1 is not supported (it predates 64-bit counts); versions 2 and 3 are",
                  ErrorCode::unsupported);
    }
    if (version != 2 && version != 3) {
      std::string why = "GGUF version " + std::to_string(version) + " is not supported; versions 2 and 3 are";
      if ((version & 0xffff) == 0) why += " (the value looks byte-swapped: a big-endian file?)";
      return fail(4, why, ErrorCode::unsupported);
    }
    f.version_ = version;
    if (!read(tensor_count_, "the tensor count") || !read(kv_count_, "the metadata count")) return false;
    // Each pair takes at least 13 bytes (key length, value type, a 1-byte value) and each tensor
    // info 24 (name length, n_dims, type, offset): refuse counts the file cannot hold before
    // reserving anything for them.
    if (kv_count_ > remaining() / 13) {
      return fail(16, "metadata count " + std::to_string(kv_count_) + " cannot fit in the " +
                          std::to_string(remaining()) + " bytes that follow");
    }
    if (tensor_count_ > (remaining() - kv_count_ * 13) / 24) {
      return fail(8, "tensor count " + std::to_string(tensor_count_) + " cannot fit in the " +
                         std::to_string(remaining()) + " bytes that follow");
    }
    return true;
  }

  bool parse_metadata(GgufFile& f) {
    f.kvs_.reserve(kv_count_);
    for (uint64_t i = 0; i < kv_count_; ++i) {
      const uint64_t at = pos_;
      const std::string what = "metadata key " + std::to_string(i);
      GgufKv kv;
      if (!read_string(kv.key, what, GgufFile::kMaxKeyBytes)) return false;
      if (kv.key.empty()) return fail(at, what + " is empty");
      if (!is_valid_utf8(kv.key)) return fail(at, what + " " + quoted_name(kv.key) + " is not valid UTF-8");
      if (f.kv_index_.count(kv.key) != 0) return fail(at, "duplicate metadata key " + quoted_name(kv.key));
      const uint64_t type_at = pos_;
      uint32_t type = 0;
      if (!read(type, "the value type of " + quoted_name(kv.key))) return false;
      if (!known_value_type(type)) {
        return fail(type_at, "metadata " + quoted_name(kv.key) + " has value type " + std::to_string(type) +
                                 ", expected 0..12");
      }
      if (!read_value(type, kv.value, kv.key, 0)) return false;
      if (kv.key == "general.alignment") alignment_at_ = at;
      f.kv_index_.emplace(kv.key, f.kvs_.size());
      f.kvs_.push_back(std::move(kv));
    }
    return true;
  }

  template <class T>
  bool read_scalar(GgufValue& out, const std::string& key) {
    T v{};
    if (!read(v, "the value of " + quoted_name(key))) return false;
    out = v;
    return true;
  }

  bool read_value(uint32_t type, GgufValue& out, const std::string& key, uint32_t depth) {
    switch (static_cast<GgufValueType>(type)) {
      case GgufValueType::U8: return read_scalar<uint8_t>(out, key);
      case GgufValueType::I8: return read_scalar<int8_t>(out, key);
      case GgufValueType::U16: return read_scalar<uint16_t>(out, key);
      case GgufValueType::I16: return read_scalar<int16_t>(out, key);
      case GgufValueType::U32: return read_scalar<uint32_t>(out, key);
      case GgufValueType::I32: return read_scalar<int32_t>(out, key);
      case GgufValueType::F32: return read_scalar<float>(out, key);
      case GgufValueType::U64: return read_scalar<uint64_t>(out, key);
      case GgufValueType::I64: return read_scalar<int64_t>(out, key);
      case GgufValueType::F64: return read_scalar<double>(out, key);
      case GgufValueType::Bool: {
        bool b = false;
        if (!read_bool(b, key)) return false;
        out = b;
        return true;
      }
      case GgufValueType::String: {
        std::string s;
        if (!read_string(s, "the string value of " + quoted_name(key), std::numeric_limits<uint64_t>::max())) return false;
        out = std::move(s);
        return true;
      }
      case GgufValueType::Array: {
        GgufArray a;
        if (!read_array(a, key, depth + 1)) return false;
        out = std::move(a);
        return true;
      }
    }
    return false;  // unreachable: callers check known_value_type first
  }

  bool read_bool(bool& out, const std::string& key) {
    const uint64_t at = pos_;
    uint8_t b = 0;
    if (!read(b, "the value of " + quoted_name(key))) return false;
    if (b > 1) return fail(at, "bool in " + quoted_name(key) + " is " + std::to_string(b) + ", expected 0 or 1");
    out = b != 0;
    return true;
  }

  // `count` was checked against the bytes left, so this allocates no more than the file holds.
  template <class T>
  bool read_elements(std::vector<T>& v, uint64_t count) {
    v.resize(static_cast<size_t>(count));
    if (count > 0) {
      std::memcpy(v.data(), bytes_.data() + pos_, count * sizeof(T));
      pos_ += count * sizeof(T);
    }
    return true;
  }

  bool read_array(GgufArray& a, const std::string& key, uint32_t depth) {
    const uint64_t at = pos_;
    if (depth > GgufFile::kMaxArrayDepth) {
      return fail(at, "arrays in " + quoted_name(key) + " nest deeper than " + std::to_string(GgufFile::kMaxArrayDepth) +
                          " levels");
    }
    uint32_t type = 0;
    uint64_t count = 0;
    if (!read(type, "the element type of array " + quoted_name(key))) return false;
    if (!known_value_type(type)) {
      return fail(at, "array " + quoted_name(key) + " has element type " + std::to_string(type) + ", expected 0..12");
    }
    if (!read(count, "the length of array " + quoted_name(key))) return false;
    if (count > remaining() / min_encoded_size(type)) {
      return fail(at + 4, "array " + quoted_name(key) + " claims " + std::to_string(count) + " elements of type " +
                              gguf_value_type_name(static_cast<GgufValueType>(type)) + " but only " +
                              std::to_string(remaining()) + " bytes follow");
    }
    switch (static_cast<GgufValueType>(type)) {
      case GgufValueType::U8: return read_elements(a.items.emplace<std::vector<uint8_t>>(), count);
      case GgufValueType::I8: return read_elements(a.items.emplace<std::vector<int8_t>>(), count);
      case GgufValueType::U16: return read_elements(a.items.emplace<std::vector<uint16_t>>(), count);
      case GgufValueType::I16: return read_elements(a.items.emplace<std::vector<int16_t>>(), count);
      case GgufValueType::U32: return read_elements(a.items.emplace<std::vector<uint32_t>>(), count);
      case GgufValueType::I32: return read_elements(a.items.emplace<std::vector<int32_t>>(), count);
      case GgufValueType::F32: return read_elements(a.items.emplace<std::vector<float>>(), count);
      case GgufValueType::U64: return read_elements(a.items.emplace<std::vector<uint64_t>>(), count);
      case GgufValueType::I64: return read_elements(a.items.emplace<std::vector<int64_t>>(), count);
      case GgufValueType::F64: return read_elements(a.items.emplace<std::vector<double>>(), count);
      case GgufValueType::Bool: {
        auto& v = a.items.emplace<std::vector<bool>>();
        v.reserve(static_cast<size_t>(count));
        for (uint64_t i = 0; i < count; ++i) {
          bool b = false;
          if (!read_bool(b, key)) return false;
          v.push_back(b);
        }
        return true;
      }
      case GgufValueType::String: {
        auto& v = a.items.emplace<std::vector<std::string>>();
        v.reserve(static_cast<size_t>(count));
        for (uint64_t i = 0; i < count; ++i) {
          std::string s;
          if (!read_string(s, "string " + std::to_string(i) + " of array " + quoted_name(key),
                           std::numeric_limits<uint64_t>::max())) {
            return false;
          }
          v.push_back(std::move(s));
        }
        return true;
      }
      case GgufValueType::Array: {
        auto& v = a.items.emplace<std::vector<GgufArray>>();
        v.reserve(static_cast<size_t>(count));
        for (uint64_t i = 0; i < count; ++i) {
          GgufArray inner;
          if (!read_array(inner, key, depth + 1)) return false;
          v.push_back(std::move(inner));
        }
        return true;
      }
    }
    return false;  // unreachable: checked by known_value_type
  }

  bool apply_alignment(GgufFile& f) {
    const GgufValue* v = f.find("general.alignment");
    if (v == nullptr) return true;
    const auto* a = std::get_if<uint32_t>(v);
    if (a == nullptr) {
      return fail(alignment_at_, "general.alignment has type " + gguf_value_type_name(gguf_value_type(*v)) + ", expected u32");
    }
    if (*a == 0 || !std::has_single_bit(*a)) {
      return fail(alignment_at_, "general.alignment is " + std::to_string(*a) + ", expected a power of two");
    }
    f.alignment_ = *a;
    return true;
  }

  bool parse_tensor_infos(GgufFile& f) {
    f.tensors_.reserve(tensor_count_);
    for (uint64_t i = 0; i < tensor_count_; ++i) {
      const uint64_t at = pos_;
      const std::string what = "tensor " + std::to_string(i);
      GgufTensorInfo t;
      if (!read_string(t.name, "the name of " + what, GgufFile::kMaxNameBytes)) return false;
      if (t.name.empty()) return fail(at, "the name of " + what + " is empty");
      if (!is_valid_utf8(t.name)) return fail(at, "the name of " + what + " " + quoted_name(t.name) + " is not valid UTF-8");
      if (f.tensor_index_.count(t.name) != 0) return fail(at, "duplicate tensor name " + quoted_name(t.name));
      const std::string tname = "tensor " + quoted_name(t.name);

      const uint64_t dims_at = pos_;
      uint32_t n_dims = 0;
      if (!read(n_dims, "the dimension count of " + tname)) return false;
      if (n_dims > GgufFile::kMaxDims) {
        return fail(dims_at, tname + " has " + std::to_string(n_dims) + " dimensions, at most " +
                                 std::to_string(GgufFile::kMaxDims) + " allowed");
      }
      t.dims.resize(n_dims);
      uint64_t n = 1;
      bool zero = false;
      for (uint32_t d = 0; d < n_dims; ++d) {
        const uint64_t dim_at = pos_;
        if (!read(t.dims[d], "dimension " + std::to_string(d) + " of " + tname)) return false;
        // ggml holds dims and element counts as int64_t.
        if (t.dims[d] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return fail(dim_at, tname + " dimension " + std::to_string(d) + " is " + std::to_string(t.dims[d]) +
                                  ", larger than 2^63-1");
        }
        if (t.dims[d] == 0) zero = true;
        if (!zero && n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / t.dims[d]) {
          return fail(dim_at, tname + " has more than 2^63-1 elements (dimension " + std::to_string(d) + " is " +
                                  std::to_string(t.dims[d]) + ")");
        }
        if (!zero) n *= t.dims[d];
      }
      t.n_elements = zero ? 0 : n;

      const uint64_t type_at = pos_;
      uint32_t type_id = 0;
      if (!read(type_id, "the type of " + tname)) return false;
      const auto traits = ggml_type_traits(type_id);
      if (!traits) return fail(type_at, tname + " has ggml type " + std::to_string(type_id) + ", which ggml does not define");
      t.type = traits->type;
      const uint64_t row = n_dims == 0 ? 1 : t.dims[0];
      if (row % traits->block_elems != 0) {
        return fail(type_at, tname + " of type " + std::string(traits->name) + " has rows of " + std::to_string(row) +
                                 " elements, not a multiple of its block size " + std::to_string(traits->block_elems));
      }
      const auto bytes = ggml_bytes(t.type, t.n_elements);
      if (!bytes) return fail(type_at, tname + " is too large: its size in bytes overflows 64 bits");
      t.n_bytes = *bytes;

      if (!read(t.offset, "the data offset of " + tname)) return false;
      f.tensor_index_.emplace(t.name, f.tensors_.size());
      f.tensors_.push_back(std::move(t));
      offset_at_.push_back(pos_ - 8);
    }
    return true;
  }

  bool place_tensors(GgufFile& f) {
    const uint64_t align = f.alignment_;
    const uint64_t end_of_infos = pos_;
    f.data_offset_ = (end_of_infos + align - 1) / align * align;
    const uint64_t size = bytes_.size();
    const uint64_t data_bytes = f.data_offset_ <= size ? size - f.data_offset_ : 0;
    for (size_t i = 0; i < f.tensors_.size(); ++i) {
      GgufTensorInfo& t = f.tensors_[i];
      const std::string tname = "tensor " + quoted_name(t.name);
      if (t.offset % align != 0) {
        return fail(offset_at_[i], tname + " has data offset " + std::to_string(t.offset) +
                                       ", not a multiple of the alignment " + std::to_string(align));
      }
      if (t.offset > data_bytes || t.n_bytes > data_bytes - t.offset) {
        return fail(offset_at_[i], tname + " has data at [" + std::to_string(t.offset) + ", +" +
                                       std::to_string(t.n_bytes) + ") in the data section at byte " +
                                       std::to_string(f.data_offset_) + ", past the end of the file (" +
                                       std::to_string(size) + " bytes)");
      }
      t.file_offset = f.data_offset_ + t.offset;
      // An empty tensor may sit at the data section's start even when the file ends before it.
      if (t.n_bytes > 0) t.data = bytes_.subspan(static_cast<size_t>(t.file_offset), static_cast<size_t>(t.n_bytes));
    }
    // No two tensors may share bytes (ggml packs them in order; gguf-py allows any order).
    std::vector<size_t> order(f.tensors_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return f.tensors_[a].offset < f.tensors_[b].offset;
    });
    for (size_t k = 1; k < order.size(); ++k) {
      const GgufTensorInfo& prev = f.tensors_[order[k - 1]];
      const GgufTensorInfo& cur = f.tensors_[order[k]];
      if (prev.n_bytes > 0 && cur.n_bytes > 0 && prev.offset + prev.n_bytes > cur.offset) {
        return fail(offset_at_[order[k]], "tensor " + quoted_name(cur.name) + " at data offset " +
                                              std::to_string(cur.offset) + " overlaps tensor " + quoted_name(prev.name) +
                                              " at [" + std::to_string(prev.offset) + ", +" +
                                              std::to_string(prev.n_bytes) + ")");
      }
    }
    return true;
  }

  std::span<const uint8_t> bytes_;
  uint64_t pos_ = 0;
  uint64_t tensor_count_ = 0;
  uint64_t kv_count_ = 0;
  uint64_t alignment_at_ = 0;        // where general.alignment is, for error messages
  std::vector<uint64_t> offset_at_;  // where each tensor's offset field is, for error messages
  Error error_;
};

Expected<GgufFile> GgufFile::parse(std::span<const uint8_t> bytes) {
  GgufFile f;
  GgufParser parser(bytes);
  if (!parser.parse(f)) return parser.take_error();
  return f;
}

Expected<GgufFile> GgufFile::open(const std::filesystem::path& path) {
  auto mapping = MappedFile::open(path);
  if (!mapping) return mapping.error();
  auto parsed = parse(mapping->bytes());
  if (!parsed) return parsed.error().prefixed(path.string() + ": ");
  parsed->mapping_ = std::move(*mapping);  // the spans stay valid: the pages do not move
  return parsed;
}

// ---- lookups --------------------------------------------------------------------------------------

const GgufValue* GgufFile::find(std::string_view key) const {
  const auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

Error missing(std::string_view key) { return Error("metadata key " + quoted_name(key) + " is missing"); }

Error wrong_type(std::string_view key, const GgufValue& v, std::string_view expected) {
  return Error("metadata " + quoted_name(key) + " has type " + gguf_value_type_name(gguf_value_type(v)) +
               ", expected " + std::string(expected));
}

// The value of an integer alternative as a 128-bit-free pair: negative flag and magnitude fits in
// int64 or uint64; nullopt for a non-integer (bool is not an integer here).
struct IntValue {
  bool negative;
  uint64_t magnitude;  // for negatives: the value as int64 (two's complement), see fits()
  int64_t as_signed;
};

template <class V>
std::optional<IntValue> integer_of(const V& v) {
  return std::visit(
      [](const auto& x) -> std::optional<IntValue> {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          if constexpr (std::is_signed_v<T>) {
            return IntValue{x < 0, static_cast<uint64_t>(x), static_cast<int64_t>(x)};
          } else {
            return IntValue{false, static_cast<uint64_t>(x), 0};
          }
        } else {
          return std::nullopt;
        }
      },
      v);
}

template <class T>
std::optional<T> fit(const IntValue& v) {
  if (v.negative) {
    if constexpr (std::is_signed_v<T>) {
      if (v.as_signed >= std::numeric_limits<T>::min()) return static_cast<T>(v.as_signed);
    }
    return std::nullopt;
  }
  if (v.magnitude <= static_cast<uint64_t>(std::numeric_limits<T>::max())) return static_cast<T>(v.magnitude);
  return std::nullopt;
}

std::string int_text(const IntValue& v) {
  return v.negative ? std::to_string(v.as_signed) : std::to_string(v.magnitude);
}

template <class T>
constexpr const char* int_name() {
  if constexpr (std::is_same_v<T, uint8_t>) return "u8";
  if constexpr (std::is_same_v<T, uint16_t>) return "u16";
  if constexpr (std::is_same_v<T, uint32_t>) return "u32";
  if constexpr (std::is_same_v<T, uint64_t>) return "u64";
  if constexpr (std::is_same_v<T, int8_t>) return "i8";
  if constexpr (std::is_same_v<T, int16_t>) return "i16";
  if constexpr (std::is_same_v<T, int32_t>) return "i32";
  if constexpr (std::is_same_v<T, int64_t>) return "i64";
  return "a number";  // floating-point targets never reach an integer message
}

template <class T>
Expected<T> get_int(const GgufFile& f, std::string_view key) {
  const GgufValue* v = f.find(key);
  if (v == nullptr) return missing(key);
  const auto i = integer_of(*v);
  if (!i) return wrong_type(key, *v, std::string("an integer that fits ") + int_name<T>());
  const auto r = fit<T>(*i);
  if (!r) {
    return Error("metadata " + quoted_name(key) + " is " + int_text(*i) + " (" +
                 gguf_value_type_name(gguf_value_type(*v)) + "), which does not fit " + int_name<T>());
  }
  return *r;
}

// Converts every element of an integer (or, for float targets, float) array.
template <class T>
Expected<std::vector<T>> get_converted_array(const GgufFile& f, std::string_view key) {
  const GgufValue* v = f.find(key);
  if (v == nullptr) return missing(key);
  const auto* a = std::get_if<GgufArray>(v);
  if (a == nullptr) return wrong_type(key, *v, "an array");
  std::vector<T> out;
  out.reserve(a->size());
  Status error;
  std::visit(
      [&](const auto& items) {
        using E = typename std::decay_t<decltype(items)>::value_type;
        for (size_t i = 0; i < items.size() && !error; ++i) {
          if constexpr (std::is_floating_point_v<T> && std::is_floating_point_v<E>) {
            out.push_back(static_cast<T>(items[i]));
          } else if constexpr (std::is_integral_v<T> && std::is_integral_v<E> && !std::is_same_v<E, bool>) {
            const auto r = fit<T>(*integer_of(std::variant<E>(items[i])));
            if (!r) {
              error = Error("metadata " + quoted_name(key) + " element " + std::to_string(i) + " is " +
                            std::to_string(items[i]) + ", which does not fit " + int_name<T>());
            } else {
              out.push_back(*r);
            }
          } else {
            error = Error("metadata " + quoted_name(key) + " is an array of " +
                          gguf_value_type_name(a->element_type()) + ", expected an array of " +
                          (std::is_floating_point_v<T> ? "f32 or f64" : "integers"));
          }
        }
      },
      a->items);
  if (error) return *error;
  return out;
}

}  // namespace

Expected<uint8_t> GgufFile::get_u8(std::string_view key) const { return get_int<uint8_t>(*this, key); }
Expected<uint16_t> GgufFile::get_u16(std::string_view key) const { return get_int<uint16_t>(*this, key); }
Expected<uint32_t> GgufFile::get_u32(std::string_view key) const { return get_int<uint32_t>(*this, key); }
Expected<uint64_t> GgufFile::get_u64(std::string_view key) const { return get_int<uint64_t>(*this, key); }
Expected<int8_t> GgufFile::get_i8(std::string_view key) const { return get_int<int8_t>(*this, key); }
Expected<int16_t> GgufFile::get_i16(std::string_view key) const { return get_int<int16_t>(*this, key); }
Expected<int32_t> GgufFile::get_i32(std::string_view key) const { return get_int<int32_t>(*this, key); }
Expected<int64_t> GgufFile::get_i64(std::string_view key) const { return get_int<int64_t>(*this, key); }

Expected<float> GgufFile::get_f32(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return missing(key);
  if (const auto* x = std::get_if<float>(v)) return *x;
  if (const auto* x = std::get_if<double>(v)) return static_cast<float>(*x);
  return wrong_type(key, *v, "f32 or f64");
}

Expected<double> GgufFile::get_f64(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return missing(key);
  if (const auto* x = std::get_if<double>(v)) return *x;
  if (const auto* x = std::get_if<float>(v)) return static_cast<double>(*x);
  return wrong_type(key, *v, "f32 or f64");
}

Expected<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return missing(key);
  if (const auto* x = std::get_if<bool>(v)) return *x;
  return wrong_type(key, *v, "bool");
}

Expected<std::string_view> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return missing(key);
  if (const auto* x = std::get_if<std::string>(v)) return std::string_view(*x);
  return wrong_type(key, *v, "string");
}

Expected<const GgufArray*> GgufFile::get_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return missing(key);
  if (const auto* x = std::get_if<GgufArray>(v)) return x;
  return wrong_type(key, *v, "array");
}

Expected<std::vector<uint32_t>> GgufFile::get_u32_array(std::string_view key) const {
  return get_converted_array<uint32_t>(*this, key);
}
Expected<std::vector<int64_t>> GgufFile::get_i64_array(std::string_view key) const {
  return get_converted_array<int64_t>(*this, key);
}
Expected<std::vector<float>> GgufFile::get_f32_array(std::string_view key) const {
  return get_converted_array<float>(*this, key);
}

Expected<const std::vector<std::string>*> GgufFile::get_string_array(std::string_view key) const {
  auto a = get_array(key);
  if (!a) return a.error();
  if (const auto* s = (*a)->as<std::string>()) return s;
  return Error("metadata " + quoted_name(key) + " is an array of " + gguf_value_type_name((*a)->element_type()) +
               ", expected an array of string");
}

}  // namespace ferry::model
