#include "gpu/handoff.hpp"

#include <algorithm>

namespace ferry::gpu {

bool can_access_peer(int a, int b) {
  int ok = 0;
  return a == b || (cudaDeviceCanAccessPeer(&ok, a, b) == cudaSuccess && ok != 0);
}

namespace {

// Enables access from the current device to `peer` once; an already enabled pair is fine.
void enable_peer(int peer) {
  const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();  // clears it
    return;
  }
  FERRY_CUDA(e);
}

}  // namespace

HandoffLink::HandoffLink(int sender, int receiver, uint64_t bytes) : sender_(sender), receiver_(receiver) {
  if (sender == receiver) {
    path_ = "same device";
  } else if (can_access_peer(sender, receiver) && can_access_peer(receiver, sender)) {
    path_ = "peer-to-peer";
    FERRY_CUDA(cudaSetDevice(sender));
    enable_peer(receiver);
    FERRY_CUDA(cudaSetDevice(receiver));
    enable_peer(sender);
  } else {
    path_ = "through host memory (no peer access)";
  }
  FERRY_CUDA(cudaSetDevice(sender));
  delivered_.emplace(false);
  FERRY_CUDA(cudaSetDevice(receiver));
  freed_.emplace(false);
  inbox_ = DeviceBuffer(bytes);
}

CudaHandoff HandoffLink::send(const void* src, uint64_t bytes, uint32_t rows, cudaStream_t stream) {
  if (bytes > inbox_.bytes()) {
    throw CudaError("hand-off of " + std::to_string(bytes) + " bytes into an inbox of " + std::to_string(inbox_.bytes()),
                    ErrorCode::internal);
  }
  // The inbox is free once the receiver copied the previous delivery out: wait until that copy is at
  // least enqueued (so `freed_` records it), then let the device wait for it.
  if (sent_ > 0) received_.wait(sent_ - 1, std::memory_order_acquire);
  FERRY_CUDA(cudaStreamWaitEvent(stream, freed_->get(), 0));
  if (sender_ == receiver_) {
    FERRY_CUDA(cudaMemcpyAsync(inbox_.get(), src, bytes, cudaMemcpyDeviceToDevice, stream));
  } else {
    FERRY_CUDA(cudaMemcpyPeerAsync(inbox_.get(), receiver_, src, sender_, bytes, stream));
  }
  delivered_->record(stream);
  return CudaHandoff(sent_++, rows, bytes);
}

void HandoffLink::receive(const CudaHandoff& h, void* dst, cudaStream_t compute_stream) {
  const uint64_t expected = received_.load(std::memory_order_relaxed);
  if (h.sequence() != expected) {
    throw CudaError("hand-off " + std::to_string(h.sequence()) + " arrived where " + std::to_string(expected) +
                        " was next",
                    ErrorCode::internal);
  }
  FERRY_CUDA(cudaStreamWaitEvent(compute_stream, delivered_->get(), 0));
  FERRY_CUDA(cudaMemcpyAsync(dst, inbox_.get(), h.bytes(), cudaMemcpyDeviceToDevice, compute_stream));
  freed_->record(compute_stream);
  received_.store(expected + 1, std::memory_order_release);
  received_.notify_all();
}

void HandoffLink::discard(const CudaHandoff& h) {
  received_.store(std::max(received_.load(std::memory_order_relaxed), h.sequence() + 1), std::memory_order_release);
  received_.notify_all();
}

}  // namespace ferry::gpu
