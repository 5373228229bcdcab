// The decode router in one launch (gpu/moe_route_decode.hpp). Block `row` makes logit `row` as
// matvec_kernel<kF32, 1, 8> does (gpu/matvec.cu): warp p's lanes take the 8-float units p * 32 + lane,
// then every 256, each unit's two float4 products added in column order, the warps' sums by shuffles
// and then in warp order. The weights (no kernel writes them) are in registers before the PDL wait.
// The block that finishes last (a counter, fenced) routes the row. One row only: a last block routing
// several in turn measured slower than the two launches (3 rows: 9.1 against 4.0 us a route).
#include "gpu/moe_route_decode.hpp"

#include <algorithm>

#include "gpu/cuda_check.hpp"
#include "gpu/matvec_wide.hpp"
#include "gpu/moe_route.cuh"
#include "gpu/pdl.cuh"
#include "gpu/pdl.hpp"

namespace ferry::gpu {
namespace {

constexpr uint32_t kProductWarps = 8;  // the general kernel's warps a row (its WPR)
constexpr uint32_t kMaxUnits = 4;      // units a lane holds: rows of up to 4 * 256 * 8 = 8,192 columns
constexpr uint32_t kMaxThreads = 512;  // E <= 512: a thread an expert for the route

struct RouterDecodeArgs {
  const uint8_t* w = nullptr;
  size_t row_bytes = 0;
  const float* x = nullptr;
  float* logits = nullptr;  // route.logits, written here
  uint32_t cols = 0;
  uint32_t* done = nullptr;
  RouterArgs route;
};

__global__ void __launch_bounds__(kMaxThreads) router_decode_kernel(RouterDecodeArgs p) {
  __shared__ float partial[kProductWarps];
  __shared__ RouteScratch s;
  __shared__ bool last;
  const RouterArgs& a = p.route;
  const uint32_t tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, row = blockIdx.x, units = p.cols / 8;
  const bool product = warp < kProductWarps;
  const float4* wrow = reinterpret_cast<const float4*>(p.w + static_cast<size_t>(row) * p.row_bytes);
  float4 w[kMaxUnits][2];
#pragma unroll
  for (uint32_t i = 0; i < kMaxUnits; ++i) {
    const uint32_t u = warp * 32 + lane + i * kProductWarps * 32;
    const bool ok = product && u < units;
    w[i][0] = ok ? wrow[2 * u] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    w[i][1] = ok ? wrow[2 * u + 1] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  pdl_wait();  // x is the kernel's ahead; the logits, ids and weights are read by earlier kernels
  pdl_launch_dependents();  // the routed experts' blocks may take their places (gpu/pdl.hpp)
  if (product) {
    float acc = 0.0f;
#pragma unroll
    for (uint32_t i = 0; i < kMaxUnits; ++i) {
      const uint32_t u = warp * 32 + lane + i * kProductWarps * 32;
      if (u >= units) break;
      const float4* xt = reinterpret_cast<const float4*>(p.x + 8 * u);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float4 xv = xt[h], wv = w[i][h];
        acc += wv.x * xv.x + wv.y * xv.y + wv.z * xv.z + wv.w * xv.w;
      }
    }
    for (uint32_t o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) partial[warp] = acc;
  }
  __syncthreads();
  if (tid == 0) {
    float v = 0.0f;
    for (uint32_t q = 0; q < kProductWarps; ++q) v += partial[q];
    p.logits[row] = v;
    __threadfence();  // the logits before the count: the block that counts last reads them all
    last = atomicAdd(p.done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  route_row(a, 0, s);
  if (tid == 0) *p.done = 0;
}

}  // namespace

bool moe_route_decode(const DevMatrix& w, const float* x, float* logits, const RouterArgs& a, uint32_t* done,
                      cudaStream_t stream) {
  MatvecArgs m;  // the product as matvec() would take it
  m.w = w;
  m.x = x;
  m.y = logits;
  m.tokens = 1;
  const bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && w.row_bytes % 16 == 0;
  const bool product = w.type == model::GgmlType::F32 && w.rows == a.E && w.cols % 8 == 0 && w.cols >= 2048 &&
                       w.cols <= 8 * kProductWarps * 32 * kMaxUnits && aligned &&
                       !matvec_wide_applies(m, current_sm_count());
  const bool route = a.E >= 1 && a.E <= kMaxThreads && a.k >= 1 && a.k <= kRouteMaxK && a.k <= a.E &&
                     a.n_group >= 1 && a.n_group <= kRouteMaxGroups && a.E % a.n_group == 0 && a.topk_group >= 1;
  if (!product || !route || a.rows != 1 || done == nullptr) return false;
  RouterDecodeArgs p;
  p.w = w.data;
  p.row_bytes = w.row_bytes;
  p.x = x;
  p.logits = logits;
  p.cols = w.cols;
  p.done = done;
  p.route = a;
  p.route.logits = logits;
  launch_with_pdl(router_decode_kernel, dim3(a.E), dim3(std::max(kProductWarps * 32, (a.E + 31) / 32 * 32)), 0, stream,
                  p);
  return true;
}

}  // namespace ferry::gpu
