// Decode matrix-vector products of Q4_K weights with the activations quantized to int16.
//
// Decoding every 4-bit weight to f32 costs ~4 instructions a weight and reading f32 activations 4
// bytes a weight from L1: both keep the f32 kernel (matvec.cu) far from the memory bandwidth. Here
// each block first quantizes its activations into shared memory (one scale per 32 values, plus the
// exact f32 sum of every 16 values for the Q4_K minimum term), then its warps stream weight rows
// and multiply 2 weights a dp2a instruction with int32 sums. Shared memory holds x in the order
// the weight units read it, 80 bytes a unit (64 of values, 16 of scales and sums), so that eight
// lanes reading eight consecutive units touch every bank once; and each warp requests the next
// row's weights before it multiplies the current ones, so that its loads are always in flight. int8 activations (llama.cpp's q8_1)
// would halve that work, but their rounding (up to amax/254 a value) flips the top token of small
// models against the f32 CPU reference a quarter of the time; int16 rounding (amax/65534) stays at
// the level of f32 summation order. MatvecArgs::f32_activations keeps the f32 kernel.
#include <cuda_runtime.h>

#include <algorithm>

#include "gpu/cuda_check.hpp"
#include "gpu/matvec_int16.hpp"
#include "gpu/quant_device.cuh"

namespace ferry::gpu {
namespace {

constexpr int kWarps = 8;
// Resident blocks per SM the kernels are built for: one token fits 64 registers, more need room.
__host__ __device__ constexpr int blocks_per_sm(uint32_t nt) { return nt == 1 ? 4 : 2; }
constexpr size_t kMaxSmem = 48 * 1024;  // without the opt-in, on every architecture
constexpr uint32_t kQ4KBlockBytes = 144;

// Shared memory of one block: per token, K/32 units of 80 bytes (XUnit values, then XScales).
constexpr uint32_t kUnitBytes = 80;
constexpr size_t smem_bytes(uint32_t nt, uint32_t cols) { return static_cast<size_t>(nt) * (cols / 32) * kUnitBytes; }

uint32_t padded_tokens(uint32_t tokens) { return tokens <= 1 ? 1 : tokens <= 2 ? 2 : tokens <= 4 ? 4 : 8; }


// Lanes that share a row: 32, or 16 / 8 for rows of fewer than 32 / 16 units (a power of two, for
// the butterfly sum).
__host__ __device__ constexpr uint32_t lanes_per_row(uint32_t units) { return units >= 32 ? 32 : units >= 16 ? 16 : 8; }

constexpr int kChunk = 4;  // units in flight per lane

// The activations one unit multiplies: int16 values of columns c0.. c0+15 (a) and c0+32.. c0+47 (b).
struct XUnit {
  int4 a0, a1, b0, b1;
};
// Their two block scales and the f32 sums of those two runs of 16 columns.
struct XScales {
  float d_lo, d_hi, s_lo, s_hi;
};

__device__ __forceinline__ XUnit load_x_unit(const unsigned char* slot) {
  const int4* p = reinterpret_cast<const int4*>(slot);
  return {p[0], p[1], p[2], p[3]};
}
__device__ __forceinline__ XScales load_x_scales(const unsigned char* slot) {
  const float4 f = *reinterpret_cast<const float4*>(slot + 64);
  return {f.x, f.y, f.z, f.w};
}

// 16 columns: int16 pairs of x (two int4) times the 4 weight bytes of each of 4 words.
__device__ __forceinline__ int dot16(const int4& x0, const int4& x1, const int (&w)[4]) {
  int s = __dp2a_lo(x0.x, w[0], 0);
  s = __dp2a_hi(x0.y, w[0], s);
  s = __dp2a_lo(x0.z, w[1], s);
  s = __dp2a_hi(x0.w, w[1], s);
  s = __dp2a_lo(x1.x, w[2], s);
  s = __dp2a_hi(x1.y, w[2], s);
  s = __dp2a_lo(x1.z, w[3], s);
  return __dp2a_hi(x1.w, w[3], s);
}

// Unit u of a Q4_K row: 16 bytes `w` of quants (low nibbles: columns c0.. of sub-block 2c, high
// nibbles: the same 16 of sub-block 2c+1) times x, with the block's scales and minimums.
__device__ __forceinline__ float unit_dot(const uint8_t* blk, uint32_t u, const uint4& w, const XUnit& x,
                                          const XScales& xs) {
  const uint32_t c = (u & 7) >> 1;
  const uint32_t dd = qd::ld_u32(blk);
  int sc1, m1, sc2, m2;
  qd::k4_scale_min(blk + 4, 2 * c, sc1, m1);
  qd::k4_scale_min(blk + 4, 2 * c + 1, sc2, m2);
  const float d = qd::h2f(dd & 0xffff), dmin = qd::h2f(dd >> 16);
  const int lo[4] = {static_cast<int>(w.x & 0x0f0f0f0fu), static_cast<int>(w.y & 0x0f0f0f0fu),
                     static_cast<int>(w.z & 0x0f0f0f0fu), static_cast<int>(w.w & 0x0f0f0f0fu)};
  const int hi[4] = {static_cast<int>((w.x >> 4) & 0x0f0f0f0fu), static_cast<int>((w.y >> 4) & 0x0f0f0f0fu),
                     static_cast<int>((w.z >> 4) & 0x0f0f0f0fu), static_cast<int>((w.w >> 4) & 0x0f0f0f0fu)};
  const int s1 = dot16(x.a0, x.a1, lo), s2 = dot16(x.b0, x.b1, hi);
  return d * static_cast<float>(sc1) * xs.d_lo * static_cast<float>(s1) +
         d * static_cast<float>(sc2) * xs.d_hi * static_cast<float>(s2) - dmin * static_cast<float>(m1) * xs.s_lo -
         dmin * static_cast<float>(m2) * xs.s_hi;
}

template <int NT>
__global__ void __launch_bounds__(kWarps * 32, blocks_per_sm(NT)) q4k_int16_kernel(MatvecArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  const uint32_t K = a.w.cols, units = K / 32, ntok = a.tokens;
  const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t g = blockIdx.y;

  // A row's 16-byte units (32 weights each) are spread over `lpr` lanes; narrow rows share a warp.
  // A warp's work is a list of items: chunks of up to kChunk units per lane, row after row.
  const uint32_t lpr = lanes_per_row(units);
  const uint32_t sub = lane / lpr, sl = lane % lpr, rows_per_warp = 32 / lpr;
  const uint32_t chunks = (units + kChunk * lpr - 1) / (kChunk * lpr);
  const uint32_t first_row = (blockIdx.x * kWarps + warp) * rows_per_warp;
  const uint32_t stride = gridDim.x * kWarps * rows_per_warp;
  const size_t mat = a.w_group_index ? static_cast<size_t>(a.w_group_index[g]) : g;
  const uint8_t* wbase = a.w_group_ptrs ? a.w_group_ptrs[mat] : a.w.data + mat * a.w_group_bytes;
  auto item_row0 = [&](uint32_t it) { return first_row + (it / chunks) * stride; };
  auto load_item = [&](uint32_t it, uint4 (&q)[kChunk]) {
    const uint32_t row = item_row0(it) + sub;
    if (row >= a.w.rows) return;
    const uint8_t* wrow = wbase + static_cast<size_t>(row) * a.w.row_bytes;
    const uint32_t u0 = sl + (it % chunks) * kChunk * lpr;
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      const uint32_t u = u0 + i * lpr;
      if (u < units) {
        q[i] = *reinterpret_cast<const uint4*>(wrow + kQ4KBlockBytes * (u >> 3) + 16 + 32 * ((u & 7) >> 1) + 16 * (u & 1));
      }
    }
  };

  // The first weights are requested before the activations are quantized.
  uint4 q[kChunk];
  load_item(0, q);

  // Each thread quantizes 16 values (half of a 32-value block; its neighbour holds the other half)
  // into one half of one unit's slot: columns 64c + 16h + [0, 16) of a superblock are the low half
  // of unit 2c + h, columns 64c + 32 + 16h + [0, 16) its high half.
  const float* x = a.x + static_cast<size_t>(g / a.x_group_div) * a.x_group_stride;
  const uint32_t pieces = ntok * (K / 16);
  for (uint32_t base = 0; base < pieces; base += blockDim.x) {
    const uint32_t i = base + threadIdx.x;
    const bool valid = i < pieces;
    const uint32_t t = valid ? i / (K / 16) : 0, p = valid ? i % (K / 16) : 0;
    float v[16];
    float amax = 0.0f, sum = 0.0f;
    if (valid) {
      const float4* src = reinterpret_cast<const float4*>(x + t * a.x_tok_stride + 16 * p);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float4 f = src[k];
        v[4 * k] = f.x, v[4 * k + 1] = f.y, v[4 * k + 2] = f.z, v[4 * k + 3] = f.w;
      }
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        amax = fmaxf(amax, fabsf(v[k]));
        sum += v[k];
      }
    }
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    if (valid) {
      const float inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
      uint32_t packed[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        packed[k] = (static_cast<uint32_t>(__float2int_rn(v[2 * k] * inv)) & 0xffffu) |
                    (static_cast<uint32_t>(__float2int_rn(v[2 * k + 1] * inv)) << 16);
      }
      const uint32_t in_sb = p % 16, c = in_sb / 4, high = (in_sb / 2) & 1, h = in_sb & 1;
      const uint32_t unit = 8 * (p / 16) + 2 * c + h;
      unsigned char* slot = smem + (static_cast<size_t>(t) * units + unit) * kUnitBytes;
      uint4* dst = reinterpret_cast<uint4*>(slot + 32 * high);
      dst[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
      dst[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
      float* scales = reinterpret_cast<float*>(slot + 64);
      scales[high] = amax / 32767.0f;
      scales[2 + high] = sum;
    }
  }
  __syncthreads();

  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
  for (uint32_t it = 0; item_row0(it) < a.w.rows; ++it) {
    uint4 next[kChunk];
    load_item(it + 1, next);
    const uint32_t row = item_row0(it) + sub;
    if (row < a.w.rows) {
      const uint8_t* wrow = wbase + static_cast<size_t>(row) * a.w.row_bytes;
      const uint32_t u0 = sl + (it % chunks) * kChunk * lpr;
#pragma unroll
      for (int i = 0; i < kChunk; ++i) {
        const uint32_t u = u0 + i * lpr;
        if (u >= units) break;
        const uint8_t* blk = wrow + kQ4KBlockBytes * (u >> 3);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          if (t < static_cast<int>(ntok)) {
            const unsigned char* slot = smem + (static_cast<size_t>(t) * units + u) * kUnitBytes;
            acc[t] += unit_dot(blk, u, q[i], load_x_unit(slot), load_x_scales(slot));
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kChunk; ++i) q[i] = next[i];
    if (it % chunks != chunks - 1) continue;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      float s = acc[t];
      for (uint32_t o = lpr / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      acc[t] = 0.0f;
      if (row < a.w.rows && sl == 0 && t < static_cast<int>(ntok)) {
        a.y[static_cast<size_t>(g) * a.y_group_stride + row + t * a.y_tok_stride] = s;
      }
    }
  }
}

}  // namespace

bool matvec_quantizes_activations(const MatvecArgs& a) {
  const bool aligned = reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && a.x_tok_stride % 4 == 0 && a.x_group_stride % 4 == 0;
  return !a.f32_activations && a.w.type == model::GgmlType::Q4_K && a.w.cols % 256 == 0 && a.tokens >= 1 &&
         aligned && smem_bytes(padded_tokens(a.tokens), a.w.cols) <= kMaxSmem;
}

void launch_matvec_int16(const MatvecArgs& a, cudaStream_t stream) {
  const uint32_t nt = padded_tokens(a.tokens);
  const size_t smem = smem_bytes(nt, a.w.cols);
  const uint32_t rows_per_block = kWarps * (32 / lanes_per_row(a.w.cols / 32));
  // Enough blocks to fill the device once; each block quantizes its input once and loops over rows.
  const uint32_t wanted = (a.w.rows + rows_per_block - 1) / rows_per_block;
  const uint32_t fill = std::max<uint32_t>(1, static_cast<uint32_t>(current_sm_count() * blocks_per_sm(nt)) / a.groups);
  const dim3 grid(std::min(wanted, fill), a.groups);
  switch (nt) {
    case 1: q4k_int16_kernel<1><<<grid, kWarps * 32, smem, stream>>>(a); break;
    case 2: q4k_int16_kernel<2><<<grid, kWarps * 32, smem, stream>>>(a); break;
    case 4: q4k_int16_kernel<4><<<grid, kWarps * 32, smem, stream>>>(a); break;
    default: q4k_int16_kernel<8><<<grid, kWarps * 32, smem, stream>>>(a); break;
  }
  FERRY_CUDA_LAUNCHED();
}

}  // namespace ferry::gpu
