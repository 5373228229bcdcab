#pragma once
// CUDA failures as exceptions confined to gpu/: a failing call throws CudaError naming the call,
// where it was made and the runtime's message, and the kind of failure; nothing here aborts. The CUDA
// stage catches them at its interface and returns them as ferry::Error values.
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#include "config/expected.hpp"

namespace ferry::gpu {

class CudaError : public std::runtime_error {
 public:
  explicit CudaError(const std::string& message, ErrorCode code = ErrorCode::unsupported)
      : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

// What a runtime error code means for the stage: out of memory, the device gone, or any other
// failure of a device operation (whose state is then unknown).
ErrorCode classify(cudaError_t code);

[[noreturn]] void throw_cuda_error(cudaError_t code, const char* call, const char* file, int line);

inline void check_cuda(cudaError_t code, const char* call, const char* file, int line) {
  if (code != cudaSuccess) throw_cuda_error(code, call, file, line);
}

}  // namespace ferry::gpu

#define FERRY_CUDA(call) ::ferry::gpu::check_cuda((call), #call, __FILE__, __LINE__)
// After a kernel launch: a bad configuration shows up here, a fault at the next synchronisation.
#define FERRY_CUDA_LAUNCHED() ::ferry::gpu::check_cuda(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
