#pragma once
// Writes GGUF v3 files without ever holding the tensor data: tensors are declared up front (name,
// dims, type) with a producer that is called at write time, in declaration order, to stream that
// tensor's bytes into the file. `ferry convert` writes hundreds of GB this way in constant memory.
//
//   GgufWriter w;
//   w.set("general.architecture", std::string("glm5next"));
//   w.set("glm5next.block_count", uint32_t{46});
//   w.add_tensor("token_embd.weight", {6144, 154880}, GgmlType::Q8_0,
//                [&](GgufSink& out) { for (each row) out.write(row_bytes); });
//   if (auto r = w.write_file("out.gguf"); !r) fail(r.error().message);
//
// The layout is what ggml expects: metadata in the order set, tensor infos in the order added, the
// data section aligned, each tensor packed after the previous one and zero-padded to the alignment
// (the last one too). The alignment is general.alignment when set (a u32 power of two), else 32.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "model/formats/gguf.hpp"

namespace ferry::model {

// Where a producer writes its tensor's bytes.
class GgufSink {
 public:
  virtual ~GgufSink() = default;
  // Appends to the tensor; the producer must write exactly the tensor's n_bytes in total.
  virtual void write(const void* data, size_t n) = 0;
  void write(std::span<const uint8_t> bytes) { write(bytes.data(), bytes.size()); }
  // The producer could not make its bytes (say, a source value is out of range): the write stops
  // and write_file returns this message (ErrorCode::invalid_input), naming the tensor.
  virtual void fail(std::string message) = 0;
  // True once the write has failed (a producer may stop early).
  virtual bool failed() const = 0;
};

using GgufTensorProducer = std::function<void(GgufSink&)>;

class GgufWriter {
 public:
  // ggml keeps names in char[64] with a terminating NUL, so llama.cpp loads names of at most 63
  // bytes; the writer refuses longer ones (the reader accepts the spec's 64).
  static constexpr uint64_t kMaxNameBytes = 63;

  // Sets a metadata value: a new key goes last, an existing one is replaced in place. Refuses an
  // empty, over-long or non-UTF-8 key, arrays nested deeper than the reader accepts, and a
  // general.alignment that is not a u32 power of two.
  Status set(std::string key, GgufValue value);
  const GgufValue* find(std::string_view key) const;

  // Declares a tensor. Refuses an empty, duplicate, non-UTF-8 or over-long name, more than 4 dims,
  // a row (dims[0]) that is not a whole number of blocks, and sizes that overflow.
  Status add_tensor(std::string name, std::vector<uint64_t> dims, GgmlType type, GgufTensorProducer produce);

  size_t tensor_count() const { return tensors_.size(); }
  uint32_t alignment() const;
  // Size the file will have: what write_file returns on success.
  uint64_t file_size() const;

  // Writes `path` through `path` + ".partial", renamed into place only when every byte is written;
  // on failure the partial file is removed. Calls each producer once. Returns the bytes written.
  Expected<uint64_t> write_file(const std::filesystem::path& path);

 private:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    GgmlType type;
    uint64_t n_bytes;
    GgufTensorProducer produce;
  };
  std::vector<uint8_t> header_bytes() const;  // everything before the data section, padded

  std::vector<GgufKv> kvs_;
  std::vector<Tensor> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace ferry::model
