#include "model/formats/gguf_writer.hpp"

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <system_error>
#include <type_traits>

namespace ferry::model {

namespace {

class Bytes {
 public:
  template <class T>
  void put(T v) {
    uint8_t raw[sizeof(T)];
    std::memcpy(raw, &v, sizeof(T));
    out.insert(out.end(), raw, raw + sizeof(T));
  }
  void str(std::string_view s) {
    put<uint64_t>(s.size());
    out.insert(out.end(), s.begin(), s.end());
  }
  void array(const GgufArray& a) {
    put(static_cast<uint32_t>(a.element_type()));
    put<uint64_t>(a.size());
    std::visit(
        [&](const auto& items) {
          for (const auto& item : items) element(item);
        },
        a.items);
  }
  void value(const GgufValue& v) {
    std::visit([&](const auto& x) { element(x); }, v);
  }
  std::vector<uint8_t> out;

 private:
  template <class T>
  void element(const T& x) {
    if constexpr (std::is_same_v<T, std::string>) {
      str(x);
    } else if constexpr (std::is_same_v<T, GgufArray>) {
      array(x);
    } else if constexpr (std::is_same_v<T, bool>) {
      put<uint8_t>(x ? 1 : 0);
    } else {
      put(x);
    }
  }
};

Status name_error(std::string_view what, std::string_view name, uint64_t max) {
  if (name.empty()) return Error(std::string(what) + " is empty");
  if (name.size() > max) {
    return Error(std::string(what) + " '" + std::string(name.substr(0, 80)) + "...' is " + std::to_string(name.size()) +
                 " bytes long; at most " + std::to_string(max) + " allowed");
  }
  if (!is_valid_utf8(name)) return Error(std::string(what) + " is not valid UTF-8");
  return std::nullopt;
}

uint32_t array_depth(const GgufArray& a) {
  uint32_t deepest = 0;
  if (const auto* inner = a.as<GgufArray>()) {
    for (const GgufArray& x : *inner) deepest = std::max(deepest, array_depth(x));
  }
  return deepest + 1;
}

uint64_t align_up(uint64_t n, uint64_t alignment) { return (n + alignment - 1) / alignment * alignment; }

// Streams one tensor's bytes into the file and counts them against what the tensor must hold.
class FileSink final : public GgufSink {
 public:
  FileSink(std::FILE* file, const std::string& tensor, uint64_t expected)
      : file_(file), tensor_(tensor), expected_(expected) {}

  void write(const void* data, size_t n) override {
    if (error_) return;
    if (n > expected_ - written_) {
      fail(ErrorCode::internal, "the producer wrote more than the tensor's " + std::to_string(expected_) + " bytes");
      return;
    }
    if (n > 0 && std::fwrite(data, 1, n, file_) != n) {
      fail(ErrorCode::io, std::string("write failed: ") + std::strerror(errno));
      return;
    }
    written_ += n;
  }
  void fail(std::string message) override { fail(ErrorCode::invalid_input, std::move(message)); }
  bool failed() const override { return error_.has_value(); }

  // The error after the producer returned, if any.
  Status finish() {
    if (!error_ && written_ != expected_) {
      fail(ErrorCode::internal,
           "the producer wrote " + std::to_string(written_) + " bytes, expected " + std::to_string(expected_));
    }
    return error_;
  }

 private:
  void fail(ErrorCode code, std::string message) {
    if (!error_) error_ = Error(code, "tensor '" + tensor_ + "': " + std::move(message));
  }

  std::FILE* file_;
  const std::string& tensor_;
  uint64_t expected_;
  uint64_t written_ = 0;
  Status error_;
};

}  // namespace

Status GgufWriter::set(std::string key, GgufValue value) {
  if (auto e = name_error("metadata key", key, GgufFile::kMaxKeyBytes)) return e;
  if (const auto* a = std::get_if<GgufArray>(&value); a != nullptr && array_depth(*a) > GgufFile::kMaxArrayDepth) {
    return Error("metadata '" + key + "' nests arrays " + std::to_string(array_depth(*a)) +
                 " deep; at most " + std::to_string(GgufFile::kMaxArrayDepth) + " allowed");
  }
  if (key == "general.alignment") {
    const auto* a = std::get_if<uint32_t>(&value);
    if (a == nullptr) {
      return Error("general.alignment must be a u32, not " + gguf_value_type_name(gguf_value_type(value)));
    }
    if (*a == 0 || !std::has_single_bit(*a)) {
      return Error("general.alignment must be a power of two, not " + std::to_string(*a));
    }
  }
  for (GgufKv& kv : kvs_) {
    if (kv.key == key) {
      kv.value = std::move(value);
      return std::nullopt;
    }
  }
  kvs_.push_back({std::move(key), std::move(value)});
  return std::nullopt;
}

const GgufValue* GgufWriter::find(std::string_view key) const {
  for (const GgufKv& kv : kvs_) {
    if (kv.key == key) return &kv.value;
  }
  return nullptr;
}

Status GgufWriter::add_tensor(std::string name, std::vector<uint64_t> dims, GgmlType type,
                              GgufTensorProducer produce) {
  if (auto e = name_error("tensor name", name, kMaxNameBytes)) return e;
  if (tensor_index_.count(name) != 0) return Error("duplicate tensor name '" + name + "'");
  const std::string tname = "tensor '" + name + "'";
  if (dims.size() > GgufFile::kMaxDims) {
    return Error(tname + " has " + std::to_string(dims.size()) + " dimensions, at most 4 allowed");
  }
  if (!produce) return Error(ErrorCode::internal, tname + " has no producer for its data");
  const auto traits = ggml_type_traits(static_cast<uint32_t>(type));
  if (!traits) return Error(tname + " has ggml type id " + std::to_string(static_cast<uint32_t>(type)) + ", unknown");
  uint64_t n = 1;
  for (uint64_t d : dims) {
    if (d != 0 && n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / d) {
      return Error(tname + " has more than 2^63-1 elements");
    }
    n *= d;
  }
  const uint64_t row = dims.empty() ? 1 : dims[0];
  if (row % traits->block_elems != 0) {
    return Error(tname + " of type " + std::string(traits->name) + " has rows of " + std::to_string(row) +
                 " elements, not a multiple of its block size " + std::to_string(traits->block_elems));
  }
  const auto bytes = ggml_bytes(type, n);
  if (!bytes) return Error(tname + " is too large: its size in bytes overflows 64 bits");
  tensor_index_.emplace(name, tensors_.size());
  tensors_.push_back({std::move(name), std::move(dims), type, *bytes, std::move(produce)});
  return std::nullopt;
}

uint32_t GgufWriter::alignment() const {
  const GgufValue* v = find("general.alignment");
  return v == nullptr ? GgufFile::kDefaultAlignment : std::get<uint32_t>(*v);
}

std::vector<uint8_t> GgufWriter::header_bytes() const {
  const uint64_t align = alignment();
  Bytes b;
  b.out = {'G', 'G', 'U', 'F'};
  b.put<uint32_t>(3);
  b.put<uint64_t>(tensors_.size());
  b.put<uint64_t>(kvs_.size());
  for (const GgufKv& kv : kvs_) {
    b.str(kv.key);
    b.put(static_cast<uint32_t>(gguf_value_type(kv.value)));
    b.value(kv.value);
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    b.str(t.name);
    b.put(static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) b.put(d);
    b.put(static_cast<uint32_t>(t.type));
    b.put(offset);
    offset += align_up(t.n_bytes, align);
  }
  b.out.resize(align_up(b.out.size(), align), 0);
  return std::move(b.out);
}

uint64_t GgufWriter::file_size() const {
  uint64_t size = header_bytes().size();
  for (const Tensor& t : tensors_) size += align_up(t.n_bytes, alignment());
  return size;
}

Expected<uint64_t> GgufWriter::write_file(const std::filesystem::path& path) {
  const std::filesystem::path partial = path.string() + ".partial";
  auto io_error = [&](const char* what) {
    return Error(ErrorCode::io, partial.string() + ": " + what + ": " + std::strerror(errno));
  };
  std::FILE* file = std::fopen(partial.c_str(), "wb");
  if (file == nullptr) return io_error("cannot create");
  // Large buffered writes: the producers hand over rows of a few KB.
  constexpr size_t kBufferBytes = 8u << 20;
  std::unique_ptr<char[]> buffer(new char[kBufferBytes]);
  std::setvbuf(file, buffer.get(), _IOFBF, kBufferBytes);

  auto abandon = [&](Error e) -> Expected<uint64_t> {
    std::fclose(file);
    std::error_code ignored;
    std::filesystem::remove(partial, ignored);
    return e;
  };
  const uint64_t align = alignment();
  const std::vector<uint8_t> header = header_bytes();
  if (std::fwrite(header.data(), 1, header.size(), file) != header.size()) return abandon(io_error("write failed"));
  uint64_t total = header.size();
  static constexpr uint8_t kZeros[256] = {};
  for (const Tensor& t : tensors_) {
    FileSink sink(file, t.name, t.n_bytes);
    t.produce(sink);
    if (auto e = sink.finish()) return abandon(*e);
    const uint64_t pad = align_up(t.n_bytes, align) - t.n_bytes;
    for (uint64_t left = pad; left > 0;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(left, sizeof kZeros));
      if (std::fwrite(kZeros, 1, n, file) != n) return abandon(io_error("write failed"));
      left -= n;
    }
    total += t.n_bytes + pad;
  }
  if (std::fflush(file) != 0) return abandon(io_error("write failed"));
  if (std::fclose(file) != 0) {
    Error e = io_error("close failed");
    std::error_code ignored;
    std::filesystem::remove(partial, ignored);
    return e;
  }
  std::error_code ec;
  std::filesystem::rename(partial, path, ec);
  if (ec) {
    Error e(ErrorCode::io, path.string() + ": cannot rename the finished file into place: " + ec.message());
    std::filesystem::remove(partial, ec);
    return e;
  }
  return total;
}

}  // namespace ferry::model
