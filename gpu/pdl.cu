#include "gpu/pdl.hpp"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "gpu/cuda_check.hpp"
#include "gpu/graph_kernels.hpp"
#include "gpu/pdl.cuh"

namespace ferry::gpu {
namespace {

thread_local bool t_pdl = false;

// A kernel whose code shows what this build runs on the device (pdl_device_ready).
__global__ void pdl_probe_kernel() { pdl_wait(); }

}  // namespace

PdlScope::PdlScope(bool on) : before_(t_pdl) { t_pdl = t_pdl || on; }
PdlScope::~PdlScope() { t_pdl = before_; }

bool pdl_env_allows() {
  const char* v = std::getenv("FERRY_PDL");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

bool code_built_for(const void* kernel, int major) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, int>, bool> known;
  int dev = 0;
  FERRY_CUDA(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = known.try_emplace({kernel, dev, major}, false);
  if (fresh) {
    int device_major = 0;
    FERRY_CUDA(cudaDeviceGetAttribute(&device_major, cudaDevAttrComputeCapabilityMajor, dev));
    cudaFuncAttributes fa{};
    FERRY_CUDA(cudaFuncGetAttributes(&fa, kernel));
    it->second = device_major >= major && fa.ptxVersion >= 10 * major;
  }
  return it->second;
}

bool sm90_code_built(const void* kernel) { return code_built_for(kernel, 9); }

bool sm80_code_ready() { return code_built_for(reinterpret_cast<const void*>(pdl_probe_kernel), 8); }

bool pdl_device_ready() { return sm90_code_built(reinterpret_cast<const void*>(pdl_probe_kernel)); }

void pdl_configure(cudaLaunchConfig_t& cfg, cudaLaunchAttribute& attr, const void* kernel) {
  // Asked first, so that the eager step before a capture fills the cache.
  if (!sm90_code_built(kernel) || !t_pdl) return;
  attr = {};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
}

size_t programmatic_edges(cudaGraph_t graph) {
  size_t programmatic = 0;
  for (const GraphEdge& e : graph_edges(graph)) programmatic += e.programmatic;
  return programmatic;
}

}  // namespace ferry::gpu
