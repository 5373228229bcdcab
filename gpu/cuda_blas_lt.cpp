#include "gpu/cuda_blas_lt.hpp"

#include <dlfcn.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <string>
#include <type_traits>

#include "gpu/cuda_check.hpp"

#if FERRY_CHECK_CUBLAS_ABI
#include <cublasLt.h>
#endif

namespace ferry::gpu::blas::lt {
namespace {

#if FERRY_CHECK_CUBLAS_ABI
// As cuda_blas.cpp checks cuBLAS: the same values, and the same parameters, where a pointer stands for a
// pointer (the opaque descriptors are declared here by their sizes) and an enum for an enum of its size.
template <class A, class B>
constexpr bool same_abi_type = std::is_same_v<A, B> || (std::is_pointer_v<A> && std::is_pointer_v<B>) ||
                               (std::is_enum_v<A> && std::is_enum_v<B> && sizeof(A) == sizeof(B));
template <class F, class G>
struct same_abi : std::false_type {};
template <class R, class... A, class S, class... B>
struct same_abi<R (*)(A...), S (*)(B...)>
    : std::bool_constant<sizeof...(A) == sizeof...(B) && same_abi_type<R, S> && (same_abi_type<A, B> && ...)> {};
template <class F, class G>
constexpr bool same_abi_v = same_abi<F, G>::value;

static_assert(std::is_same_v<Handle, cublasLtHandle_t>);
static_assert(sizeof(Opaque32) == sizeof(cublasLtMatmulDescOpaque_t) && sizeof(Opaque8) == sizeof(cublasLtMatrixLayoutOpaque_t));
static_assert(sizeof(Opaque8) == sizeof(cublasLtMatmulPreferenceOpaque_t) && sizeof(Algo) == sizeof(cublasLtMatmulAlgo_t));
static_assert(sizeof(HeuristicResult) == sizeof(cublasLtMatmulHeuristicResult_t) &&
              offsetof(HeuristicResult, state) == offsetof(cublasLtMatmulHeuristicResult_t, state));
static_assert(desc_transa == int{CUBLASLT_MATMUL_DESC_TRANSA} && desc_transb == int{CUBLASLT_MATMUL_DESC_TRANSB});
static_assert(desc_a_scale == int{CUBLASLT_MATMUL_DESC_A_SCALE_POINTER} &&
              desc_b_scale == int{CUBLASLT_MATMUL_DESC_B_SCALE_POINTER});
static_assert(pref_max_workspace == int{CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES});
static_assert(same_abi_v<decltype(Api::create), decltype(&cublasLtCreate)>);
static_assert(same_abi_v<decltype(Api::destroy), decltype(&cublasLtDestroy)>);
static_assert(same_abi_v<decltype(Api::desc_create), decltype(&cublasLtMatmulDescCreate)>);
static_assert(same_abi_v<decltype(Api::desc_destroy), decltype(&cublasLtMatmulDescDestroy)>);
static_assert(same_abi_v<decltype(Api::desc_set), decltype(&cublasLtMatmulDescSetAttribute)>);
static_assert(same_abi_v<decltype(Api::layout_create), decltype(&cublasLtMatrixLayoutCreate)>);
static_assert(same_abi_v<decltype(Api::layout_destroy), decltype(&cublasLtMatrixLayoutDestroy)>);
static_assert(same_abi_v<decltype(Api::pref_create), decltype(&cublasLtMatmulPreferenceCreate)>);
static_assert(same_abi_v<decltype(Api::pref_destroy), decltype(&cublasLtMatmulPreferenceDestroy)>);
static_assert(same_abi_v<decltype(Api::pref_set), decltype(&cublasLtMatmulPreferenceSetAttribute)>);
static_assert(same_abi_v<decltype(Api::heuristic), decltype(&cublasLtMatmulAlgoGetHeuristic)>);
static_assert(same_abi_v<decltype(Api::matmul), decltype(&cublasLtMatmul)>);
#endif

constexpr int kBuildMajor = CUDART_VERSION / 1000;

template <class F>
void bind(void* lib, const char* symbol, const std::string& file, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, symbol));
  if (f == nullptr) throw CudaError("cublasLt: " + file + " has no " + symbol);
}

void check(Status code, const char* call) {
  if (code != success) throw CudaError(std::string("cublasLt error ") + std::to_string(code) + " in " + call);
}

}  // namespace

Api load(const std::string& dir) {
  const int majors[] = {kBuildMajor, kBuildMajor == 12 ? 13 : 12};
  std::string tried;
  for (const int major : majors) {
    const std::string file = (dir.empty() ? "" : dir + "/") + "libcublasLt.so." + std::to_string(major);
    void* lib = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      tried += "\n  " + file + ": " + (why != nullptr ? why : "not loaded");
      continue;
    }
    Api api;
    bind(lib, "cublasLtCreate", file, api.create);
    bind(lib, "cublasLtDestroy", file, api.destroy);
    bind(lib, "cublasLtMatmulDescCreate", file, api.desc_create);
    bind(lib, "cublasLtMatmulDescDestroy", file, api.desc_destroy);
    bind(lib, "cublasLtMatmulDescSetAttribute", file, api.desc_set);
    bind(lib, "cublasLtMatrixLayoutCreate", file, api.layout_create);
    bind(lib, "cublasLtMatrixLayoutDestroy", file, api.layout_destroy);
    bind(lib, "cublasLtMatmulPreferenceCreate", file, api.pref_create);
    bind(lib, "cublasLtMatmulPreferenceDestroy", file, api.pref_destroy);
    bind(lib, "cublasLtMatmulPreferenceSetAttribute", file, api.pref_set);
    bind(lib, "cublasLtMatmulAlgoGetHeuristic", file, api.heuristic);
    bind(lib, "cublasLtMatmul", file, api.matmul);
    api.library = file;
    return api;
  }
  throw CudaError("cannot load cublasLt " + std::to_string(kBuildMajor) + " or " + std::to_string(majors[1]) + " from " +
                  (dir.empty() ? "the loader's path" : dir) + ":" + tried);
}

const Api* api() {
  static const Api* loaded = []() -> const Api* {
    const char* dir = std::getenv("FERRY_CUBLAS_PATH");
    try {
      static const Api a = load(dir != nullptr ? dir : "");
      return &a;
    } catch (const CudaError& e) {
      spdlog::warn("{}; the prefill products keep their fp16 corrections", e.what());
      return nullptr;
    }
  }();
  return loaded;
}

Fp8Gemm::Fp8Gemm() {
  int dev = 0, major = 0, minor = 0;
  FERRY_CUDA(cudaGetDevice(&dev));
  FERRY_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  FERRY_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (10 * major + minor < 89) return;
  api_ = api();
  if (api_ != nullptr) check(api_->create(&handle_), "cublasLtCreate");
}

Fp8Gemm::~Fp8Gemm() {
  for (auto& [key, p] : plans_) {
    if (p.desc != nullptr) api_->desc_destroy(p.desc);
    for (Layout l : {p.a, p.b, p.c}) {
      if (l != nullptr) api_->layout_destroy(l);
    }
  }
  if (handle_ != nullptr) api_->destroy(handle_);
}

Fp8Gemm::Plan& Fp8Gemm::plan(int m, int n, int k, int lda, int ldb, int ldc, size_t workspace_bytes) {
  auto [it, fresh] = plans_.try_emplace({m, n, k, lda, ldb, ldc, workspace_bytes});
  Plan& p = it->second;
  if (!fresh) return p;
  check(api_->desc_create(&p.desc, compute_32f, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const int32_t t = op_t, nt = op_n;
  check(api_->desc_set(p.desc, desc_transa, &t, sizeof t), "CUBLASLT_MATMUL_DESC_TRANSA");
  check(api_->desc_set(p.desc, desc_transb, &nt, sizeof nt), "CUBLASLT_MATMUL_DESC_TRANSB");
  // Scaled operands, as every call has them: the heuristic does not dereference the pointers (cublasLt.h), the
  // calls set their own.
  static const float* any = reinterpret_cast<const float*>(uintptr_t{256});
  check(api_->desc_set(p.desc, desc_a_scale, &any, sizeof any), "CUBLASLT_MATMUL_DESC_A_SCALE_POINTER");
  check(api_->desc_set(p.desc, desc_b_scale, &any, sizeof any), "CUBLASLT_MATMUL_DESC_B_SCALE_POINTER");
  check(api_->layout_create(&p.a, CUDA_R_8F_E4M3, static_cast<uint64_t>(k), static_cast<uint64_t>(m), lda),
        "cublasLtMatrixLayoutCreate");
  check(api_->layout_create(&p.b, CUDA_R_8F_E4M3, static_cast<uint64_t>(k), static_cast<uint64_t>(n), ldb),
        "cublasLtMatrixLayoutCreate");
  check(api_->layout_create(&p.c, CUDA_R_32F, static_cast<uint64_t>(m), static_cast<uint64_t>(n), ldc),
        "cublasLtMatrixLayoutCreate");
  Preference pref = nullptr;
  check(api_->pref_create(&pref), "cublasLtMatmulPreferenceCreate");
  check(api_->pref_set(pref, pref_max_workspace, &workspace_bytes, sizeof workspace_bytes),
        "CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES");
  HeuristicResult r[kAlgos]{};
  int found = 0;
  const Status st = api_->heuristic(handle_, p.desc, p.a, p.b, p.c, p.c, pref, kAlgos, r, &found);
  api_->pref_destroy(pref);
  for (int i = 0; st == success && i < found; ++i) {
    if (r[i].state == success) p.algos[p.count++] = r[i].algo;
  }
  if (p.count == 0) {
    spdlog::debug("cublasLt has no e4m3 algorithm for {} x {} x {} (status {}): fp16 corrections", m, n, k, int{st});
  }
  return p;
}

bool Fp8Gemm::ready(int m, int n, int k, int lda, int ldb, int ldc, size_t workspace_bytes) {
  if (handle_ == nullptr) return false;
  const Plan& p = plan(m, n, k, lda, ldb, ldc, workspace_bytes);
  return p.next < p.count;
}

bool Fp8Gemm::run(int m, int n, int k, float alpha, const void* a, int lda, const float* a_descale, const void* b,
                  int ldb, const float* b_descale, float beta, float* y, int ldc, void* workspace,
                  size_t workspace_bytes, cudaStream_t s) {
  if (!ready(m, n, k, lda, ldb, ldc, workspace_bytes)) return false;
  Plan& p = plan(m, n, k, lda, ldb, ldc, workspace_bytes);
  check(api_->desc_set(p.desc, desc_a_scale, &a_descale, sizeof a_descale), "CUBLASLT_MATMUL_DESC_A_SCALE_POINTER");
  check(api_->desc_set(p.desc, desc_b_scale, &b_descale, sizeof b_descale), "CUBLASLT_MATMUL_DESC_B_SCALE_POINTER");
  for (; p.next < p.count; ++p.next, p.no_c = false) {
    for (;;) {
      const Status st = api_->matmul(handle_, p.desc, &alpha, a, p.a, b, p.b, &beta, p.no_c ? nullptr : y, p.c, y, p.c,
                                     &p.algos[p.next], workspace, workspace_bytes, s);
      if (st == success) return true;
      spdlog::debug("cublasLt refused e4m3 algorithm {} of {} for {} x {} x {}{} (status {})", p.next + 1, p.count, m,
                    n, k, p.no_c ? " without C" : "", int{st});
      if (p.no_c || beta != 0.0f) break;
      p.no_c = true;  // with beta 0 no C need be passed
    }
  }
  spdlog::warn("cublasLt took no e4m3 algorithm for {} x {} x {}: its products keep fp16 corrections", m, n, k);
  return false;
}

}  // namespace ferry::gpu::blas::lt
