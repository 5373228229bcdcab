#include "gpu/window_planner.hpp"

#include <algorithm>
#include <cstring>
#include <string>

namespace ferry::gpu {
namespace {

// A layer's frames of all slots in the host buffers: positions, then reference bits, then hands.
struct HostLayout {
  int32_t* pos;
  uint8_t* ref;
  uint32_t* hand;
  uint32_t* resident;
};
HostLayout host_layout(const PinnedBuffer& b, uint32_t slots, uint32_t frames) {
  auto* pos = b.as<int32_t>();
  auto* ref = reinterpret_cast<uint8_t*>(pos + uint64_t{slots} * frames);
  auto* hand = reinterpret_cast<uint32_t*>(ref + (uint64_t{slots} * frames + 3) / 4 * 4);
  return {pos, ref, hand, hand + slots};
}
uint64_t host_layout_bytes(uint32_t slots, uint32_t frames) {
  return uint64_t{slots} * frames * 4 + (uint64_t{slots} * frames + 3) / 4 * 4 + uint64_t{slots} * 8;
}

}  // namespace

WindowPlanner::WindowPlanner(uint32_t layers, uint32_t slots, uint32_t frames, uint32_t context, cudaStream_t stream)
    : layers_(layers), slots_(slots), frames_(frames), context_(context) {
  const uint64_t ls = uint64_t{layers} * slots;
  pos_frame_ = DeviceBuffer(std::max<uint64_t>(ls * context * sizeof(int32_t), 16));
  frame_pos_ = DeviceBuffer(std::max<uint64_t>(ls * frames * sizeof(int32_t), 16));
  ref_ = DeviceBuffer(std::max<uint64_t>(ls * frames, 16));
  pin_ = DeviceBuffer(std::max<uint64_t>(ls * frames, 16));
  hand_ = DeviceBuffer(std::max<uint64_t>(ls * sizeof(uint32_t), 16));
  counts_ = DeviceBuffer(sizeof(WindowCounts) + ls * sizeof(uint32_t));
  FERRY_CUDA(cudaMemsetAsync(pos_frame_.get(), 0xff, pos_frame_.bytes(), stream));
  FERRY_CUDA(cudaMemsetAsync(frame_pos_.get(), 0xff, frame_pos_.bytes(), stream));
  FERRY_CUDA(cudaMemsetAsync(ref_.get(), 0, ref_.bytes(), stream));
  FERRY_CUDA(cudaMemsetAsync(pin_.get(), 0, pin_.bytes(), stream));
  FERRY_CUDA(cudaMemsetAsync(hand_.get(), 0, hand_.bytes(), stream));
  FERRY_CUDA(cudaMemsetAsync(counts_.get(), 0, counts_.bytes(), stream));
  down_ = PinnedBuffer(host_layout_bytes(slots, frames));
  up_ = PinnedBuffer(host_layout_bytes(slots, frames));
  published_ = PinnedBuffer(counts_.bytes());
  std::memset(published_.get(), 0, published_.bytes());
  FERRY_CUDA(cudaStreamSynchronize(stream));
}

WindowTables WindowPlanner::tables(uint32_t layer) const {
  const uint64_t ls = uint64_t{layer} * slots_;
  WindowTables t;
  t.pos_frame = pos_frame_.as<int32_t>() + ls * context_;
  t.frame_pos = frame_pos_.as<int32_t>() + ls * frames_;
  t.ref = ref_.as<uint8_t>() + ls * frames_;
  t.pin = pin_.as<uint8_t>() + ls * frames_;
  t.hand = hand_.as<uint32_t>() + ls;
  t.resident = reinterpret_cast<uint32_t*>(counts_.as<uint8_t>() + sizeof(WindowCounts)) + ls;
  t.frames = frames_;
  t.context = context_;
  return t;
}

void WindowPlanner::adopt_identity(uint32_t layer, uint32_t slot, uint32_t n, cudaStream_t stream) {
  window_adopt_identity(tables(layer), slot, n, stream);
}

void WindowPlanner::invalidate(uint32_t slot, uint32_t cut, cudaStream_t stream) {
  for (uint32_t L = 0; L < layers_; ++L) window_invalidate(tables(L), slot, cut, stream);
}

void WindowPlanner::begin_step(cudaStream_t stream) {
  FERRY_CUDA(cudaMemsetAsync(&counts()->step_fetched, 0, sizeof(unsigned long long), stream));
}

void WindowPlanner::to_host(uint32_t layer, const std::vector<uint32_t>& slots, kv::ResidentWindow& window,
                            cudaStream_t stream) {
  const WindowTables t = tables(layer);
  const HostLayout h = host_layout(down_, slots_, frames_);
  for (uint32_t s : slots) {
    FERRY_CUDA(cudaMemcpyAsync(h.pos + uint64_t{s} * frames_, t.frame_pos + uint64_t{s} * frames_,
                               uint64_t{frames_} * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
    FERRY_CUDA(cudaMemcpyAsync(h.ref + uint64_t{s} * frames_, t.ref + uint64_t{s} * frames_, frames_,
                               cudaMemcpyDeviceToHost, stream));
    FERRY_CUDA(cudaMemcpyAsync(h.hand + s, t.hand + s, sizeof(uint32_t), cudaMemcpyDeviceToHost, stream));
  }
  FERRY_CUDA(cudaStreamSynchronize(stream));
  for (uint32_t s : slots) {
    if (!window.clock(s).import_slot(s, h.pos + uint64_t{s} * frames_, h.ref + uint64_t{s} * frames_, h.hand[s])) {
      throw CudaError("resident KV window: the device tables of slot " + std::to_string(s) + " layer " +
                          std::to_string(layer) + " are inconsistent",
                      ErrorCode::internal);
    }
  }
}

void WindowPlanner::from_host(uint32_t layer, const std::vector<uint32_t>& slots, kv::ResidentWindow& window,
                              cudaStream_t stream) {
  const WindowTables t = tables(layer);
  const HostLayout h = host_layout(up_, slots_, frames_);
  for (uint32_t s : slots) {
    window.clock(s).export_slot(h.pos + uint64_t{s} * frames_, h.ref + uint64_t{s} * frames_);
    h.hand[s] = window.clock(s).hand();
    h.resident[s] = window.clock(s).resident();
    window_unmap_positions(t, s, stream);
    FERRY_CUDA(cudaMemcpyAsync(t.frame_pos + uint64_t{s} * frames_, h.pos + uint64_t{s} * frames_,
                               uint64_t{frames_} * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
    FERRY_CUDA(cudaMemcpyAsync(t.ref + uint64_t{s} * frames_, h.ref + uint64_t{s} * frames_, frames_,
                               cudaMemcpyHostToDevice, stream));
    FERRY_CUDA(cudaMemcpyAsync(t.hand + s, h.hand + s, sizeof(uint32_t), cudaMemcpyHostToDevice, stream));
    FERRY_CUDA(cudaMemcpyAsync(t.resident + s, h.resident + s, sizeof(uint32_t), cudaMemcpyHostToDevice, stream));
    window_map_positions(t, s, stream);
  }
}

void WindowPlanner::publish(cudaStream_t stream) {
  FERRY_CUDA(cudaMemcpyAsync(published_.get(), counts_.get(), counts_.bytes(), cudaMemcpyDeviceToHost, stream));
}

WindowCounts WindowPlanner::published_counts() const { return *published_.as<WindowCounts>(); }

std::vector<uint64_t> WindowPlanner::published_resident() const {
  const auto* r = reinterpret_cast<const uint32_t*>(published_.as<uint8_t>() + sizeof(WindowCounts));
  std::vector<uint64_t> n(slots_, 0);
  for (uint64_t i = 0; i < uint64_t{layers_} * slots_; ++i) n[i % slots_] += r[i];
  return n;
}

WindowCounts WindowPlanner::read_counts(cudaStream_t stream) {
  publish(stream);
  FERRY_CUDA(cudaStreamSynchronize(stream));
  return published_counts();
}

std::vector<uint64_t> WindowPlanner::resident(cudaStream_t stream) {
  publish(stream);
  FERRY_CUDA(cudaStreamSynchronize(stream));
  return published_resident();
}

}  // namespace ferry::gpu
