// libFuzzer target for the GGUF reader (built and run by tools/fuzz.sh, not by CMake): any input
// must parse or fail with a message, never crash, hang or read outside the input. On success every
// accessor runs and every tensor byte is read, so ASan sees any span that points past the input.
#include <cstddef>
#include <cstdint>
#include <span>

#include "model/formats/gguf.hpp"

using namespace ferry::model;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parsed = GgufFile::parse(std::span<const uint8_t>(data, size));
  if (!parsed) {
    if (parsed.error().message.empty()) __builtin_trap();
    return 0;
  }
  const GgufFile& f = *parsed;
  volatile uint64_t sink = f.version() + f.alignment() + f.data_offset();
  for (const GgufKv& kv : f.metadata()) {
    if (f.find(kv.key) != &kv.value) __builtin_trap();
    sink = sink + f.get_u32(kv.key).ok() + f.get_i64(kv.key).ok() + f.get_f32(kv.key).ok() +
           f.get_string(kv.key).ok() + f.get_u32_array(kv.key).ok() + f.get_f32_array(kv.key).ok() +
           f.get_string_array(kv.key).ok();
    if (const auto* a = std::get_if<GgufArray>(&kv.value)) sink = sink + a->size();
  }
  for (const GgufTensorInfo& t : f.tensors()) {
    if (f.find_tensor(t.name) != &t || t.data.size() != t.n_bytes) __builtin_trap();
    for (uint8_t b : t.data) sink = sink + b;
  }
  (void)sink;
  return 0;
}
