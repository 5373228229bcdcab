#include "gpu/cuda_blas.hpp"

#include <dlfcn.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <string>
#include <type_traits>

#include "gpu/cuda_check.hpp"

#if FERRY_CHECK_CUBLAS_ABI
#include <cublas_v2.h>
#endif

namespace ferry::gpu::blas {
namespace {

#if FERRY_CHECK_CUBLAS_ABI
// Where the toolkit has cuBLAS's header (gpu/CMakeLists.txt), the declarations in cuda_blas.hpp are
// checked against it: the same values, and for each entry point the same parameters, an enum standing
// for an enum of the same size.
template <class A, class B>
constexpr bool same_abi_type = std::is_same_v<A, B> || (std::is_enum_v<A> && std::is_enum_v<B> && sizeof(A) == sizeof(B));
template <class F, class G>
struct same_abi : std::false_type {};
template <class R, class... A, class S, class... B>
struct same_abi<R (*)(A...), S (*)(B...)>
    : std::bool_constant<sizeof...(A) == sizeof...(B) && same_abi_type<R, S> && (same_abi_type<A, B> && ...)> {};
template <class F, class G>
constexpr bool same_abi_v = same_abi<F, G>::value;

static_assert(success == int{CUBLAS_STATUS_SUCCESS} && op_n == int{CUBLAS_OP_N} && op_t == int{CUBLAS_OP_T});
static_assert(compute_32f == int{CUBLAS_COMPUTE_32F} && gemm_default == int{CUBLAS_GEMM_DEFAULT});
static_assert(std::is_same_v<Handle, cublasHandle_t>);
static_assert(same_abi_v<decltype(Api::create), decltype(&cublasCreate_v2)>);
static_assert(same_abi_v<decltype(Api::destroy), decltype(&cublasDestroy_v2)>);
static_assert(same_abi_v<decltype(Api::set_stream), decltype(&cublasSetStream_v2)>);
static_assert(same_abi_v<decltype(Api::set_workspace), decltype(&cublasSetWorkspace_v2)>);
static_assert(same_abi_v<decltype(Api::sgemm), decltype(&cublasSgemm_v2)>);
// C++ sees a second, inline cublasGemmEx (the pre-11 compute type); this picks the exported one.
using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                  const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                                  cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
static_assert(same_abi_v<decltype(Api::gemm_ex), decltype(static_cast<GemmEx>(&cublasGemmEx))>);
static_assert(same_abi_v<decltype(Api::sgemm_strided), decltype(&cublasSgemmStridedBatched)>);
using GemmStridedEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                         const void*, const void*, cudaDataType, int, long long, const void*,
                                         cudaDataType, int, long long, const void*, void*, cudaDataType, int, long long,
                                         int, cublasComputeType_t, cublasGemmAlgo_t);
static_assert(same_abi_v<decltype(Api::gemm_strided_ex),
                         decltype(static_cast<GemmStridedEx>(&cublasGemmStridedBatchedEx))>);
static_assert(same_abi_v<decltype(Api::status_name), decltype(&cublasGetStatusName)>);
static_assert(same_abi_v<decltype(Api::status_string), decltype(&cublasGetStatusString)>);
#endif

constexpr int kBuildMajor = CUDART_VERSION / 1000;

template <class F>
void bind(void* lib, const char* symbol, const std::string& file, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, symbol));
  if (f == nullptr) throw CudaError("cuBLAS: " + file + " has no " + symbol + " (not a cuBLAS 12 or 13 library?)");
}

}  // namespace

Api load(const std::string& dir) {
  // The build's own major first, then the other one ferry supports.
  const int majors[] = {kBuildMajor, kBuildMajor == 12 ? 13 : 12};
  std::string tried;
  for (const int major : majors) {
    const std::string file = (dir.empty() ? "" : dir + "/") + "libcublas.so." + std::to_string(major);
    void* lib = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      tried += "\n  " + file + ": " + (why != nullptr ? why : "not loaded");
      continue;
    }
    Api api;
    bind(lib, "cublasCreate_v2", file, api.create);
    bind(lib, "cublasDestroy_v2", file, api.destroy);
    bind(lib, "cublasSetStream_v2", file, api.set_stream);
    bind(lib, "cublasSetWorkspace_v2", file, api.set_workspace);
    bind(lib, "cublasSgemm_v2", file, api.sgemm);
    bind(lib, "cublasGemmEx", file, api.gemm_ex);
    bind(lib, "cublasSgemmStridedBatched", file, api.sgemm_strided);
    bind(lib, "cublasGemmStridedBatchedEx", file, api.gemm_strided_ex);
    bind(lib, "cublasGetStatusName", file, api.status_name);
    bind(lib, "cublasGetStatusString", file, api.status_string);
    Dl_info info{};
    api.library = dladdr(reinterpret_cast<void*>(api.create), &info) != 0 && info.dli_fname != nullptr ? info.dli_fname : file;
    if (major != kBuildMajor) {
      spdlog::warn("cuBLAS {} was not found, using {} (this build is for CUDA {}):{}", kBuildMajor, api.library,
                   kBuildMajor, tried);
    }
    return api;
  }
  throw CudaError("cannot load cuBLAS " + std::to_string(kBuildMajor) + " or " + std::to_string(majors[1]) + " from " +
                  (dir.empty() ? "the loader's path" : dir) + ":" + tried + "\nset FERRY_CUBLAS_PATH to the directory of " +
                  "libcublas.so." + std::to_string(kBuildMajor) +
                  (kBuildMajor == 12 ? " (pip install nvidia-cublas-cu12: site-packages/nvidia/cublas/lib)"
                                     : " (a CUDA 13 toolkit's lib64, or pip install nvidia-cublas)"));
}

const Api& api() {
  static const Api loaded = [] {
    const char* dir = std::getenv("FERRY_CUBLAS_PATH");
    return load(dir != nullptr ? dir : "");
  }();
  return loaded;
}

void throw_error(Status code, const char* call, const char* file, int line) {
  throw CudaError(std::string("cuBLAS error ") + api().status_name(code) + " (" + api().status_string(code) + ") in " +
                  call + " at " + file + ":" + std::to_string(line));
}

}  // namespace ferry::gpu::blas
