#pragma once
// Hugging Face safetensors checkpoints, read over read-only memory maps: one file, or a sharded
// checkpoint (model.safetensors.index.json and its shards) presented as one set of tensors.
//
// A file is: u64 little-endian header length N, N bytes of JSON, then the data. The JSON maps each
// tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets from the start of the
// data) and may hold "__metadata__": {string: string}. Every field is validated; a bad file gives a
// an Error naming the file, the tensor, the value and what was expected.
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "config/expected.hpp"
#include "model/formats/mapped_file.hpp"

namespace ferry::model {

enum class SafetensorsDtype : uint8_t {
  BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64,
};
// The name as files spell it: "F32", "BF16", "F8_E4M3", ...
std::string_view safetensors_dtype_name(SafetensorsDtype dtype);
std::optional<SafetensorsDtype> safetensors_dtype_from_name(std::string_view name);
uint32_t safetensors_dtype_size(SafetensorsDtype dtype);  // bytes per element

struct SafetensorsTensor {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::F32;
  std::vector<uint64_t> shape;  // as stored: row-major, outermost first (numpy/PyTorch order)
  uint64_t n_elements = 0;      // product of shape (1 for a scalar)
  uint64_t n_bytes = 0;
  uint32_t shard = 0;           // index into Safetensors::shards()
  uint64_t file_offset = 0;     // from the start of its shard file
  // The bytes in the mapping; valid as long as the Safetensors object (moves included).
  std::span<const uint8_t> data;
};

class Safetensors {
 public:
  // safetensors' own limit on the JSON header (MAX_HEADER_SIZE in the Rust crate).
  static constexpr uint64_t kMaxHeaderBytes = 100'000'000;

  // `path` is a .safetensors file, a model.safetensors.index.json, or a checkpoint directory (its
  // model.safetensors.index.json if present, else its model.safetensors).
  static Expected<Safetensors> open(const std::filesystem::path& path);
  // One file's bytes, kept alive by the caller (tests, fuzzing). `name` appears in errors.
  static Expected<Safetensors> parse(std::span<const uint8_t> bytes, std::string_view name = "<memory>");

  Safetensors(Safetensors&&) noexcept = default;
  Safetensors& operator=(Safetensors&&) noexcept = default;
  Safetensors(const Safetensors&) = delete;
  Safetensors& operator=(const Safetensors&) = delete;

  // Every tensor of every shard: shards in the order of shards(), each shard's tensors in the order
  // of their data (how a converter reads the files front to back).
  std::span<const SafetensorsTensor> tensors() const { return tensors_; }
  const SafetensorsTensor* find(std::string_view name) const;
  // "__metadata__" of every shard, merged (the first shard that sets a key wins).
  const std::map<std::string, std::string, std::less<>>& metadata() const { return metadata_; }
  // The shard files, sorted by name (one entry for a single file; empty after parse()).
  std::span<const std::filesystem::path> shards() const { return shard_paths_; }

 private:
  Safetensors() = default;
  friend class SafetensorsParser;

  std::vector<MappedFile> mappings_;
  std::vector<std::filesystem::path> shard_paths_;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string, std::less<>> metadata_;
};

}  // namespace ferry::model
