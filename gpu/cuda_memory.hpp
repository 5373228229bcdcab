#pragma once
// RAII owners of device memory, pinned host memory, streams, events and CUDA graphs. Each frees
// what it owns exactly once (move-only); errors on release are ignored (a destructor cannot throw,
// and a dead context has already freed everything).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gpu/cuda_check.hpp"

namespace ferry::gpu {

// One allocation of `Memory` (device or pinned host), freed when the owner goes; move-only.
template <class Memory>
class OwnedBuffer {
 public:
  OwnedBuffer() = default;
  explicit OwnedBuffer(size_t bytes) : ptr_(bytes > 0 ? Memory::allocate(bytes) : nullptr), bytes_(bytes) {}
  ~OwnedBuffer() { reset(); }
  OwnedBuffer(OwnedBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  OwnedBuffer& operator=(OwnedBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  OwnedBuffer(const OwnedBuffer&) = delete;
  OwnedBuffer& operator=(const OwnedBuffer&) = delete;

  void reset() {
    if (ptr_ != nullptr) Memory::release(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* get() const { return ptr_; }
  template <class T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// cudaMalloc / cudaFree; allocate throws CudaError naming the size.
struct DeviceMemory {
  static void* allocate(size_t bytes);
  static void release(void* p) noexcept { cudaFree(p); }
};

// cudaMallocHost / cudaFreeHost (page-locked, for asynchronous copies).
struct PinnedMemory {
  static void* allocate(size_t bytes);
  static void release(void* p) noexcept { cudaFreeHost(p); }
};

using DeviceBuffer = OwnedBuffer<DeviceMemory>;
using PinnedBuffer = OwnedBuffer<PinnedMemory>;

class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  void synchronize() const { FERRY_CUDA(cudaStreamSynchronize(s_)); }

 private:
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  // Events that only order streams need no timing (cheaper to record and wait on).
  explicit Event(bool timing = true);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }
  void record(cudaStream_t s) { FERRY_CUDA(cudaEventRecord(e_, s)); }
  // Whether the device has reached it (never recorded: yes); does not wait.
  bool done() const;
  // Milliseconds from `start` to this event (both recorded and complete).
  float since(const Event& start) const;

 private:
  cudaEvent_t e_ = nullptr;
};

// An instantiated CUDA graph, replayed on a stream.
class GraphExec {
 public:
  GraphExec() = default;
  ~GraphExec() { reset(); }
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;
  GraphExec(GraphExec&& o) noexcept : exec_(std::exchange(o.exec_, nullptr)) {}
  GraphExec& operator=(GraphExec&& o) noexcept {
    if (this != &o) {
      reset();
      exec_ = std::exchange(o.exec_, nullptr);
    }
    return *this;
  }
  // Ends a capture begun on `s` and instantiates it; `programmatic`, when given, gets the graph's
  // PDL edges (gpu/pdl.hpp), `kernels` its nodes' names in order (gpu/graph_kernels.hpp).
  void end_capture(cudaStream_t s, size_t* programmatic = nullptr, std::vector<std::string>* kernels = nullptr);
  void launch(cudaStream_t s) const { FERRY_CUDA(cudaGraphLaunch(exec_, s)); }
  bool ready() const { return exec_ != nullptr; }
  void reset();

 private:
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace ferry::gpu
