#pragma once
// A read-only memory map of a whole file: how ferry reads model files (GGUF, safetensors) that are
// far larger than it ever touches at once. Pages come in when read and can be dropped by the kernel.
#include <cstdint>
#include <filesystem>
#include <span>

#include "config/expected.hpp"

namespace ferry::model {

class MappedFile {
 public:
  // The error (ErrorCode::io) names the path and the failing call with its errno text.
  static Expected<MappedFile> open(const std::filesystem::path& path);

  MappedFile() = default;  // maps nothing
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  // Stays valid when the MappedFile is moved; ends when it is destroyed. Empty for an empty file.
  std::span<const uint8_t> bytes() const { return {data_, size_}; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ferry::model
