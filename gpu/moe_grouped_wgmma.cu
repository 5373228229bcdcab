// The grouped int8 expert products on Hopper's warpgroup MMA (wgmma.mma_async; built for sm_90a only,
// gpu/CMakeLists.txt) for Q4_K, Q5_K and IQ3_S weights: gpu/moe_grouped_int8.cu's block, copies,
// factors and f32 terms (gpu/moe_grouped_int8.cuh), the same operations on each output in the same
// order, with the products issued asynchronously. With mma.sync at 4 warps a scheduler each warp
// waited on its products before their f32 terms (the tensor pipe ~20% busy, half the issue slots
// idle: PERF.md, h53 / h63); here a warpgroup's tensor cores multiply one 64-row half of the block
// while its warps take the f32 terms of the other half's products.
//
// Block: 8 warps = 2 warpgroups over the mma.sync kernel's 128 weight rows (two 64-row halves: gate
// and up, or a matrix's rows 0..63 and 64..127) x 64 tokens. Warpgroup w takes the tile's 8-token
// tiles 2n + w that hold tokens (the mma.sync kernel's warps w * 4.. had the same), N = 8 a tile.
// Per k-tile it runs 8 units (sub-block s, half i) in order: a unit is the high- and the low-byte
// products of a 64 x N x 32 tile (m64nNk32), A (each warp's 16 rows of the half) from the stage by
// ldmatrix and masked in registers as the mma.sync kernel does, B (the tokens' bytes of the
// sub-block) from the stage by descriptor, the tokens' k-tiles laid out as core matrices for it
// (kCoreXWords). Unit u + 1 is issued before unit u's sums are waited for and turned into f32 terms,
// each half's products in registers of its own. The int32 sums of an output are exact, and 256 *
// high + low (exact in int32) is rounded to f32 once, as the mma.sync kernel's two adds over its
// magic-offset words round it: the same bits.
#include <cuda_runtime.h>

#include <cstdlib>

#include "gpu/cuda_check.hpp"
#include "gpu/mma_int8.cuh"
#include "gpu/moe_grouped_int8.cuh"
#include "gpu/pdl.hpp"
#include "gpu/quant_device.cuh"

namespace ferry::gpu::grouped_int8 {
namespace {

template <int T>
using CoreStage = Stage<T, kCoreXWords>;

// An output's sub-block sum 256 * high + low as f32, rounded once.
template <bool kI2F>
__device__ __forceinline__ float sub_block_sum(int32_t h, int32_t l) {
  if constexpr (kI2F) {
    return __int2float_rn(h * 256 + l);
  } else {  // the mma.sync kernel's words: the sums onto the bits of 1.5 * 2^31 (a unit 256) and 1.5 * 2^23
    return (__int_as_float(h + 0x4F400000) - (3221225472.0f + 12582912.0f)) + __int_as_float(l + 0x4B400000);
  }
}

// Descriptor of the warpgroup's B for the sub-block whose first 16-byte chunk is c (high bytes 2s,
// low 8 + 2s): the chunk and the next one (k 16..31) 128 bytes apart, the warpgroup's 8-token tiles
// (every other one) 4 KiB apart.
__device__ __forceinline__ uint64_t b_desc(const uint32_t* x, uint32_t wt, uint32_t c) {
  return mma::smem_desc(x + core_x_word(8 * wt, c), 128, 4096);
}

// One k-tile's products and f32 terms of a warpgroup with NL live 8-token tiles (k-tile kt, in s).
template <int T, int NL, bool kI2F>
__device__ __forceinline__ void multiply(const CoreStage<T>& s, uint32_t kt, const WarpTile& t, float (&acc)[2][4][4]) {
  using K = KQuant<T>;
  constexpr int N = 8 * NL;
  constexpr uint32_t kWWords = K::kWWords;
  const uint32_t g = t.g, q = t.q;
  uint32_t high[2][4];
  if constexpr (K::kHighBits) {  // the fifth bits of the k-tile's columns, as the mma.sync kernel takes them
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      load_a<kWWords>(high[i], &s.w[t.lrb[i] * kWWords], 16);
#pragma unroll
      for (int k = 0; k < 4; ++k) high[i][k] >>= 4 * (kt % 2);
    }
  }
  uint32_t A[2][4];
  int32_t dh[2][N / 2], dl[2][N / 2];
#pragma unroll
  for (int u = 0; u <= 8; ++u) {
    if (u < 8) {  // issue unit u: sub-block u / 2, half u % 2
      const uint32_t step = u / 2;
      const int i = u % 2;
      if constexpr (K::kDecoded) {
        load_a<kWWords>(A[i], &s.w[t.lrb[i] * kWWords], 8 * step);
      } else {
        uint32_t raw[4];
        load_a<kWWords>(raw, &s.w[t.lrb[i] * kWWords], 8 * (step / 2));
        const uint32_t h = step % 2;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if constexpr (K::kHighBits) {
            A[i][k] = ((raw[k] >> (4 * h)) & 0x0f0f0f0fu) | ((high[i][k] << (4 - step)) & 0x10101010u);
          } else {
            A[i][k] = raw[k] & (h == 0 ? 0x0f0f0f0fu : 0xf0f0f0f0u);
          }
        }
      }
      mma::wgmma_fence();
      mma::wgmma_k32<N, K::kDecoded, true>(dh[i], A[i], b_desc(s.x, t.wt, 2 * step));
      mma::wgmma_k32<N, K::kDecoded, false>(dl[i], A[i], b_desc(s.x, t.wt, 8 + 2 * step));
      mma::wgmma_commit();
    }
    if (u > 0) {  // unit u - 1's f32 terms, once its products are done
      const uint32_t step = (u - 1) / 2;
      const int i = (u - 1) % 2;
      if (u < 8) {
        mma::wgmma_wait<1>();
      } else {
        mma::wgmma_wait<0>();
      }
#pragma unroll
      for (int r = 0; r < N / 2; ++r) {
        mma::fence_operand(dh[i][r]);
        mma::fence_operand(dl[i][r]);
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) mma::fence_operand(A[i][k]);
      const float dw[2] = {s.wf[step][t.lrb[i] + g].x, s.wf[step][t.lrb[i] + g + 8].x};
#pragma unroll
      for (int n = 0; n < NL; ++n) {
        const float2 dx = *reinterpret_cast<const float2*>(&s.xd[step][t.token(n) + 2 * q]);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float sum = sub_block_sum<kI2F>(dh[i][4 * n + k], dl[i][4 * n + k]);
          acc[i][n][k] = fmaf(dw[k / 2] * (k % 2 == 0 ? dx.x : dx.y), sum, acc[i][n][k]);
        }
      }
      if constexpr (!K::kDecoded) {  // after each half's last sub-block: tile 0's, then tile 1's
        if (u == 7) minimum_terms<NL, 1>(s, t, acc);
        if (u == 8) minimum_terms<NL, 2>(s, t, acc);
      }
    }
  }
}

// multiply for the warpgroup's live tiles (uniform over the warpgroup).
template <int T, bool kI2F>
__device__ __forceinline__ void multiply_live(const CoreStage<T>& s, uint32_t kt, const WarpTile& t,
                                              float (&acc)[2][4][4]) {
  switch (t.live) {
    case 4: multiply<T, 4, kI2F>(s, kt, t, acc); break;
    case 3: multiply<T, 3, kI2F>(s, kt, t, acc); break;
    case 2: multiply<T, 2, kI2F>(s, kt, t, acc); break;
    case 1: multiply<T, 1, kI2F>(s, kt, t, acc); break;
    default: break;
  }
}

// The mma.sync kernel's loop (one barrier a k-tile) around the warpgroups' products, over kStages
// buffers: k-tile kt's copies are issued kStages - 1 k-tiles ahead, into the buffer every warp is
// done with once past the barrier.
template <int T, int NM, bool kI2F, int kStages>
__global__ void __launch_bounds__(kThreads, 1) kquant_wgmma_kernel(Int8Args a) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ uint32_t grid[KQuant<T>::kDecoded ? 512 : 1];
  CoreStage<T>* st = reinterpret_cast<CoreStage<T>*>(smem);
  __shared__ uint32_t tile_of[3];
  const uint32_t tile = blockIdx.y;
  if (tile >= a.tiles[a.E]) return;
  find_tile(a, tile, tile_of);
  if constexpr (KQuant<T>::kDecoded) {
    for (uint32_t i = threadIdx.x; i < 512; i += kThreads) grid[i] = a.iq3s_grid[i];
  }
  __syncthreads();
  BlockTile bt;
  bt.e = tile_of[0];
  bt.first = tile_of[1];
  bt.ntok = tile_of[2];
  bt.m0 = blockIdx.x * (BR / NM);
  TileLoader<T, NM, true> ld(a, bt);
  const WarpTile wt = warp_tile<NM, true>(bt.ntok);
  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int n = 0; n < 4; ++n) {
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[i][n][k] = 0.0f;
    }
  }
  const uint32_t ktiles = a.cols / BK;
  ld.load_headers(0);
  // One group a k-tile (empty past the last), so that k-tile kt's is done when at most kStages - 2
  // are in flight.
#pragma unroll
  for (int j = 0; j < kStages - 1; ++j) {
    if (static_cast<uint32_t>(j) < ktiles) {
      ld.issue(a, j, st[j]);
    } else {
      cp_commit();
    }
  }
  for (uint32_t kt = 0; kt < ktiles; ++kt) {
    const uint32_t b = kt % kStages;
    ld.store_factors(kt, st[b], grid);
    cp_wait<kStages - 2>();
    mma::fence_proxy_async();  // the copies, before the barrier, for the products' reads
    __syncthreads();
    const uint32_t next = kt + kStages - 1;
    if (next < ktiles) {
      ld.issue(a, next, st[next % kStages]);
    } else {
      cp_commit();
    }
    if (kt + 1 < ktiles && (KQuant<T>::kDecoded || (kt + 1) % 2 == 0)) ld.load_headers(kt + 1);
    multiply_live<T, kI2F>(st[b], kt, wt, acc);
  }
  store_outputs<NM>(a, bt, wt, acc);
}

template <int T, int NM, bool kI2F>
const void* kernel_address() {
  return reinterpret_cast<const void*>(kquant_wgmma_kernel<T, NM, kI2F, 2>);
}

template <int NM, bool kI2F>
const void* kernel_of(int t) {
  return t == qd::kQ4_K ? kernel_address<qd::kQ4_K, NM, kI2F>()
         : t == qd::kQ5_K ? kernel_address<qd::kQ5_K, NM, kI2F>()
                          : kernel_address<qd::kIQ3_S, NM, kI2F>();
}

template <int T, int NM, bool kI2F, int kStages>
void launch_stages(const Int8Args& a, dim3 grid, cudaStream_t stream) {
  constexpr size_t smem = kStages * sizeof(CoreStage<T>);
  FERRY_CUDA(cudaFuncSetAttribute(kquant_wgmma_kernel<T, NM, kI2F, kStages>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kquant_wgmma_kernel<T, NM, kI2F, kStages><<<grid, kThreads, smem, stream>>>(a);
}

// Temporary A/B switch for the device checks: FERRY_WGMMA_STAGES=4 (else 2).
int stages() {
  static const int v = [] {
    const char* e = std::getenv("FERRY_WGMMA_STAGES");
    return e != nullptr && e[0] == '4' ? 4 : 2;
  }();
  return v;
}

template <int T, int NM, bool kI2F>
void launch(const Int8Args& a, dim3 grid, cudaStream_t stream) {
  if (stages() == 4) {
    launch_stages<T, NM, kI2F, 4>(a, grid, stream);
  } else {
    launch_stages<T, NM, kI2F, 2>(a, grid, stream);
  }
}

template <int NM, bool kI2F>
void launch(int t, const Int8Args& a, dim3 grid, cudaStream_t stream) {
  if (t == qd::kQ4_K) {
    launch<qd::kQ4_K, NM, kI2F>(a, grid, stream);
  } else if (t == qd::kQ5_K) {
    launch<qd::kQ5_K, NM, kI2F>(a, grid, stream);
  } else {
    launch<qd::kIQ3_S, NM, kI2F>(a, grid, stream);
  }
}

// Temporary A/B switch for the device checks: FERRY_WGMMA_MAGIC=1 takes the sums by the magic words.
bool use_i2f() {
  static const bool v = [] {
    const char* e = std::getenv("FERRY_WGMMA_MAGIC");
    return e == nullptr || e[0] != '1';
  }();
  return v;
}

}  // namespace

bool wgmma_ready(int t, bool up) {
  int dev = 0, major = 0, minor = 0;
  FERRY_CUDA(cudaGetDevice(&dev));
  FERRY_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  FERRY_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  // sm_90a code loads on 9.0 only: no other device is asked about the kernel.
  if (major != 9 || minor != 0) return false;
  return code_built_for(up ? kernel_of<2, true>(t) : kernel_of<1, true>(t), 9);
}

void launch_wgmma(int t, bool up, const Int8Args& a, dim3 grid, cudaStream_t stream) {
  if (use_i2f()) {
    up ? launch<2, true>(t, a, grid, stream) : launch<1, true>(t, a, grid, stream);
  } else {
    up ? launch<2, false>(t, a, grid, stream) : launch<1, false>(t, a, grid, stream);
  }
  FERRY_CUDA_LAUNCHED();
}

}  // namespace ferry::gpu::grouped_int8
