#include "gpu/cuda_memory.hpp"

#include <string>

#include "gpu/graph_kernels.hpp"
#include "gpu/pdl.hpp"

namespace ferry::gpu {

ErrorCode classify(cudaError_t code) {
  switch (code) {
    case cudaErrorMemoryAllocation: return ErrorCode::out_of_memory;
    case cudaErrorNoDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorECCUncorrectable:
    case cudaErrorSystemNotReady:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorInsufficientDriver: return ErrorCode::device_lost;
    default: return ErrorCode::device_error;
  }
}

void throw_cuda_error(cudaError_t code, const char* call, const char* file, int line) {
  throw CudaError(std::string("CUDA error ") + cudaGetErrorName(code) + " (" + cudaGetErrorString(code) + ") in " +
                      call + " at " + file + ":" + std::to_string(line),
                  classify(code));
}

namespace {

void* allocate_or_throw(cudaError_t (*alloc)(void**, size_t), size_t bytes, const char* what) {
  void* p = nullptr;
  if (const cudaError_t e = alloc(&p, bytes); e != cudaSuccess) {
    throw CudaError("cannot allocate " + std::to_string(bytes) + " bytes of " + what + ": " + cudaGetErrorString(e),
                    classify(e));
  }
  return p;
}

cudaError_t malloc_device(void** p, size_t bytes) { return cudaMalloc(p, bytes); }
cudaError_t malloc_pinned(void** p, size_t bytes) { return cudaMallocHost(p, bytes); }

}  // namespace

void* DeviceMemory::allocate(size_t bytes) { return allocate_or_throw(malloc_device, bytes, "device memory"); }
void* PinnedMemory::allocate(size_t bytes) { return allocate_or_throw(malloc_pinned, bytes, "pinned host memory"); }

Stream::Stream() { FERRY_CUDA(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
Stream::~Stream() {
  if (s_ != nullptr) cudaStreamDestroy(s_);
}

Event::Event(bool timing) {
  FERRY_CUDA(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
}
Event::~Event() {
  if (e_ != nullptr) cudaEventDestroy(e_);
}

bool Event::done() const {
  const cudaError_t e = cudaEventQuery(e_);
  if (e == cudaErrorNotReady) {
    cudaGetLastError();  // "not yet" is no error: keep it from the next launch check
    return false;
  }
  FERRY_CUDA(e);
  return true;
}

float Event::since(const Event& start) const {
  float ms = 0.0f;
  FERRY_CUDA(cudaEventElapsedTime(&ms, start.e_, e_));
  return ms;
}

void GraphExec::end_capture(cudaStream_t s, size_t* programmatic, std::vector<std::string>* kernels) {
  reset();
  cudaGraph_t graph = nullptr;
  FERRY_CUDA(cudaStreamEndCapture(s, &graph));
  if (programmatic != nullptr || kernels != nullptr) {
    try {
      if (programmatic != nullptr) *programmatic = programmatic_edges(graph);
      if (kernels != nullptr) {
        // A diagnostic (bench's launch count, the tests' listing): where the nodes cannot be named,
        // the list stays empty rather than failing the step.
        try {
          *kernels = graph_kernel_names(graph);
        } catch (const CudaError&) {
          kernels->clear();
        }
      }
    } catch (...) {
      cudaGraphDestroy(graph);
      throw;
    }
  }
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
