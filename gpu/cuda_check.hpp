#pragma once
// CUDA failures as exceptions confined to gpu/: a failing call throws CudaError naming
// the call, where it was made and the runtime's message; nothing here aborts. The backend turns it
// into the std::runtime_error that model::Backend promises for device failures.
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace ferry::gpu {

class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void throw_cuda_error(cudaError_t code, const char* call, const char* file, int line);

inline void check_cuda(cudaError_t code, const char* call, const char* file, int line) {
  if (code != cudaSuccess) throw_cuda_error(code, call, file, line);
}

}  // namespace ferry::gpu

#define FERRY_CUDA(call) ::ferry::gpu::check_cuda((call), #call, __FILE__, __LINE__)
// After a kernel launch: a bad configuration shows up here, a fault at the next synchronisation.
#define FERRY_CUDA_LAUNCHED() ::ferry::gpu::check_cuda(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
