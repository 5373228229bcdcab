#pragma once
// cublasLt, loaded at run time as cuBLAS is (gpu/cuda_blas.hpp says why), for the one product ferry takes
// from it: e4m3 GEMMs with f32 output accumulated onto C, the prefill products' corrections on sm89+ where
// FP8 runs at twice the fp16 rate (LayerRunner::mm_staged). Only the entry points called are declared, with
// the library's ABI values (cuda_blas_lt.cpp checks them against cublasLt.h where the toolkit has it).
#include <cuda_runtime_api.h>
#include <library_types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "gpu/cuda_blas.hpp"

struct cublasLtContext;

namespace ferry::gpu::blas::lt {

using Handle = cublasLtContext*;
struct Opaque8 {
  uint64_t data[8];
};
struct Opaque32 {
  uint64_t data[32];
};
using MatmulDesc = Opaque32*;
using Layout = Opaque8*;
using Preference = Opaque8*;
using Algo = Opaque8;
struct HeuristicResult {
  Algo algo;
  size_t workspace_size;
  Status state;
  float waves;
  int reserved[4];
};
enum DescAttribute : int { desc_transa = 3, desc_transb = 4, desc_a_scale = 17, desc_b_scale = 18 };
enum PreferenceAttribute : int { pref_max_workspace = 1 };

struct Api {
  std::string library;
  Status (*create)(Handle*);
  Status (*destroy)(Handle);
  Status (*desc_create)(MatmulDesc*, ComputeType, cudaDataType);
  Status (*desc_destroy)(MatmulDesc);
  Status (*desc_set)(MatmulDesc, DescAttribute, const void*, size_t);
  Status (*layout_create)(Layout*, cudaDataType, uint64_t rows, uint64_t cols, int64_t ld);
  Status (*layout_destroy)(Layout);
  Status (*pref_create)(Preference*);
  Status (*pref_destroy)(Preference);
  Status (*pref_set)(Preference, PreferenceAttribute, const void*, size_t);
  Status (*heuristic)(Handle, MatmulDesc, Layout a, Layout b, Layout c, Layout d, Preference, int requested,
                      HeuristicResult* results, int* returned);
  Status (*matmul)(Handle, MatmulDesc, const void* alpha, const void* a, Layout, const void* b, Layout,
                   const void* beta, const void* c, Layout, void* d, Layout, const Algo*, void* workspace,
                   size_t workspace_bytes, cudaStream_t);
};

// Loads libcublasLt from `dir` (empty: the loader's path), the build's major first; throws CudaError
// naming every file tried.
Api load(const std::string& dir);
// load($FERRY_CUBLAS_PATH) once; nullptr where it cannot be loaded (the callers keep cuBLAS's fp16 form).
const Api* api();

// y (m x n, column-major, ldc) = alpha * a_descale * b_descale * A^T B + beta * y for e4m3 operands, A's m
// rows and B's n rows of depth k each contiguous (lda, ldb bytes apart: the TN layout FP8 needs); the
// descales are device floats, 16-byte aligned. One plan per shape: the heuristic's first few algorithms, the
// first that runs kept, in place (C = D) or else with no C (beta 0): the heuristic judges the descriptors, not
// the pointers, so an algorithm may still refuse a call.
class Fp8Gemm {
 public:
  Fp8Gemm();
  ~Fp8Gemm();
  Fp8Gemm(const Fp8Gemm&) = delete;
  Fp8Gemm& operator=(const Fp8Gemm&) = delete;
  // Whether the device runs e4m3 tensor products (sm89+) and cublasLt loaded.
  bool available() const { return handle_ != nullptr; }
  // Whether the heuristic gave an algorithm for the shape that has not refused a call (asked once per shape).
  bool ready(int m, int n, int k, int lda, int ldb, int ldc, size_t workspace_bytes);
  // False, with nothing launched, where no algorithm for the shape takes the call (the caller takes the fp16
  // form; ready() is false from then on).
  bool run(int m, int n, int k, float alpha, const void* a, int lda, const float* a_descale, const void* b, int ldb,
           const float* b_descale, float beta, float* y, int ldc, void* workspace, size_t workspace_bytes,
           cudaStream_t s);

 private:
  static constexpr int kAlgos = 4;
  struct Plan {
    MatmulDesc desc = nullptr;
    Layout a = nullptr, b = nullptr, c = nullptr;
    Algo algos[kAlgos]{};
    int count = 0, next = 0;  // algorithms found; the first not yet refused
    bool no_c = false;        // the call that ran passed no C
  };
  Plan& plan(int m, int n, int k, int lda, int ldb, int ldc, size_t workspace_bytes);

  const Api* api_ = nullptr;
  Handle handle_ = nullptr;
  std::map<std::tuple<int, int, int, int, int, int, size_t>, Plan> plans_;
};

}  // namespace ferry::gpu::blas::lt
