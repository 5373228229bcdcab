#include "gpu/cuda_memory.hpp"

#include <string>

namespace ferry::gpu {

void throw_cuda_error(cudaError_t code, const char* call, const char* file, int line) {
  throw CudaError(std::string("CUDA error ") + cudaGetErrorName(code) + " (" + cudaGetErrorString(code) + ") in " +
                  call + " at " + file + ":" + std::to_string(line));
}

void throw_cublas_error(cublasStatus_t code, const char* call, const char* file, int line) {
  throw CudaError(std::string("cuBLAS error ") + cublasGetStatusName(code) + " (" + cublasGetStatusString(code) +
                  ") in " + call + " at " + file + ":" + std::to_string(line));
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) {
    const cudaError_t e = cudaMalloc(&ptr_, bytes);
    if (e != cudaSuccess) {
      ptr_ = nullptr;
      bytes_ = 0;
      throw CudaError("cannot allocate " + std::to_string(bytes) + " bytes of device memory: " + cudaGetErrorString(e));
    }
  }
}

void DeviceBuffer::reset() {
  if (ptr_ != nullptr) cudaFree(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

PinnedBuffer::PinnedBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) FERRY_CUDA(cudaMallocHost(&ptr_, bytes));
}

void PinnedBuffer::reset() {
  if (ptr_ != nullptr) cudaFreeHost(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

Stream::Stream() { FERRY_CUDA(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
Stream::~Stream() {
  if (s_ != nullptr) cudaStreamDestroy(s_);
}

Event::Event() { FERRY_CUDA(cudaEventCreate(&e_)); }
Event::~Event() {
  if (e_ != nullptr) cudaEventDestroy(e_);
}

float Event::since(const Event& start) const {
  float ms = 0.0f;
  FERRY_CUDA(cudaEventElapsedTime(&ms, start.e_, e_));
  return ms;
}

void GraphExec::end_capture(cudaStream_t s) {
  reset();
  cudaGraph_t graph = nullptr;
  FERRY_CUDA(cudaStreamEndCapture(s, &graph));
  const cudaError_t e = cudaGraphInstantiate(&exec_, graph, 0);
  cudaGraphDestroy(graph);
  if (e != cudaSuccess) {
    exec_ = nullptr;
    FERRY_CUDA(e);
  }
}

void GraphExec::reset() {
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
  exec_ = nullptr;
}

}  // namespace ferry::gpu
