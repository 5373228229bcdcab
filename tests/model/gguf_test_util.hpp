#pragma once
// Builds GGUF images byte by byte, so that the tests can write exactly the (broken) files they mean.
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

namespace ferry::model::test {

struct GgufBytes {
  std::vector<uint8_t> b;

  template <class T>
  GgufBytes& put(T v) {
    uint8_t raw[sizeof(T)];
    std::memcpy(raw, &v, sizeof(T));
    b.insert(b.end(), raw, raw + sizeof(T));
    return *this;
  }
  GgufBytes& u32(uint32_t v) { return put(v); }
  GgufBytes& u64(uint64_t v) { return put(v); }
  GgufBytes& str(std::string_view s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  GgufBytes& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    b.insert(b.end(), {'G', 'G', 'U', 'F'});
    return u32(version).u64(n_tensors).u64(n_kv);
  }
  // A key with a u32 value.
  GgufBytes& kv_u32(std::string_view key, uint32_t v) { return str(key).u32(4).u32(v); }
  GgufBytes& tensor(std::string_view name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) u64(d);
    return u32(type).u64(offset);
  }
  GgufBytes& pad_to(size_t alignment) {
    while (b.size() % alignment != 0) b.push_back(0);
    return *this;
  }
  GgufBytes& fill(size_t n, uint8_t v) {
    b.insert(b.end(), n, v);
    return *this;
  }
};

}  // namespace ferry::model::test
