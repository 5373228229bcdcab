#include "kv/host_kv_tier.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "config/byte_size.hpp"
#include "kv/kv_rows.hpp"

namespace ferry::kv {

using config::KvType;

uint64_t HostKvTier::bytes_for(const HostKvShape& s) {
  return uint64_t{s.slots} * s.layers * s.max_tokens * config::kv_row_bytes(s.type, s.width);
}

Expected<std::unique_ptr<HostKvTier>> HostKvTier::create(const HostKvShape& shape, uint64_t budget,
                                                         HostAllocator allocator) {
  const uint64_t need = bytes_for(shape);
  if (need > budget) {
    const uint64_t per_slot = need / std::max<uint32_t>(1, shape.slots);
    const uint64_t fits = per_slot == 0 ? 0 : budget / per_slot;
    return Error(ErrorCode::out_of_memory,
                 "the host KV budget (--kv-host-budget) of " + config::format_byte_size(budget) + " cannot hold " +
                     std::to_string(shape.slots) + " slots of " + std::to_string(shape.max_tokens) + " tokens x " +
                     std::to_string(shape.layers) + " DSA layers in " + std::string(config::kv_type_name(shape.type)) +
                     " (" + config::format_byte_size(need) + ", " + config::format_byte_size(per_slot) +
                     " a slot): raise the budget to at least that, or lower --ctx or --slots (it holds " +
                     std::to_string(fits) + " slots)");
  }
  if (!allocator.allocate) {
    allocator.allocate = [](uint64_t bytes) { return std::malloc(bytes); };
    allocator.release = [](void* p) { std::free(p); };
  }
  auto* memory = static_cast<uint8_t*>(need == 0 ? nullptr : allocator.allocate(need));
  if (need != 0 && memory == nullptr) {
    return Error(ErrorCode::out_of_memory, "the host KV tier could not allocate " + config::format_byte_size(need));
  }
  return std::unique_ptr<HostKvTier>(new HostKvTier(shape, std::move(allocator), memory));
}

HostKvTier::HostKvTier(const HostKvShape& shape, HostAllocator allocator, uint8_t* memory)
    : shape_(shape),
      allocator_(std::move(allocator)),
      memory_(memory),
      bytes_(bytes_for(shape)),
      data_bytes_(uint64_t{shape.slots} * shape.layers * shape.max_tokens * shape.width * kv_element_bytes(shape.type)),
      tokens_(size_t{shape.slots} * shape.layers, 0) {}

HostKvTier::~HostKvTier() {
  if (memory_ != nullptr) allocator_.release(memory_);
}

uint8_t* HostKvTier::data_at(uint32_t slot, uint32_t layer, uint32_t pos) const {
  const uint64_t row = uint64_t{index(slot, layer)} * shape_.max_tokens + pos;
  return memory_ + row * shape_.width * kv_element_bytes(shape_.type);
}

float* HostKvTier::scale_at(uint32_t slot, uint32_t layer, uint32_t pos) const {
  const uint64_t row = uint64_t{index(slot, layer)} * shape_.max_tokens + pos;
  return reinterpret_cast<float*>(memory_ + data_bytes_) + row;
}

uint64_t HostKvTier::slot_bytes(uint32_t slot) const {
  uint64_t rows = 0;
  for (uint32_t l = 0; l < shape_.layers; ++l) rows += tokens(slot, l);
  return rows * config::kv_row_bytes(shape_.type, shape_.width);
}

Status HostKvTier::write(uint32_t slot, uint32_t layer, uint32_t pos, const float* src, uint32_t n, uint64_t stride) {
  auto rows = claim(slot, layer, pos, n);
  if (!rows) return rows.error();
  for (uint32_t i = 0; i < n; ++i) {
    encode_row(shape_.type, src + i * stride, shape_.width, data_at(slot, layer, pos + i),
               shape_.type == KvType::int8 ? scale_at(slot, layer, pos + i) : nullptr);
  }
  return std::nullopt;
}

Expected<HostKvTier::RawRows> HostKvTier::claim(uint32_t slot, uint32_t layer, uint32_t pos, uint32_t n) {
  if (slot >= shape_.slots || layer >= shape_.layers) {
    return Error(ErrorCode::invalid_plan, "host KV tier: slot " + std::to_string(slot) + " layer " +
                                              std::to_string(layer) + " does not exist");
  }
  const uint32_t end = tokens(slot, layer);
  if (pos > end || uint64_t{pos} + n > shape_.max_tokens) {
    return Error(ErrorCode::invalid_plan, "host KV tier: rows [" + std::to_string(pos) + ", " + std::to_string(pos + n) +
                                              ") of slot " + std::to_string(slot) + " layer " + std::to_string(layer) +
                                              " (holds " + std::to_string(end) + " of " +
                                              std::to_string(shape_.max_tokens) + ")");
  }
  if (pos < end) truncate(slot, pos);
  tokens_[index(slot, layer)] = pos + n;
  return RawRows{data_at(slot, layer, pos), shape_.type == KvType::int8 ? scale_at(slot, layer, pos) : nullptr};
}

void HostKvTier::truncate(uint32_t slot, uint32_t t) {
  bool cut = false;
  for (uint32_t l = 0; l < shape_.layers; ++l) {
    uint32_t& n = tokens_[index(slot, l)];
    if (n > t) n = t, cut = true;
  }
  if (!cut) return;
  for (const auto& f : listeners_) f(slot, t);
}

void HostKvTier::decode(uint32_t slot, uint32_t layer, uint32_t pos, float* out) const {
  decode_row(shape_.type, data_at(slot, layer, pos), shape_.type == KvType::int8 ? *scale_at(slot, layer, pos) : 0.0f,
             shape_.width, out);
}

const void* HostKvTier::row_data(uint32_t slot, uint32_t layer, uint32_t pos) const { return data_at(slot, layer, pos); }

const float* HostKvTier::row_scale(uint32_t slot, uint32_t layer, uint32_t pos) const {
  return shape_.type == KvType::int8 ? scale_at(slot, layer, pos) : nullptr;
}

}  // namespace ferry::kv
