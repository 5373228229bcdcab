#pragma once
// cuBLAS, loaded when the CUDA backend first needs it rather than linked. cuBLAS is the one large
// CUDA library ferry uses (~600 MB with cublasLt), and its major version follows the toolkit: the
// default build (CUDA 13) and the Volta build (CUDA 12, which still runs on sm_70) each need their
// own, a V100 host takes it from `pip install nvidia-cublas-cu12`, and neither build nor its GPU
// bundle depends on it at link time. The build's major is tried first, then the other one, so a
// CUDA 12 build also runs where only cuBLAS 13 is installed (cuBLAS carries its own runtime and
// shares streams through the device's primary context).
//
// Search order: $FERRY_CUBLAS_PATH (a directory) when set, else the dynamic loader's (LD_LIBRARY_PATH,
// the binary's RUNPATH, the system's library directories).
//
// Only the few entry points ferry calls are declared, with the cuBLAS ABI's own values, so that
// compiling needs no cuBLAS header either (cuda_blas.cpp checks them against the header where the
// toolkit has one).
#include <cuda_runtime_api.h>
#include <library_types.h>

#include <cstddef>
#include <string>

struct cublasContext;

namespace ferry::gpu::blas {

using Handle = cublasContext*;
enum Status : int { success = 0 };
enum Operation : int { op_n = 0, op_t = 1 };
enum ComputeType : int { compute_32f = 68 };
enum GemmAlgo : int { gemm_default = -1 };

struct Api {
  std::string library;  // the file that was loaded
  Status (*create)(Handle*);
  Status (*destroy)(Handle);
  Status (*set_stream)(Handle, cudaStream_t);
  Status (*set_workspace)(Handle, void*, size_t);
  Status (*sgemm)(Handle, Operation, Operation, int m, int n, int k, const float* alpha, const float* a, int lda,
                  const float* b, int ldb, const float* beta, float* c, int ldc);
  Status (*gemm_ex)(Handle, Operation, Operation, int m, int n, int k, const void* alpha, const void* a,
                    cudaDataType a_type, int lda, const void* b, cudaDataType b_type, int ldb, const void* beta, void* c,
                    cudaDataType c_type, int ldc, ComputeType compute, GemmAlgo algo);
  // Batches of equal products, operand i at a + i * stride_a (elements), for per-head weights.
  Status (*sgemm_strided)(Handle, Operation, Operation, int m, int n, int k, const float* alpha, const float* a,
                          int lda, long long stride_a, const float* b, int ldb, long long stride_b, const float* beta,
                          float* c, int ldc, long long stride_c, int batches);
  Status (*gemm_strided_ex)(Handle, Operation, Operation, int m, int n, int k, const void* alpha, const void* a,
                            cudaDataType a_type, int lda, long long stride_a, const void* b, cudaDataType b_type, int ldb,
                            long long stride_b, const void* beta, void* c, cudaDataType c_type, int ldc,
                            long long stride_c, int batches, ComputeType compute, GemmAlgo algo);
  const char* (*status_name)(Status);
  const char* (*status_string)(Status);
};

// Loads cuBLAS from `dir` (empty: the dynamic loader's path), the build's major first; throws
// CudaError naming every file it tried and why each failed.
Api load(const std::string& dir);
// load($FERRY_CUBLAS_PATH) once, on first use (thread-safe; tried again while it fails).
const Api& api();

[[noreturn]] void throw_error(Status code, const char* call, const char* file, int line);
inline void check(Status code, const char* call, const char* file, int line) {
  if (code != success) throw_error(code, call, file, line);
}

}  // namespace ferry::gpu::blas

#define FERRY_CUBLAS(call) ::ferry::gpu::blas::check((call), #call, __FILE__, __LINE__)
