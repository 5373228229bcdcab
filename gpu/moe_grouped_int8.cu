// The grouped expert GEMMs on int8 tensor cores for Q4_K, Q5_K and IQ3_S weights
// (gpu/moe_grouped_int8.hpp says what and why).
//
// First a pass quantizes the input rows (each once, not once per expert tile that reads it) into
// the split scratch: per row, for each k-tile of 128 columns, 128 high bytes (s8) then 128 low bytes
// (u8) of its int16 values, in column order; and per 32-value block its step and f32 sum.
//
// A block: 8 warps over 128 weight rows (64 each of gate and up, whose SwiGLU is then taken in
// registers) x the 64 sorted rows of a token tile, k-tiles of 128 columns (half a block: 64 bytes
// of nibbles a row, and Q5_K's 32 bytes of fifth bits). Per k-tile the weight rows' nibble bytes
// and the bytes and block factors of the tokens the products read (those of the tile's 8-token tiles
// that hold any) are copied in by cp.async into one of two buffers while
// the tensor cores work on the other, and each weight row's sub-block factors (d * scale; for
// K-quants the min and dmin) are made from its block's 16 leading bytes (IQ3_S: its sub-blocks are decoded to int8 there,
// from the bytes loaded before the products). A warp multiplies 32 weight rows x 32 tokens: per
// 32-column sub-block (one k32 step) 2 x 4 tiles of m16n8k32, each twice (the high and the low
// bytes). The nibbles of a sub-block are one half of 32 consecutive bytes, so each register of A is
// four bytes of the row masked (low or high nibbles; Q5_K ORs in bit j of the fifth-bit bytes of
// the same columns): no decode pass and no permutation. Fragments are read by ldmatrix (one
// instruction for a 16-row A tile, or for an 8-token tile's high and low B bytes), and a warp's
// products of a k-tile are one branch-free stretch of code for its count of 8-token tiles that hold
// tokens, so that the scheduler overlaps loads, MMAs and the f32 terms across tiles and steps. Both
// int32 sums are turned into f32 without
// a conversion instruction (a quarter-rate one on these devices): the MMAs accumulate onto the bits
// of 1.5 * 2^31 and 1.5 * 2^23, so the words read as floats are those constants plus 256 * high and
// low sum, exactly, and two adds give their sum.
#include "gpu/moe_grouped_int8.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "gpu/cuda_check.hpp"
#include "gpu/mma_int8.cuh"
#include "gpu/moe_grouped_int8.cuh"
#include "gpu/pdl.hpp"
#include "gpu/quant_device.cuh"
#include "gpu/x_int16.cuh"
#include "model/formats/ggml_type.hpp"

namespace ferry::gpu {
namespace {

using namespace grouped_int8;

// The constants the int32 sums accumulate onto (as float bits) and the sum of their values.
constexpr int32_t kHiBits = 0x4F400000;  // 1.5 * 2^31: one unit of the bits is 256
constexpr int32_t kLoBits = 0x4B400000;  // 1.5 * 2^23: one unit is 1
constexpr float kMagic = 3221225472.0f + 12582912.0f;

// One thread's 16 values of row r, columns 16p..: their int16 bytes into the row's k-tile, and (the
// even lane of the pair) the block's step and sum.
__global__ void __launch_bounds__(256) quantize_rows_kernel(const float* x, size_t ldx, uint32_t rows, uint32_t cols,
                                                            uint8_t* xq, float2* xf) {
  const uint32_t per_row = cols / 16;
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool valid = i < static_cast<size_t>(rows) * per_row;
  const uint32_t r = valid ? static_cast<uint32_t>(i / per_row) : 0, p = valid ? static_cast<uint32_t>(i % per_row) : 0;
  float v[16];
  float amax = 0.0f, sum = 0.0f;
  if (valid) {
    const float4* src = reinterpret_cast<const float4*>(x + static_cast<size_t>(r) * ldx + 16 * p);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float4 f = src[k];
      v[4 * k] = f.x, v[4 * k + 1] = f.y, v[4 * k + 2] = f.z, v[4 * k + 3] = f.w;
    }
    x16_stats(v, amax, sum);
  }
  amax = x32_amax(amax);  // every lane: the pair (p even, p + 1) is lanes i, i ^ 1 of one row
  const float sum32 = sum + __shfl_xor_sync(0xffffffffu, sum, 1);
  if (!valid) return;
  uint32_t packed[8];
  x16_pack(v, amax, packed);
  uint32_t hi[4], lo[4];
  x16_bytes(packed, hi, lo);
  const uint32_t c = 16 * p;
  uint8_t* dst = xq + static_cast<size_t>(r) * 2 * cols + 2 * (c / BK) * BK + c % BK;
  *reinterpret_cast<uint4*>(dst) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
  *reinterpret_cast<uint4*>(dst + BK) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
  if (p % 2 == 0) xf[static_cast<size_t>(r) * (cols / 32) + p / 2] = make_float2(x32_scale(amax), sum32);
}

// One k-tile's products of a warp with NL live 8-token tiles (k-tile kt, in s) into acc: no branch
// inside, so the fragment loads of the next tiles and steps are scheduled under the products.
// One sub-block's f32 terms of a 16-row x 8-token tile: the exact int32 sum of its high- and low-byte
// products (the high one's magic offset removed) times the row's d * scale and the token's step.
__device__ __forceinline__ void add_terms(float (&acc)[4], const mma::FragC& ch, const mma::FragC& cl,
                                          const float (&dw)[2], float2 dx) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float sum = (__int_as_float(ch.r[k]) - kMagic) + __int_as_float(cl.r[k]);
    acc[k] = fmaf(dw[k / 2] * (k % 2 == 0 ? dx.x : dx.y), sum, acc[k]);
  }
}

template <int T, int NL>
__device__ __forceinline__ void multiply(const Stage<T>& s, uint32_t kt, const WarpTile& t, float (&acc)[2][4][4]) {
  using K = KQuant<T>;
  constexpr int LAG = K::kLag;
  constexpr uint32_t kWWords = K::kWWords;
  const uint32_t g = t.g, q = t.q, lane = threadIdx.x % 32;
  const mma::FragC kHiC{{kHiBits, kHiBits, kHiBits, kHiBits}}, kLoC{{kLoBits, kLoBits, kLoBits, kLoBits}};
  // B: lane l gives token l % 8 of an 8-token tile, at the step's high-byte words (+ 4 for odd l / 8)
  // and its low-byte words (+ 32 for l / 16 = 1): registers 0, 1 the high bytes' fragment, 2, 3 the low.
  const uint32_t* xrow = &s.x[(t.token(0) + lane % 8) * kXWords + 4 * (lane / 8 % 2) + 32 * (lane / 16)];
  uint32_t high[2][4];
  if constexpr (K::kHighBits) {  // the fifth bits of the k-tile's columns: words 16 + q and 20 + q
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      load_a<kWWords>(high[i], &s.w[t.lrb[i] * kWWords], 16);
      // Sub-block step's bit to bit `step` of each byte (an odd k-tile's sub-blocks are bits 4..7;
      // what the shift brings in from the next byte lands above bit 3, where no step reads).
#pragma unroll
      for (int k = 0; k < 4; ++k) high[i][k] >>= 4 * (kt % 2);
    }
  }
#pragma unroll
  for (uint32_t c = 0; c < kSteps / 2; ++c) {  // the sub-blocks of 64 columns share their bytes
    uint32_t raw[2][4];
#pragma unroll
    for (int i = 0; i < 2 && !K::kDecoded; ++i) load_a<kWWords>(raw[i], &s.w[t.lrb[i] * kWWords], 8 * c);
#pragma unroll
    for (uint32_t h = 0; h < 2; ++h) {
      const uint32_t step = 2 * c + h;
      mma::FragA A[2];
      float dw[2][2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if constexpr (K::kDecoded) {  // int8 values in column order: words 8 * step + q and + 4
          load_a<kWWords>(A[i].r, &s.w[t.lrb[i] * kWWords], 8 * step);
        } else {
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            if constexpr (K::kHighBits) {
              A[i].r[k] = ((raw[i][k] >> (4 * h)) & 0x0f0f0f0fu) | ((high[i][k] << (4 - step)) & 0x10101010u);
            } else {  // Q4_K's high nibbles as they lie: 16 times their value (store_factors' 1/16)
              A[i].r[k] = raw[i][k] & (h == 0 ? 0x0f0f0f0fu : 0xf0f0f0f0u);
            }
          }
        }
        dw[i][0] = s.wf[step][t.lrb[i] + g].x;
        dw[i][1] = s.wf[step][t.lrb[i] + g + 8].x;
      }
#pragma unroll
      for (int n = 0; n < NL && LAG == 0; ++n) {  // no lag: each tile's terms right after its MMAs
        uint32_t b[4];
        mma::ldmatrix_x4(b, xrow + 16 * n * kXWords + 8 * step);
        const mma::FragB bh{{b[0], b[1]}}, bl{{b[2], b[3]}};
        const float2 dx = *reinterpret_cast<const float2*>(&s.xd[step][t.token(n) + 2 * q]);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          mma::FragC ch, cl;
          mma::mma_k32<K::kDecoded, true>(ch, A[i], bh, kHiC);  // IQ3_S's values are signed, the nibbles not
          mma::mma_k32<K::kDecoded, false>(cl, A[i], bl, kLoC);
          add_terms(acc[i][n], ch, cl, dw[i], dx);
        }
      }
      // Tile n's MMAs are issued before the f32 terms of tile n - LAG, so that more of them are in
      // flight before their sums are read (the same operations on each output, in the same order).
      mma::FragC ch[LAG + 1][2], cl[LAG + 1][2];
      float2 dx[LAG + 1];
#pragma unroll
      for (int n = 0; n < NL + LAG && LAG > 0; ++n) {
        if (n < NL) {
          uint32_t b[4];
          mma::ldmatrix_x4(b, xrow + 16 * n * kXWords + 8 * step);
          const mma::FragB bh{{b[0], b[1]}}, bl{{b[2], b[3]}};
          dx[n % (LAG + 1)] = *reinterpret_cast<const float2*>(&s.xd[step][t.token(n) + 2 * q]);
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            // IQ3_S's values are signed, the nibbles not
            mma::mma_k32<K::kDecoded, true>(ch[n % (LAG + 1)][i], A[i], bh, kHiC);
            mma::mma_k32<K::kDecoded, false>(cl[n % (LAG + 1)][i], A[i], bl, kLoC);
          }
        }
        if (n >= LAG) {
          const int m = n - LAG, c = m % (LAG + 1);
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            add_terms(acc[i][m], ch[c][i], cl[c][i], dw[i], dx[c]);
          }
        }
      }
    }
  }
  if constexpr (!K::kDecoded) minimum_terms<NL>(s, t, acc);
}

// multiply for the warp's live tiles (warp-uniform; a warp without tokens has no products).
template <int T>
__device__ __forceinline__ void multiply_live(const Stage<T>& s, uint32_t kt, const WarpTile& t,
                                              float (&acc)[2][4][4]) {
  switch (t.live) {
    case 4: multiply<T, 4>(s, kt, t, acc); break;
    case 3: multiply<T, 3>(s, kt, t, acc); break;
    case 2: multiply<T, 2>(s, kt, t, acc); break;
    case 1: multiply<T, 1>(s, kt, t, acc); break;
    default: break;
  }
}

template <int T, int NM>
__global__ void __launch_bounds__(kThreads, 2) kquant_int8_kernel(Int8Args a) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ uint32_t grid[KQuant<T>::kDecoded ? 512 : 1];
  Stage<T>* st = reinterpret_cast<Stage<T>*>(smem);
  __shared__ uint32_t tile_of[3];
  const uint32_t tile = blockIdx.y;
  if (tile >= a.tiles[a.E]) return;  // the grid is sized for the most tiles the routes can make
  find_tile(a, tile, tile_of);
  if constexpr (KQuant<T>::kDecoded) {
    for (uint32_t i = threadIdx.x; i < 512; i += kThreads) grid[i] = a.iq3s_grid[i];
  }
  __syncthreads();  // the tile, and the grid before the first decode
  BlockTile bt;
  bt.e = tile_of[0];
  bt.first = tile_of[1];
  bt.ntok = tile_of[2];
  bt.m0 = blockIdx.x * (BR / NM);
  TileLoader<T, NM> ld(a, bt);
  const WarpTile wt = warp_tile<NM>(bt.ntok);
  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int n = 0; n < 4; ++n) {
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[i][n][k] = 0.0f;
    }
  }

  // k-tile kt's copies and factors are in buffer kt % 2. One barrier a k-tile: after it, kt's copies
  // (waited for) and factors (stored before it) are seen by every warp, and every warp is done with
  // k-tile kt - 1's buffer, into which kt + 1's copies are then issued (and, where kt + 1 starts a
  // K-quant block, its header loaded; the block's two k-tiles share it) before kt's products; kt +
  // 1's factors are stored at the top of the next iteration.
  const uint32_t ktiles = a.cols / BK;
  ld.load_headers(0);
  ld.issue(a, 0, st[0]);
  for (uint32_t kt = 0; kt < ktiles; ++kt) {
    const uint32_t b = kt % 2;
    ld.store_factors(kt, st[b], grid);
    cp_wait<0>();
    __syncthreads();
    if (kt + 1 < ktiles) {
      ld.issue(a, kt + 1, st[1 - b]);
      if (KQuant<T>::kDecoded || (kt + 1) % 2 == 0) ld.load_headers(kt + 1);
    }
    multiply_live<T>(st[b], kt, wt, acc);
  }
  store_outputs<NM>(a, bt, wt, acc);
}

// The kernel's type id for weights of `type`, or -1 where it has none.
int int8_type(model::GgmlType type) {
  switch (type) {
    case model::GgmlType::Q4_K: return qd::kQ4_K;
    case model::GgmlType::Q5_K: return qd::kQ5_K;
    case model::GgmlType::IQ3_S: return qd::kIQ3_S;
    default: return -1;
  }
}

template <int NM>
const void* kernel_of(int t) {
  return t == qd::kQ4_K   ? reinterpret_cast<const void*>(kquant_int8_kernel<qd::kQ4_K, NM>)
         : t == qd::kQ5_K ? reinterpret_cast<const void*>(kquant_int8_kernel<qd::kQ5_K, NM>)
                          : reinterpret_cast<const void*>(kquant_int8_kernel<qd::kIQ3_S, NM>);
}
const void* kernel_of(int t, bool up) { return up ? kernel_of<2>(t) : kernel_of<1>(t); }

bool same_layout(const DevMatrix& a, const DevMatrix& b) {
  return a.type == b.type && a.rows == b.rows && a.cols == b.cols && a.row_bytes == b.row_bytes;
}

// Where the quantized rows go in the split scratch: the bytes in hi, the block factors in lo from
// its first 16-byte boundary; null where they do not fit.
struct QuantScratch {
  uint8_t* q = nullptr;
  float2* f = nullptr;
};
QuantScratch quant_scratch(const SplitScratch& split, uint32_t rows, uint32_t cols) {
  if (split.hi == nullptr || split.lo == nullptr || reinterpret_cast<uintptr_t>(split.hi) % 16 != 0) return {};
  const size_t part = split.elems * 2;  // bytes of each part
  const uintptr_t lo = reinterpret_cast<uintptr_t>(split.lo), lo16 = (lo + 15) / 16 * 16;
  const size_t need_q = size_t{rows} * cols * 2, need_f = size_t{rows} * (cols / 32) * sizeof(float2);
  if (need_q > part || lo16 - lo + need_f > part) return {};
  return {static_cast<uint8_t*>(split.hi), reinterpret_cast<float2*>(lo16)};
}

}  // namespace

bool grouped_int8_takes(const ExpertMatrices& w, const ExpertMatrices* up, const float* x, size_t ldx,
                        uint32_t x_rows, const SplitScratch& split) {
  const int t = int8_type(w.m.type);
  if (t < 0 || w.m.cols == 0 || w.m.cols % 256 != 0) return false;
  const uint32_t block = t == qd::kQ4_K   ? KQuant<qd::kQ4_K>::kBlockBytes
                         : t == qd::kQ5_K ? KQuant<qd::kQ5_K>::kBlockBytes
                                          : KQuant<qd::kIQ3_S>::kBlockBytes;
  if (w.m.row_bytes != size_t{w.m.cols} / 256 * block) return false;
  if (up != nullptr && !same_layout(w.m, up->m)) return false;
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || ldx % 4 != 0 || ldx < w.m.cols) return false;
  if (quant_scratch(split, x_rows, w.m.cols).q == nullptr) return false;
  return code_built_for(kernel_of(t, up != nullptr), 8);
}

namespace {

template <int T, int NM>
void launch(const Int8Args& a, dim3 grid, cudaStream_t stream) {
  constexpr size_t smem = 2 * sizeof(Stage<T>);
  FERRY_CUDA(cudaFuncSetAttribute(kquant_int8_kernel<T, NM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)));
  kquant_int8_kernel<T, NM><<<grid, kThreads, smem, stream>>>(a);
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

void grouped_gemm_int8(const ExpertMatrices& w, const ExpertMatrices* up, const float* x, size_t ldx, uint32_t x_rows,
                       const int32_t* gather, const RouteSort& sort, uint32_t routes, uint32_t E, float limit, float* y,
                       size_t ldy, const SplitScratch& split, cudaStream_t stream, Int8Kernel kernel) {
  if (routes == 0 || w.m.rows == 0 || x_rows == 0) return;
  if (!grouped_int8_takes(w, up, x, ldx, x_rows, split)) {
    throw CudaError("grouped_gemm_int8: not an int8 call (Q4_K / Q5_K / IQ3_S rows of whole blocks, gate and up "
                    "alike, aligned input, a scratch for " + std::to_string(x_rows) + " x " +
                    std::to_string(w.m.cols) + " values, sm80+ code)");
  }
  if (gather == nullptr && x_rows < routes) {
    throw CudaError("grouped_gemm_int8: " + std::to_string(routes) + " routes read rows of an input of " +
                    std::to_string(x_rows));
  }
  if (w.table == nullptr && w.m.data == nullptr) throw CudaError("grouped_gemm_int8: no expert weights");
  const uint32_t cols = w.m.cols;
  const QuantScratch qs = quant_scratch(split, x_rows, cols);
  const size_t pieces = size_t{x_rows} * (cols / 16);
  if ((pieces + 255) / 256 > 0x7fffffffu) throw CudaError("grouped_gemm_int8: too many input rows");
  quantize_rows_kernel<<<static_cast<unsigned>((pieces + 255) / 256), 256, 0, stream>>>(x, ldx, x_rows, cols, qs.q,
                                                                                       qs.f);
  FERRY_CUDA_LAUNCHED();

  Int8Args a{};
  a.base[0] = w.m.data;
  a.stride[0] = w.stride;
  a.table[0] = w.table;
  if (up != nullptr) {
    a.base[1] = up->m.data;
    a.stride[1] = up->stride;
    a.table[1] = up->table;
  }
  a.rows = w.m.rows;
  a.cols = cols;
  a.row_bytes = w.m.row_bytes;
  a.xq = qs.q;
  a.xf = qs.f;
  a.gather = gather;
  a.offsets = sort.offsets;
  a.tiles = sort.tiles;
  a.E = E;
  a.y = y;
  a.ldy = ldy;
  a.limit = limit;
  // Each expert with c rows makes ceil(c / BN) tiles: at most routes / BN + one per used expert.
  const size_t max_tiles = (size_t{routes} + BN - 1) / BN + std::min(E, routes);
  const uint32_t rm = up != nullptr ? BR / 2 : BR;
  const size_t row_tiles = (size_t{w.m.rows} + rm - 1) / rm;
  if (max_tiles > 65535 || row_tiles > 0x7fffffffu) {
    throw CudaError("grouped_gemm_int8: " + std::to_string(routes) + " routes over " + std::to_string(w.m.rows) +
                    " rows make too large a grid");
  }
  const dim3 grid(static_cast<uint32_t>(row_tiles), static_cast<uint32_t>(max_tiles));
  const int t = int8_type(w.m.type);
  if (t == qd::kIQ3_S) a.iq3s_grid = iq3s_grid_address();
  // Temporary A/B switch for the device checks: FERRY_INT8_WGMMA=0 keeps mma.sync.
  static const bool wgmma_off = [] {
    const char* e = std::getenv("FERRY_INT8_WGMMA");
    return e != nullptr && e[0] == '0';
  }();
  if (kernel == Int8Kernel::best && !wgmma_off && wgmma_ready(t, up != nullptr)) {
    launch_wgmma(t, up != nullptr, a, grid, stream);
    return;
  }
  if (up != nullptr) {
    launch<2>(t, a, grid, stream);
  } else {
    launch<1>(t, a, grid, stream);
  }
  FERRY_CUDA_LAUNCHED();
}

bool grouped_wgmma_ready(const ExpertMatrices& w, bool up) {
  const int t = int8_type(w.m.type);
  return t >= 0 && wgmma_ready(t, up);
}

}  // namespace ferry::gpu
