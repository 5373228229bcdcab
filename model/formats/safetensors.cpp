#include "model/formats/safetensors.hpp"

#include <simdjson.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "model/formats/quoted.hpp"

namespace ferry::model {

namespace {

std::string quoted_name(std::string_view s) { return quoted(s, 120); }

struct DtypeInfo {
  SafetensorsDtype dtype;
  std::string_view name;
  uint32_t size;
};

constexpr std::array kDtypes = {
    DtypeInfo{SafetensorsDtype::BOOL, "BOOL", 1},       DtypeInfo{SafetensorsDtype::U8, "U8", 1},
    DtypeInfo{SafetensorsDtype::I8, "I8", 1},           DtypeInfo{SafetensorsDtype::F8_E5M2, "F8_E5M2", 1},
    DtypeInfo{SafetensorsDtype::F8_E4M3, "F8_E4M3", 1}, DtypeInfo{SafetensorsDtype::I16, "I16", 2},
    DtypeInfo{SafetensorsDtype::U16, "U16", 2},         DtypeInfo{SafetensorsDtype::F16, "F16", 2},
    DtypeInfo{SafetensorsDtype::BF16, "BF16", 2},       DtypeInfo{SafetensorsDtype::I32, "I32", 4},
    DtypeInfo{SafetensorsDtype::U32, "U32", 4},         DtypeInfo{SafetensorsDtype::F32, "F32", 4},
    DtypeInfo{SafetensorsDtype::F64, "F64", 8},         DtypeInfo{SafetensorsDtype::I64, "I64", 8},
    DtypeInfo{SafetensorsDtype::U64, "U64", 8},
};

const DtypeInfo& info(SafetensorsDtype d) { return kDtypes[static_cast<size_t>(d)]; }

std::string json_error(simdjson::error_code e) { return simdjson::error_message(e); }

// On demand stops reading after the top-level object; anything but whitespace after it is an error.
bool has_trailing_content(simdjson::ondemand::document& doc) {
  const char* at = nullptr;
  return doc.current_location().get(at) == simdjson::SUCCESS;
}

}  // namespace

std::string_view safetensors_dtype_name(SafetensorsDtype dtype) { return info(dtype).name; }
uint32_t safetensors_dtype_size(SafetensorsDtype dtype) { return info(dtype).size; }

std::optional<SafetensorsDtype> safetensors_dtype_from_name(std::string_view name) {
  for (const DtypeInfo& d : kDtypes) {
    if (d.name == name) return d.dtype;
  }
  return std::nullopt;
}

// Parses one file's header into tensors of `out`, failing with a message that starts with `name`.
class SafetensorsParser {
 public:
  SafetensorsParser(std::span<const uint8_t> bytes, std::string_view name, uint32_t shard)
      : bytes_(bytes), name_(name), shard_(shard) {}

  Status parse(Safetensors& out) {
    if (bytes_.size() < 8) return fail("file is " + std::to_string(bytes_.size()) + " bytes, too short for a header");
    uint64_t header_len = 0;
    std::memcpy(&header_len, bytes_.data(), 8);
    if (header_len > Safetensors::kMaxHeaderBytes) {
      return fail("header length " + std::to_string(header_len) + " is larger than the " +
                  std::to_string(Safetensors::kMaxHeaderBytes) + " bytes safetensors allows");
    }
    if (header_len > bytes_.size() - 8) {
      return fail("header length " + std::to_string(header_len) + " runs past the end of the file (" +
                  std::to_string(bytes_.size()) + " bytes)");
    }
    const auto* header = reinterpret_cast<const char*>(bytes_.data() + 8);
    if (header_len == 0 || header[0] != '{') return fail("header does not start with '{'");
    data_start_ = 8 + header_len;
    data_size_ = bytes_.size() - data_start_;

    // simdjson reads up to SIMDJSON_PADDING bytes past the end: parse a padded copy.
    const simdjson::padded_string json(header, static_cast<size_t>(header_len));
    simdjson::ondemand::parser parser;
    simdjson::ondemand::document doc;
    if (auto e = parser.iterate(json).get(doc)) return fail("header JSON: " + json_error(e));
    simdjson::ondemand::object root;
    if (auto e = doc.get_object().get(root)) return fail("header JSON: " + json_error(e));
    const size_t first = out.tensors_.size();
    std::set<std::string, std::less<>> seen;
    for (auto field_result : root) {
      simdjson::ondemand::field field;
      if (auto e = std::move(field_result).get(field)) return fail("header JSON: " + json_error(e));
      std::string_view key_view;
      if (auto e = field.unescaped_key().get(key_view)) return fail("header JSON: " + json_error(e));
      std::string key(key_view);
      if (!seen.insert(key).second) return fail("the header names " + quoted_name(key) + " twice");
      if (key == "__metadata__") {
        if (auto e = parse_metadata(field.value(), out)) return e;
        continue;
      }
      SafetensorsTensor t;
      t.name = std::move(key);
      t.shard = shard_;
      if (auto e = parse_tensor(field.value(), t)) return e;
      out.tensors_.push_back(std::move(t));
    }
    if (has_trailing_content(doc)) return fail("header JSON: unexpected content after the top-level object");
    return check_placement(out, first);
  }

 private:
  Error fail(const std::string& message) const { return Error(std::string(name_) + ": " + message); }

  Status parse_metadata(simdjson::ondemand::value value, Safetensors& out) {
    simdjson::ondemand::object obj;
    if (auto e = value.get_object().get(obj)) return fail("__metadata__ is not an object of strings: " + json_error(e));
    for (auto field_result : obj) {
      simdjson::ondemand::field field;
      std::string_view key;
      std::string_view text;
      if (auto e = std::move(field_result).get(field)) return fail("__metadata__: " + json_error(e));
      if (auto e = field.unescaped_key().get(key)) return fail("__metadata__: " + json_error(e));
      std::string k(key);  // the key's buffer is reused by the next string read
      if (auto e = field.value().get_string().get(text)) {
        return fail("__metadata__ " + quoted_name(k) + " is not a string: " + json_error(e));
      }
      out.metadata_.emplace(std::move(k), std::string(text));
    }
    return std::nullopt;
  }

  Status parse_tensor(simdjson::ondemand::value value, SafetensorsTensor& t) {
    const std::string tname = "tensor " + quoted_name(t.name);
    simdjson::ondemand::object obj;
    if (auto e = value.get_object().get(obj)) return fail(tname + " is not an object: " + json_error(e));
    bool have_dtype = false, have_shape = false, have_offsets = false;
    uint64_t begin = 0, end = 0;
    for (auto field_result : obj) {
      simdjson::ondemand::field field;
      std::string_view key;
      if (auto e = std::move(field_result).get(field)) return fail(tname + ": " + json_error(e));
      if (auto e = field.unescaped_key().get(key)) return fail(tname + ": " + json_error(e));
      if (key == "dtype") {
        std::string_view d;
        if (auto e = field.value().get_string().get(d)) return fail(tname + " dtype is not a string: " + json_error(e));
        const auto dtype = safetensors_dtype_from_name(d);
        if (!dtype) {
          return fail(tname + " has dtype " + quoted_name(d) +
                      ", expected one of BOOL U8 I8 F8_E5M2 F8_E4M3 I16 U16 F16 BF16 I32 U32 F32 F64 I64 U64");
        }
        t.dtype = *dtype;
        have_dtype = true;
      } else if (key == "shape") {
        if (auto e = read_uints(field.value(), t.shape, tname + " shape")) return e;
        have_shape = true;
      } else if (key == "data_offsets") {
        std::vector<uint64_t> offsets;
        if (auto e = read_uints(field.value(), offsets, tname + " data_offsets")) return e;
        if (offsets.size() != 2) {
          return fail(tname + " data_offsets has " + std::to_string(offsets.size()) + " numbers, expected 2");
        }
        begin = offsets[0], end = offsets[1];
        have_offsets = true;
      }
      // Other keys are ignored, as the safetensors crate does.
    }
    if (!have_dtype || !have_shape || !have_offsets) {
      return fail(tname + " lacks " + (!have_dtype ? "dtype" : !have_shape ? "shape" : "data_offsets"));
    }
    uint64_t n = 1;
    for (uint64_t d : t.shape) {
      if (d != 0 && n > std::numeric_limits<uint64_t>::max() / d) return fail(tname + " has a shape whose size overflows");
      n *= d;
    }
    const uint64_t size = safetensors_dtype_size(t.dtype);
    if (n > std::numeric_limits<uint64_t>::max() / size) return fail(tname + " has a shape whose size overflows");
    t.n_elements = n;
    t.n_bytes = n * size;
    if (begin > end) {
      return fail(tname + " data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] run backwards");
    }
    if (end > data_size_) {
      return fail(tname + " data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                  "] run past the end of the data (" + std::to_string(data_size_) + " bytes)");
    }
    if (end - begin != t.n_bytes) {
      return fail(tname + " holds " + std::to_string(end - begin) + " bytes but its dtype " +
                  std::string(safetensors_dtype_name(t.dtype)) + " and shape need " + std::to_string(t.n_bytes));
    }
    t.file_offset = data_start_ + begin;
    t.data = bytes_.subspan(static_cast<size_t>(t.file_offset), static_cast<size_t>(t.n_bytes));
    return std::nullopt;
  }

  Status read_uints(simdjson::ondemand::value value, std::vector<uint64_t>& out, const std::string& what) {
    simdjson::ondemand::array arr;
    if (auto e = value.get_array().get(arr)) return fail(what + " is not an array: " + json_error(e));
    for (auto item : arr) {
      uint64_t x = 0;
      if (auto e = item.get_uint64().get(x)) return fail(what + " holds a value that is not a non-negative integer: " + json_error(e));
      out.push_back(x);
    }
    return std::nullopt;
  }

  // Tensors sorted by data, then no two may share a byte. (The crate also wants no gaps; a gap
  // hurts no reader, so ferry accepts it.)
  Status check_placement(Safetensors& out, size_t first) {
    auto begin = out.tensors_.begin() + static_cast<std::ptrdiff_t>(first);
    std::stable_sort(begin, out.tensors_.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
      return a.file_offset < b.file_offset;
    });
    for (auto it = begin; it != out.tensors_.end(); ++it) {
      if (it == begin) continue;
      const SafetensorsTensor& prev = *(it - 1);
      if (prev.n_bytes > 0 && it->n_bytes > 0 && prev.file_offset + prev.n_bytes > it->file_offset) {
        return fail("tensor " + quoted_name(it->name) + " at data offset " + std::to_string(it->file_offset - data_start_) +
                    " overlaps tensor " + quoted_name(prev.name) + " at [" + std::to_string(prev.file_offset - data_start_) +
                    ", " + std::to_string(prev.file_offset - data_start_ + prev.n_bytes) + ")");
      }
    }
    return std::nullopt;
  }

  std::span<const uint8_t> bytes_;
  std::string_view name_;
  uint32_t shard_;
  uint64_t data_start_ = 0;
  uint64_t data_size_ = 0;
};

namespace {

// The shard file names of an index's weight_map: name -> shard file.
Expected<std::map<std::string, std::string, std::less<>>> read_index(const std::filesystem::path& path) {
  auto fail = [&](const std::string& m) { return Error(path.string() + ": " + m); };
  auto mapped = MappedFile::open(path);
  if (!mapped) return mapped.error();
  const auto bytes = mapped->bytes();
  const simdjson::padded_string json(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  simdjson::ondemand::parser parser;
  simdjson::ondemand::document doc;
  if (auto e = parser.iterate(json).get(doc)) return fail(json_error(e));
  simdjson::ondemand::object root;
  if (auto e = doc.get_object().get(root)) return fail(json_error(e));
  std::map<std::string, std::string, std::less<>> map;
  bool have_map = false;
  for (auto field_result : root) {
    simdjson::ondemand::field field;
    std::string_view key;
    if (auto e = std::move(field_result).get(field)) return fail(json_error(e));
    if (auto e = field.unescaped_key().get(key)) return fail(json_error(e));
    if (key != "weight_map") continue;
    have_map = true;
    simdjson::ondemand::object wm;
    if (auto e = field.value().get_object().get(wm)) return fail("weight_map is not an object: " + json_error(e));
    for (auto entry_result : wm) {
      simdjson::ondemand::field entry;
      std::string_view name;
      std::string_view shard;
      if (auto e = std::move(entry_result).get(entry)) return fail("weight_map: " + json_error(e));
      if (auto e = entry.unescaped_key().get(name)) return fail("weight_map: " + json_error(e));
      std::string tensor(name);
      if (auto e = entry.value().get_string().get(shard)) {
        return fail("weight_map " + quoted_name(tensor) + " is not a file name: " + json_error(e));
      }
      // Shards live beside the index: refuse anything that could point elsewhere.
      if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string_view::npos ||
          shard.find('\\') != std::string_view::npos || shard.find('\0') != std::string_view::npos) {
        return fail("weight_map " + quoted_name(tensor) + " names shard " + quoted_name(shard) + ", not a plain file name");
      }
      if (!map.emplace(std::move(tensor), std::string(shard)).second) {
        return fail("weight_map names " + quoted_name(name) + " twice");
      }
    }
  }
  if (has_trailing_content(doc)) return fail("unexpected content after the top-level object");
  if (!have_map) return fail("no weight_map");
  return map;
}

}  // namespace

Expected<Safetensors> Safetensors::parse(std::span<const uint8_t> bytes, std::string_view name) {
  Safetensors s;
  SafetensorsParser parser(bytes, name, 0);
  if (auto e = parser.parse(s)) return *e;
  for (size_t i = 0; i < s.tensors_.size(); ++i) s.index_.emplace(s.tensors_[i].name, i);
  return s;
}

Expected<Safetensors> Safetensors::open(const std::filesystem::path& path) {
  std::filesystem::path index_path;
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    if (std::filesystem::exists(path / "model.safetensors.index.json", ec)) {
      index_path = path / "model.safetensors.index.json";
    } else if (std::filesystem::exists(path / "model.safetensors", ec)) {
      files.push_back(path / "model.safetensors");
    } else {
      return Error(ErrorCode::io,
                   path.string() + ": neither model.safetensors.index.json nor model.safetensors is there");
    }
  } else if (path.string().ends_with(".index.json")) {
    index_path = path;
  } else {
    files.push_back(path);
  }

  std::map<std::string, std::string, std::less<>> weight_map;
  if (!index_path.empty()) {
    auto index = read_index(index_path);
    if (!index) return index.error();
    weight_map = std::move(*index);
    std::set<std::string> names;
    for (const auto& [tensor, shard] : weight_map) names.insert(shard);
    for (const std::string& n : names) files.push_back(index_path.parent_path() / n);
  }

  Safetensors s;
  for (const auto& file : files) {
    auto mapped = MappedFile::open(file);
    if (!mapped) return mapped.error();
    const auto shard = static_cast<uint32_t>(s.mappings_.size());
    const std::string name = file.string();
    SafetensorsParser parser(mapped->bytes(), name, shard);
    if (auto e = parser.parse(s)) return *e;
    s.mappings_.push_back(std::move(*mapped));  // spans stay valid: pages do not move
    s.shard_paths_.push_back(file);
  }
  for (size_t i = 0; i < s.tensors_.size(); ++i) {
    const SafetensorsTensor& t = s.tensors_[i];
    if (!s.index_.emplace(t.name, i).second) {
      const SafetensorsTensor& other = s.tensors_[s.index_.find(t.name)->second];
      return Error("tensor " + quoted_name(t.name) + " is in both " + s.shard_paths_[other.shard].string() +
                   " and " + s.shard_paths_[t.shard].string());
    }
  }
  // The index must be right about every tensor it names; tensors it does not name are still read
  // (the shards, not the index, are the checkpoint).
  for (const auto& [tensor, shard] : weight_map) {
    const SafetensorsTensor* t = s.find(tensor);
    if (t == nullptr || s.shard_paths_[t->shard].filename() != shard) {
      return Error(index_path.string() + ": weight_map puts " + quoted_name(tensor) + " in " + shard +
                   (t == nullptr ? ", but no shard holds it"
                                 : ", but it is in " + s.shard_paths_[t->shard].filename().string()));
    }
  }
  return s;
}

const SafetensorsTensor* Safetensors::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace ferry::model
