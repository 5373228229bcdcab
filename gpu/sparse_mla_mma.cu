// Sparse MLA of prefill rows over int8 latents on mma.sync (sm80+; gpu/sparse_mla_tc.hpp says what
// and why).
//
// A block: 8 warps, 32 heads of one row (two m16 tiles; a row's last block may have fewer, its other
// query rows zero), the row's selection in tiles of 64 latents. Warp w owns rank columns
// [w R/8, (w+1) R/8): the queries' hi/lo fragments of those columns in registers, the output
// accumulators of those columns for all 32 heads in registers, and the same columns of each tile's
// latents, which it copies itself (cp.async, double-buffered, raw int8) and reads by ldmatrix: no
// block barrier guards the latents. The int8 values are exact in fp16, so a latent needs no lo part:
// its bytes become fp16 in registers (a magic-number conversion), the row scale joins the score and
// the softmax weight in f32. Per tile:
//   scores: warp w's partial scores (32 heads x 64 latents over its columns) into shared memory;
//   softmax: thread i takes head i / 8 and 8 of its latents: the eight partials summed in a fixed
//     order, scaled, the online max and sum (f32) updated over the head's 8 threads, p * scale of
//     the latent split into hi/lo;
//   values: warp w rescales its accumulators and adds weights (32 x 64) x latents (64 x its columns).
// Products: hi * v + lo * (v * 2^-12), one accumulator (v * 2^-12 is exact in fp16 for int8 v).
// Measured on the H200 (gpu/PERF.md, h54): 64 latents a step beat 32 at depth, and the softmax over
// 8 threads a head beat a latent a lane (3 shuffle levels, not 5; one head's state a thread).
//
// Fragment layouts (mma.m16n8k16, lane = 4 g + q): A a[0] (row g, k 2q, 2q+1), a[1] (row g + 8, the
// same k), a[2] (row g, k 2q+8, 2q+9), a[3] (row g + 8, those k); B b[0] (k 2q, 2q+1, column g), b[1]
// (k 2q+8, 2q+9, column g); C c[0], c[1] (row g, columns 2q, 2q+1), c[2], c[3] (row g + 8). A dot
// product does not depend on the order of its k, so the scores take k 2q, 2q+1, 2q+8, 2q+9 as the
// columns 4q..4q+3 that one ldmatrix register of int8 bytes holds (the queries loaded to match); the
// values' ldmatrix.trans register holds two latents x two adjacent columns, so a 16-column group is
// two n8 tiles, of its even and of its odd columns.
#include <cuda_fp16.h>

#include <string>

#include "gpu/cuda_check.hpp"
#include "gpu/half_split.cuh"
#include "gpu/kernels.hpp"
#include "gpu/mma_f16.cuh"
#include "gpu/pdl.hpp"
#include "gpu/sparse_mla_tc.hpp"

namespace ferry::gpu {
namespace {

constexpr uint32_t kHeads = 32;   // heads of a block: two m16 tiles
constexpr uint32_t kTile = 64;    // latents a step
constexpr uint32_t kWarps = 8;
constexpr uint32_t kThreads = kWarps * 32;
constexpr uint32_t kMaxSteps = 4;  // k16 steps of a warp's columns: rank <= 512
constexpr uint32_t kLatPad = 16;   // bytes past each latent row: ldmatrix's 8 rows on distinct banks

constexpr uint32_t kLdp = kTile + 8;  // floats a head's partial scores: float2 stores conflict-free
constexpr uint32_t kLdw = kTile + 8;  // halves a head's weights: ldmatrix rows 16 bytes apart in banks
constexpr uint32_t kSoftmaxLanes = 8;  // threads a head in the softmax
static_assert(kTile % 32 == 0, "ldmatrix takes latents 32 at a time");
static_assert(kHeads * kSoftmaxLanes == kThreads, "the softmax takes every thread");

struct Layout {
  uint32_t ldl;  // bytes a latent row
  size_t lat, partial, w_hi, w_lo, scale, rescale, sum, bytes;
  __host__ __device__ explicit Layout(uint32_t rank) : ldl(rank + kLatPad) {
    lat = 0;                                                           // [2][kTile][ldl] int8
    partial = lat + 2 * size_t{kTile} * ldl;                           // [kWarps][kHeads][kLdp] f32
    w_hi = partial + size_t{kWarps} * kHeads * kLdp * sizeof(float);   // [kHeads][kLdw] fp16
    w_lo = w_hi + size_t{kHeads} * kLdw * sizeof(__half);
    scale = w_lo + size_t{kHeads} * kLdw * sizeof(__half);             // [kTile] f32
    rescale = scale + kTile * sizeof(float);                           // [kHeads] f32
    sum = rescale + kHeads * sizeof(float);                            // [kHeads] f32
    bytes = sum + kHeads * sizeof(float);
  }
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
using mma::bits_half2;
using mma::half2_bits;
using mma::ldsm_x4;
using mma::ldsm_x4_trans;
using mma::smem_address;
using mma::split_pair;

constexpr uint32_t kMagic = 0x64006400u;        // half2 (1024, 1024): byte b in the low bits reads 1024 + b
constexpr uint32_t kMagicOffset = 0x64806480u;  // half2 (1152, 1152) = 1024 + the bias 128
constexpr uint32_t kMagicLo = 0x34003400u;      // half2 (2^-2, 2^-2): b in the low bits reads (1024 + b) 2^-12
constexpr uint32_t kMagicLoOffset = 0x34803480u;  // half2 (1152 2^-12, ...)
constexpr uint32_t kBias = 0x80808080u;         // s8 ^ 0x80 = s8 + 128 as u8

// The two s8 bytes of `raw` that `sel` places in bytes 0 and 2 (a __byte_perm selector over raw and
// the magic, 0x7?5? with the bytes' indices in the ?), as an exact half2, and as that times 2^-12.
__device__ __forceinline__ uint32_t s8_pair(uint32_t biased, uint32_t sel) {
  return half2_bits(__hsub2(bits_half2(__byte_perm(biased, kMagic, sel)), bits_half2(kMagicOffset)));
}
__device__ __forceinline__ uint32_t s8_pair_lo(uint32_t biased, uint32_t sel) {
  return half2_bits(__hsub2(bits_half2(__byte_perm(biased, kMagicLo, sel)), bits_half2(kMagicLoOffset)));
}

// 16 bytes from global memory, or zeros where !valid (nothing read).
__device__ __forceinline__ void copy16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void copy_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void copy_wait_all_but_one() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }

#endif

// S: k16 steps of a warp's columns (rank = 128 S), constant so that the loops unroll into registers.
template <uint32_t S>
__global__ void __launch_bounds__(kThreads, 1) sparse_mla_mma_kernel(SparseMlaArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr uint32_t R = 16 * kWarps * S, kCols = 16 * S, T = kTile;
  const Layout lay(R);
  const uint32_t ldl = lay.ldl;
  // Rows in reverse: a chunk's later rows select more, so the longest blocks start first.
  const uint32_t r = a.rows - 1 - blockIdx.y, h0 = blockIdx.x * kHeads;
  const uint32_t nh = min(kHeads, a.heads - h0);
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const uint32_t col0 = warp * kCols;
  unsigned char* lat = smem + lay.lat;
  float* partial = reinterpret_cast<float*>(smem + lay.partial);
  __half* w_hi = reinterpret_cast<__half*>(smem + lay.w_hi);
  __half* w_lo = reinterpret_cast<__half*>(smem + lay.w_lo);
  float* s_scale = reinterpret_cast<float*>(smem + lay.scale);
  float* s_rescale = reinterpret_cast<float*>(smem + lay.rescale);
  float* s_sum = reinterpret_cast<float*>(smem + lay.sum);

  // The queries' fragments of the warp's columns, k ordered as the int8 scores' B registers.
  uint32_t qh[2][S][4], ql[2][S][4];
  const float* qrow = a.q_lat + (static_cast<size_t>(r) * a.heads + h0) * R;
#pragma unroll
  for (uint32_t mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (uint32_t j = 0; j < S; ++j) {
#pragma unroll
      for (uint32_t half = 0; half < 2; ++half) {
        const uint32_t h = 16 * mt + 8 * half + g;
        const float4 v = h < nh ? __ldg(reinterpret_cast<const float4*>(qrow + h * R + col0 + 16 * j + 4 * q))
                                : make_float4(0.f, 0.f, 0.f, 0.f);
        split_pair(v.x, v.y, qh[mt][j][half], ql[mt][j][half]);
        split_pair(v.z, v.w, qh[mt][j][2 + half], ql[mt][j][2 + half]);
      }
    }
  }
  float o[2][S][2][4];  // [m tile][column group][even, odd columns][C fragment]
#pragma unroll
  for (uint32_t mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (uint32_t G = 0; G < S; ++G) {
#pragma unroll
      for (uint32_t e = 0; e < 2; ++e) {
#pragma unroll
        for (uint32_t k = 0; k < 4; ++k) o[mt][G][e][k] = 0.0f;
      }
    }
  }
  float m_run = -INFINITY, l_run = 0.0f;  // the softmax head's max and sum (the same in its 8 threads)

  const uint32_t cnt = static_cast<uint32_t>(a.counts[r]);
  const int32_t* toks = a.tokens + static_cast<size_t>(r) * a.max_tokens;
  const size_t row0 = static_cast<size_t>(a.row.slot[r]) * a.ctx;
  const int8_t* latents = static_cast<const int8_t*>(a.latents);
  // The warp's columns of tile t0's latents into buffer b: S 16-byte pieces a latent, S T / 32 a lane, at the
  // token ids `ids` holds. The ids are loaded a tile ahead of their copies (load_ids), and the row scales' ids
  // two tiles ahead of the scales, which load a tile ahead of their use: neither load waits on the one before
  // it inside a tile (h54's profile: long-scoreboard stalls on these loads).
  constexpr uint32_t kPieces = S * T / 32;
  int32_t ids[kPieces];
  auto load_ids = [&](uint32_t t0) {
#pragma unroll
    for (uint32_t k = 0; k < kPieces; ++k) {
      const uint32_t t = (lane + 32 * k) / S;
      ids[k] = t0 + t < cnt ? __ldg(toks + t0 + t) : 0;
    }
  };
  auto copy_tile = [&](uint32_t t0, uint32_t b) {
#pragma unroll
    for (uint32_t k = 0; k < kPieces; ++k) {
      const uint32_t c = lane + 32 * k, t = c / S, piece = c % S;
      const bool valid = t0 + t < cnt;
      const int8_t* src = valid ? latents + (row0 + static_cast<size_t>(ids[k])) * R + col0 + 16 * piece : latents;
      copy16(smem_address(lat + (b * T + t) * ldl + col0 + 16 * piece), src, valid);
    }
  };
  load_ids(0);
  if (cnt > 0) copy_tile(0, 0);
  copy_commit();
  load_ids(T);
  // Thread i < T: tile t0's scale of latent i (scale_now), the id of tile t0 + T's (scale_id).
  float scale_now = 0.0f;
  int32_t scale_id = 0;
  if (threadIdx.x < T) {
    scale_now = threadIdx.x < cnt ? __ldg(a.latent_scales + row0 + static_cast<size_t>(__ldg(toks + threadIdx.x))) : 0.0f;
    scale_id = T + threadIdx.x < cnt ? __ldg(toks + T + threadIdx.x) : 0;
  }

  for (uint32_t t0 = 0, it = 0; t0 < cnt; t0 += T, ++it) {
    const uint32_t valid = min(T, cnt - t0);
    if (t0 + T < cnt) copy_tile(t0 + T, (it + 1) & 1);
    copy_commit();
    load_ids(t0 + 2 * T);
    copy_wait_all_but_one();
    __syncwarp();
    // ldmatrix rows: lane l gives latent 32 u + l's row (matrix l / 8, its row l % 8) for the
    // latents [32 u, 32 u + 32), at the warp's columns.
    const uint32_t lat_row = smem_address(lat + ((it & 1) * T + lane) * ldl + col0);

    {  // partial scores: queries (32 x the warp's columns) x latents^T
      float acc[2][T / 8][4] = {};
#pragma unroll
      for (uint32_t j = 0; j < S; ++j) {
#pragma unroll
        for (uint32_t u = 0; u < T / 32; ++u) {
          uint32_t raw[4];  // n tile 4u + i: latents 32u + 8i + g, columns 16 j + 4q..4q+3
          ldsm_x4(raw, lat_row + 32 * u * ldl + 16 * j);
#pragma unroll
          for (uint32_t i = 0; i < 4; ++i) {
            const uint32_t x = raw[i] ^ kBias;
            const uint32_t b0 = s8_pair(x, 0x7150), b1 = s8_pair(x, 0x7352);
            const uint32_t s0 = s8_pair_lo(x, 0x7150), s1 = s8_pair_lo(x, 0x7352);
#pragma unroll
            for (uint32_t mt = 0; mt < 2; ++mt) {
              mma::mma_f16(acc[mt][4 * u + i], qh[mt][j], b0, b1);
              mma::mma_f16(acc[mt][4 * u + i], ql[mt][j], s0, s1);
            }
          }
        }
      }
      float* pw = partial + warp * kHeads * kLdp;
#pragma unroll
      for (uint32_t mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (uint32_t i = 0; i < T / 8; ++i) {
          const uint32_t h = 16 * mt + g, t = 8 * i + 2 * q;
          *reinterpret_cast<float2*>(pw + h * kLdp + t) = make_float2(acc[mt][i][0], acc[mt][i][1]);
          *reinterpret_cast<float2*>(pw + (h + 8) * kLdp + t) = make_float2(acc[mt][i][2], acc[mt][i][3]);
        }
      }
    }
    if (threadIdx.x < T) {
      s_scale[threadIdx.x] = scale_now;
      const uint32_t next = t0 + T + threadIdx.x;
      scale_now = next < cnt ? __ldg(a.latent_scales + row0 + static_cast<size_t>(scale_id)) : 0.0f;
      scale_id = next + T < cnt ? __ldg(toks + next + T) : 0;
    }
    __syncthreads();
    {  // online softmax: head i / 8, its latents [n (i % 8), n (i % 8) + n)
      constexpr uint32_t n = kTile / kSoftmaxLanes;  // latents a thread
      const uint32_t h = threadIdx.x / kSoftmaxLanes, t = n * (threadIdx.x % kSoftmaxLanes);
      float s[n];
#pragma unroll
      for (uint32_t i = 0; i < n; ++i) s[i] = 0.0f;
#pragma unroll
      for (uint32_t w = 0; w < kWarps; ++w) {
#pragma unroll
        for (uint32_t i = 0; i < n; i += 4) {
          const float4 v = *reinterpret_cast<const float4*>(partial + (w * kHeads + h) * kLdp + t + i);
          s[i] += v.x, s[i + 1] += v.y, s[i + 2] += v.z, s[i + 3] += v.w;
        }
      }
      float mx = -INFINITY;
#pragma unroll
      for (uint32_t i = 0; i < n; ++i) {
        s[i] *= a.scale * s_scale[t + i];
        if (t + i < valid) mx = fmaxf(mx, s[i]);
      }
#pragma unroll
      for (int d = 4; d > 0; d /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
      const float m_new = fmaxf(m_run, mx);  // finite: latent 0 of a tile is always in
      float sum = 0.0f;
      __align__(16) __half ph[n], pl[n];
#pragma unroll
      for (uint32_t i = 0; i < n; ++i) {
        const float p = t + i < valid ? expf(s[i] - m_new) : 0.0f;
        sum += p;
        split_half(p * s_scale[t + i], ph[i], pl[i]);
      }
#pragma unroll
      for (int d = 4; d > 0; d /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, d);
      static_assert(n == 8, "a thread's weights are one 16-byte store");
      *reinterpret_cast<uint4*>(w_hi + h * kLdw + t) = *reinterpret_cast<const uint4*>(ph);
      *reinterpret_cast<uint4*>(w_lo + h * kLdw + t) = *reinterpret_cast<const uint4*>(pl);
      const float rescale = expf(m_run - m_new);  // 0 on the first tile (max -inf)
      l_run = l_run * rescale + sum;
      m_run = m_new;
      if (threadIdx.x % kSoftmaxLanes == 0) s_rescale[h] = rescale;
    }
    __syncthreads();
    {  // values: o = o * rescale + weights (32 x 64) x latents (64 x the warp's columns)
#pragma unroll
      for (uint32_t mt = 0; mt < 2; ++mt) {
        const float fa = s_rescale[16 * mt + g], fb = s_rescale[16 * mt + g + 8];
#pragma unroll
        for (uint32_t G = 0; G < S; ++G) {
#pragma unroll
          for (uint32_t e = 0; e < 2; ++e) {
            o[mt][G][e][0] *= fa, o[mt][G][e][1] *= fa, o[mt][G][e][2] *= fb, o[mt][G][e][3] *= fb;
          }
        }
      }
      // A fragments of the weights: matrix i = lane / 8 holds heads + 8 (i & 1), latents + 8 (i >> 1).
      const uint32_t wrow = (lane & 7) + 8 * ((lane >> 3) & 1), wcol = 8 * (lane >> 4);
#pragma unroll
      for (uint32_t u = 0; u < T / 32; ++u) {  // latents [32 u, 32 u + 32): two k16 steps
        uint32_t wh[2][2][4], wl[2][2][4];
#pragma unroll
        for (uint32_t mt = 0; mt < 2; ++mt) {
#pragma unroll
          for (uint32_t kk = 0; kk < 2; ++kk) {
            const uint32_t at = (16 * mt + wrow) * kLdw + 32 * u + 16 * kk + wcol;
            ldsm_x4(wh[mt][kk], smem_address(w_hi + at));
            ldsm_x4(wl[mt][kk], smem_address(w_lo + at));
          }
        }
#pragma unroll
        for (uint32_t G = 0; G < S; ++G) {
          uint32_t raw[4];  // latents 32u + 8i + 2q, + 1 x columns 16 G + 2g, 2g + 1
          ldsm_x4_trans(raw, lat_row + 32 * u * ldl + 16 * G);
#pragma unroll
          for (uint32_t kk = 0; kk < 2; ++kk) {
            const uint32_t x0 = raw[2 * kk] ^ kBias, x1 = raw[2 * kk + 1] ^ kBias;
            const uint32_t e0 = s8_pair(x0, 0x7250), e1 = s8_pair(x1, 0x7250);
            const uint32_t f0 = s8_pair(x0, 0x7351), f1 = s8_pair(x1, 0x7351);
            const uint32_t el0 = s8_pair_lo(x0, 0x7250), el1 = s8_pair_lo(x1, 0x7250);
            const uint32_t fl0 = s8_pair_lo(x0, 0x7351), fl1 = s8_pair_lo(x1, 0x7351);
#pragma unroll
            for (uint32_t mt = 0; mt < 2; ++mt) {
              mma::mma_f16(o[mt][G][0], wh[mt][kk], e0, e1);
              mma::mma_f16(o[mt][G][0], wl[mt][kk], el0, el1);
              mma::mma_f16(o[mt][G][1], wh[mt][kk], f0, f1);
              mma::mma_f16(o[mt][G][1], wl[mt][kk], fl0, fl1);
            }
          }
        }
      }
    }
  }
  if (threadIdx.x % kSoftmaxLanes == 0) s_sum[threadIdx.x / kSoftmaxLanes] = l_run;
  __syncthreads();
  // Head g's columns 16 G + 4q..4q+3 are (even c[0], odd c[0], even c[1], odd c[1]); head g + 8's c[2], c[3].
#pragma unroll
  for (uint32_t mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (uint32_t half = 0; half < 2; ++half) {
      const uint32_t h = 16 * mt + 8 * half + g;
      if (h >= nh) continue;
      const float l = s_sum[h];
      float* dst = a.out + (static_cast<size_t>(r) * a.heads + h0 + h) * R + col0 + 4 * q;
#pragma unroll
      for (uint32_t G = 0; G < S; ++G) {
        const float(&ev)[4] = o[mt][G][0];
        const float(&od)[4] = o[mt][G][1];
        const uint32_t c = 2 * half;
        const float4 v = make_float4(ev[c] / l, od[c] / l, ev[c + 1] / l, od[c + 1] / l);
        *reinterpret_cast<float4*>(dst + 16 * G) = l > 0.0f ? v : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
  }
#else
  (void)a;
  __trap();  // hosts launch this kernel only on sm80+ code (sparse_mla_mma_applies)
#endif
}

using Kernel = void (*)(SparseMlaArgs);

Kernel kernel_for(uint32_t rank) {
  switch (rank / (16 * kWarps)) {
    case 1: return sparse_mla_mma_kernel<1>;
    case 2: return sparse_mla_mma_kernel<2>;
    case 3: return sparse_mla_mma_kernel<3>;
    default: return sparse_mla_mma_kernel<4>;
  }
}
static_assert(kMaxSteps == 4, "one instantiation per k-step count");

}  // namespace

bool sparse_mla_mma_applies(const SparseMlaArgs& a) {
  if (a.latent_type != config::KvType::int8 || a.heads == 0 || a.rank == 0 || a.rank % (16 * kWarps) != 0 ||
      a.rank > 16 * kWarps * kMaxSteps) {
    return false;
  }
  if (!code_built_for(reinterpret_cast<const void*>(kernel_for(a.rank)), 8)) return false;
  const int limit = current_smem_optin();
  return Layout(a.rank).bytes <= static_cast<size_t>(limit);
}

void sparse_mla_mma(const SparseMlaArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  if (!sparse_mla_mma_applies(a)) {
    throw CudaError("sparse MLA on mma.sync: needs int8 latents, rank a multiple of 128 up to 512 and sm80+ code, "
                    "has " + std::string(config::kv_type_name(a.latent_type)) + " rank " + std::to_string(a.rank));
  }
  const Kernel kernel = kernel_for(a.rank);
  const size_t smem = Layout(a.rank).bytes;
  FERRY_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<dim3((a.heads + kHeads - 1) / kHeads, a.rows), kThreads, smem, stream>>>(a);
  FERRY_CUDA_LAUNCHED();
}

}  // namespace ferry::gpu
