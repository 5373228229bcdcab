// The grouped int8 expert products on Hopper's warpgroup MMA (wgmma.mma_async; built for sm_90a only,
// gpu/CMakeLists.txt) for Q4_K, Q5_K and IQ3_S weights: gpu/moe_grouped_int8.cu's tiles, copies and
// factors (gpu/moe_grouped_int8.cuh) and its f32 terms, the same operations on each output in the
// same order, with the products issued asynchronously. With mma.sync at 4 warps a scheduler each warp
// waited on its products before their f32 terms (the tensor pipe ~20% busy, half the issue slots
// idle: PERF.md, h53 / h63); here a warpgroup's tensor cores multiply the next sub-block while its
// warps take the f32 terms of the last one.
//
// Block: 16 warps = 4 warpgroups over the mma.sync kernel's 128 weight rows x 64 tokens (one block an
// SM at 128 registers: the products in flight take 2 x 32 of them). Warpgroup wg takes the 8-token
// tiles of parity wg % 2 that hold tokens (N = 8 a tile) and a quarter of the rows (WgTile). Per
// k-tile it runs 4 units in order, one a sub-block: the high- and low-byte products of its 64 x N x 32
// tile (m64nNk32), A (each warp's 16 rows) from the stage by ldmatrix and masked in registers as the
// mma.sync kernel does, B (the tokens' bytes of the sub-block) from the stage by descriptor, the
// tokens' k-tiles laid out as core matrices for it (kCoreXWords). Unit s + 1 is issued before unit
// s's sums are waited for and turned into f32 terms. The int32 sums of an output are exact, and 256 *
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

// An output's sub-block sum 256 * high + low as f32, rounded once (I2FP: the mma.sync kernel's magic
// words, 2 IADD + 2 FADD here, were slower).
__device__ __forceinline__ float sub_block_sum(int32_t h, int32_t l) { return __int2float_rn(h * 256 + l); }

// Descriptor of the warpgroup's B for the sub-block whose first 16-byte chunk is c (high bytes 2s,
// low 8 + 2s): the chunk and the next one (k 16..31) 128 bytes apart, the warpgroup's 8-token tiles
// (every other one) 4 KiB apart.
__device__ __forceinline__ uint64_t b_desc(const uint32_t* x, uint32_t tile, uint32_t c) {
  return mma::smem_desc(x + core_x_word(8 * tile, c), 128, 4096);
}

constexpr uint32_t kWgThreads = 512;  // 4 warpgroups

// Temporary (the device checks' A/B): the stages.
template <int Stages>
struct Cfg {
  static constexpr int kStages = Stages;
};

// A warp's part of the block: warpgroup wg takes the tile's 8-token tiles of parity wt = wg % 2 (n-th:
// tokens 8 * (2n + wt)..) and a quarter of its 128 weight rows, half wg / 2 of gate and of up (or of
// the matrix's 64-row halves): the warp's 16 fragment rows are 8 of gate and the same 8 of up (NM 2:
// fragment rows g and g + 8 of one thread are a gate row and its up row, so SwiGLU stays in
// registers), or 16 consecutive rows. rows[r]: the local row (0..127) of fragment rows 8r..
struct WgTile {
  uint32_t g, q, wt, live, rows[2];
  __device__ uint32_t token(uint32_t n) const { return 8 * (2 * n + wt); }
  __device__ uint32_t row(int r) const { return rows[r] + g; }  // the thread's fragment rows g, g + 8
};

template <int NM>
__device__ __forceinline__ WgTile wg_tile(uint32_t ntok) {
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4, wr = warp % 4, h = wg / 2;
  WgTile t;
  t.g = lane / 4;
  t.q = lane % 4;
  t.wt = wg % 2;
  t.rows[0] = NM == 2 ? 32 * h + 8 * wr : 64 * h + 16 * wr;
  t.rows[1] = NM == 2 ? BR / 2 + 32 * h + 8 * wr : 64 * h + 16 * wr + 8;
  const uint32_t tiles = (ntok + 7) / 8;
  t.live = tiles > t.wt ? min(4u, (tiles - t.wt + 1) / 2) : 0;
  return t;
}

// The warp's A fragment (16 rows x 16-byte chunks at words `word` and `word` + 4) by ldmatrix: lane l
// gives fragment row l % 8 (+ 8 for odd l / 8) of chunk l / 16.
template <uint32_t kWWords>
__device__ __forceinline__ void load_a_rows(uint32_t (&r)[4], const uint32_t* w, const WgTile& t, uint32_t word) {
  const uint32_t lane = threadIdx.x % 32;
  mma::ldmatrix_x4(r, w + (t.rows[lane / 8 % 2] + lane % 8) * kWWords + word + 4 * (lane / 16));
}

// minimum_terms (gpu/moe_grouped_int8.cuh) for the warp's rows.
template <int NL, class S>
__device__ __forceinline__ void wg_minimum_terms(const S& s, const WgTile& t, float (&acc)[4][4]) {
  const uint32_t g = t.g, q = t.q;
  uint32_t am[2];
  float dmin[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    am[r] = __float_as_uint(s.wf[q][t.row(r)].y);
    dmin[r] = s.dmin[t.row(r)];
  }
  const uint32_t zero[4] = {0, 0, 0, 0};
#pragma unroll
  for (int n = 0; n < NL; ++n) {
    const float sx = s.xs[q][t.token(n) + g];
    const uint32_t head = __float_as_uint(sx) & 0xffffe000u;
    const uint32_t rest = __float_as_uint(sx - __uint_as_float(head));
    uint32_t part[4], m[4];
    mma::mma_tf32_k4(part, am, rest, zero);
    mma::mma_tf32_k4(m, am, head, part);
#pragma unroll
    for (int k = 0; k < 4; ++k) acc[n][k] = fmaf(-dmin[k / 2], __uint_as_float(m[k]), acc[n][k]);
  }
}

// A warpgroup's products and f32 terms with NL live 8-token tiles: per k-tile 4 units, unit s the
// sub-block's high- and low-byte products of the warpgroup's 64 rows x 8 NL tokens; unit s + 1 is
// issued before s's sums are waited for and taken.
template <int T, int NL>
struct Pipe {
  using K = KQuant<T>;
  const WgTile& t;
  float (&acc)[4][4];
  uint32_t high[4];
  uint32_t A[2][4];
  int32_t dh[2][4 * (NL > 0 ? NL : 1)], dl[2][4 * (NL > 0 ? NL : 1)];

  __device__ Pipe(const WgTile& t_, float (&acc_)[4][4]) : t(t_), acc(acc_) {}

  template <int U>
  __device__ __forceinline__ void issue(const CoreStage<T>& s) {
    constexpr uint32_t step = U;
    if constexpr (K::kDecoded) {
      load_a_rows<K::kWWords>(A[U % 2], s.w, t, 8 * step);
    } else {
      uint32_t raw[4];
      load_a_rows<K::kWWords>(raw, s.w, t, 8 * (step / 2));
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if constexpr (K::kHighBits) {
          A[U % 2][k] = ((raw[k] >> (4 * (step % 2))) & 0x0f0f0f0fu) | ((high[k] << (4 - step)) & 0x10101010u);
        } else {
          A[U % 2][k] = raw[k] & (step % 2 == 0 ? 0x0f0f0f0fu : 0xf0f0f0f0u);
        }
      }
    }
    mma::wgmma_fence();
    mma::wgmma_k32<8 * NL, K::kDecoded, true>(dh[U % 2], A[U % 2], b_desc(s.x, t.wt, 2 * step));
    mma::wgmma_k32<8 * NL, K::kDecoded, false>(dl[U % 2], A[U % 2], b_desc(s.x, t.wt, 8 + 2 * step));
    mma::wgmma_commit();
  }

  template <int U, int Pending>
  __device__ __forceinline__ void terms(const CoreStage<T>& s) {
    constexpr uint32_t step = U;
    mma::wgmma_wait<Pending>();
#pragma unroll
    for (int r = 0; r < 4 * NL; ++r) {
      mma::fence_operand(dh[U % 2][r]);
      mma::fence_operand(dl[U % 2][r]);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) mma::fence_operand(A[U % 2][k]);
    const float dw[2] = {s.wf[step][t.row(0)].x, s.wf[step][t.row(1)].x};
#pragma unroll
    for (int n = 0; n < NL; ++n) {
      const float2 dx = *reinterpret_cast<const float2*>(&s.xd[step][t.token(n) + 2 * t.q]);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float sum = sub_block_sum(dh[U % 2][4 * n + k], dl[U % 2][4 * n + k]);
        acc[n][k] = fmaf(dw[k / 2] * (k % 2 == 0 ? dx.x : dx.y), sum, acc[n][k]);
      }
    }
    if constexpr (!K::kDecoded && step == kSteps - 1) wg_minimum_terms<NL>(s, t, acc);
  }

  __device__ __forceinline__ void k_tile(const CoreStage<T>& s, uint32_t kt) {
    if constexpr (NL > 0) {
      if constexpr (K::kHighBits) {  // the fifth bits of the k-tile's columns, as the mma.sync kernel takes them
        load_a_rows<K::kWWords>(high, s.w, t, 16);
#pragma unroll
        for (int k = 0; k < 4; ++k) high[k] >>= 4 * (kt % 2);
      }
      issue<0>(s);
      issue<1>(s);
      terms<0, 1>(s);
      issue<2>(s);
      terms<1, 1>(s);
      issue<3>(s);
      terms<2, 1>(s);
      terms<3, 0>(s);
    }
  }
};

// The warpgroups' k-tiles with NL live tiles each: the copies of kStages - 1 k-tiles ahead in flight,
// one barrier a k-tile, after which k-tile kt's copies (waited for) and factors (stored before it) are
// seen by every warp, and the buffer of k-tile kt - 1 is free for k-tile kt + kStages - 1's copies.
template <int T, int NM, class C, int NL>
__device__ __forceinline__ void k_loop(const Int8Args& a, TileLoader<T, NM, true, kWgThreads>& ld, CoreStage<T>* st,
                                       const uint32_t* grid, const WgTile& wt, float (&acc)[4][4]) {
  constexpr int kStages = C::kStages;
  Pipe<T, NL> pipe(wt, acc);
  const uint32_t ktiles = a.cols / BK;
  ld.load_headers(0);
  // One group a k-tile (empty past the last), so that k-tile kt's is done when at most kStages - 2 are
  // in flight.
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
    pipe.k_tile(st[b], kt);
  }
}

// The warp's outputs of the tile's tokens (NM 2: SwiGLU of its gate and up rows).
template <int NM>
__device__ __forceinline__ void wg_store(const Int8Args& a, const BlockTile& bt, const WgTile& t,
                                         const float (&acc)[4][4]) {
#pragma unroll
  for (int n = 0; n < 4; ++n) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t tok = t.token(n) + 2 * t.q + k % 2;
      if (tok >= bt.ntok || (NM == 2 && k >= 2)) continue;
      float* yt = a.y + static_cast<size_t>(bt.first + tok) * a.ldy;
      const uint32_t row = bt.m0 + t.row(k / 2);
      if (row >= a.rows) continue;
      yt[row] = NM == 2 ? swiglu_value(acc[n][k % 2], acc[n][k % 2 + 2], a.limit) : acc[n][k];
    }
  }
}

template <int T, int NM, class C>
__global__ void __launch_bounds__(kWgThreads, 1) kquant_wgmma_kernel(Int8Args a) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ uint32_t grid[KQuant<T>::kDecoded ? 512 : 1];
  CoreStage<T>* st = reinterpret_cast<CoreStage<T>*>(smem);
  __shared__ uint32_t tile_of[3];
  const uint32_t tile = blockIdx.y;
  if (tile >= a.tiles[a.E]) return;
  find_tile<kWgThreads>(a, tile, tile_of);
  if constexpr (KQuant<T>::kDecoded) {
    for (uint32_t i = threadIdx.x; i < 512; i += kWgThreads) grid[i] = a.iq3s_grid[i];
  }
  __syncthreads();
  BlockTile bt;
  bt.e = tile_of[0];
  bt.first = tile_of[1];
  bt.ntok = tile_of[2];
  bt.m0 = blockIdx.x * (BR / NM);
  TileLoader<T, NM, true, kWgThreads> ld(a, bt);
  const WgTile wt = wg_tile<NM>(bt.ntok);
  float acc[4][4];
#pragma unroll
  for (int n = 0; n < 4; ++n) {
#pragma unroll
    for (int k = 0; k < 4; ++k) acc[n][k] = 0.0f;
  }
  // Every warpgroup runs every k-tile's barrier; one without tokens (a tile of at most 8) only copies.
  switch (wt.live) {
    case 4: k_loop<T, NM, C, 4>(a, ld, st, grid, wt, acc); break;
    case 3: k_loop<T, NM, C, 3>(a, ld, st, grid, wt, acc); break;
    case 2: k_loop<T, NM, C, 2>(a, ld, st, grid, wt, acc); break;
    case 1: k_loop<T, NM, C, 1>(a, ld, st, grid, wt, acc); break;
    default: k_loop<T, NM, C, 0>(a, ld, st, grid, wt, acc); break;
  }
  wg_store<NM>(a, bt, wt, acc);
}

using Default = Cfg<4>;

template <int NM>
const void* kernel_of(int t) {
  return t == qd::kQ4_K   ? reinterpret_cast<const void*>(kquant_wgmma_kernel<qd::kQ4_K, NM, Default>)
         : t == qd::kQ5_K ? reinterpret_cast<const void*>(kquant_wgmma_kernel<qd::kQ5_K, NM, Default>)
                          : reinterpret_cast<const void*>(kquant_wgmma_kernel<qd::kIQ3_S, NM, Default>);
}

template <int T, int NM, class C>
void launch_cfg(const Int8Args& a, dim3 grid, cudaStream_t stream) {
  constexpr size_t smem = C::kStages * sizeof(CoreStage<T>);
  FERRY_CUDA(cudaFuncSetAttribute(kquant_wgmma_kernel<T, NM, C>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)));
  kquant_wgmma_kernel<T, NM, C><<<grid, kWgThreads, smem, stream>>>(a);
}

// Temporary A/B switch for the device checks: FERRY_WGMMA_STAGES = 2, 3 (else 4).
int stages() {
  static const int v = [] {
    const char* e = std::getenv("FERRY_WGMMA_STAGES");
    return e != nullptr ? std::atoi(e) : 4;
  }();
  return v;
}

template <int T, int NM>
void launch(const Int8Args& a, dim3 grid, cudaStream_t stream) {
  switch (stages()) {
    case 2: launch_cfg<T, NM, Cfg<2>>(a, grid, stream); break;
    case 3: launch_cfg<T, NM, Cfg<3>>(a, grid, stream); break;
    default: launch_cfg<T, NM, Default>(a, grid, stream); break;
  }
}

template <int NM>
void launch(int t, const Int8Args& a, dim3 grid, cudaStream_t stream) {
  if (t == qd::kQ4_K) {
    launch<qd::kQ4_K, NM>(a, grid, stream);
  } else if (t == qd::kQ5_K) {
    launch<qd::kQ5_K, NM>(a, grid, stream);
  } else {
    launch<qd::kIQ3_S, NM>(a, grid, stream);
  }
}

}  // namespace

bool wgmma_ready(int t, bool up) {
  int dev = 0, major = 0, minor = 0;
  FERRY_CUDA(cudaGetDevice(&dev));
  FERRY_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  FERRY_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  // sm_90a code loads on 9.0 only: no other device is asked about the kernel.
  if (major != 9 || minor != 0) return false;
  return code_built_for(up ? kernel_of<2>(t) : kernel_of<1>(t), 9);
}

void launch_wgmma(int t, bool up, const Int8Args& a, dim3 grid, cudaStream_t stream) {
  if (up) {
    launch<2>(t, a, grid, stream);
  } else {
    launch<1>(t, a, grid, stream);
  }
  FERRY_CUDA_LAUNCHED();
}

}  // namespace ferry::gpu::grouped_int8
