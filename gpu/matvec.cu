// Matrix-vector products over GGUF blocks (decode) and block dequantisation to fp16 (prefill GEMM).
// One warp per output row: its lanes walk the row's units (16-byte loads of quants, coalesced across
// the warp), decode them to f32 and multiply by up to 8 tokens' activations read as float4.
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <type_traits>

#include "gpu/block_reduce.cuh"
#include "gpu/cuda_check.hpp"
#include "gpu/kernels.hpp"
#include "gpu/matvec_int16.hpp"
#include "gpu/matvec_part.cuh"
#include "gpu/half_split.cuh"
#include "gpu/matvec_wide.hpp"
#include "gpu/quant_device.cuh"
#include "model/formats/iq_grids.hpp"

namespace ferry::gpu {
namespace qd {
__device__ uint32_t g_iq3s_grid[512];
__device__ int8_t g_iq4nl_values[16];
}  // namespace qd

namespace {

constexpr int kWarps = 8;

template <int T>
constexpr bool kUsesIq = T == qd::kIQ3_S || T == qd::kIQ4_XS;

template <int T>
__device__ __forceinline__ void load_tables(uint32_t* grid, int8_t* kvalues) {
  if constexpr (T == qd::kIQ3_S) {
    for (int i = threadIdx.x; i < 512; i += blockDim.x) grid[i] = qd::g_iq3s_grid[i];
  }
  if constexpr (T == qd::kIQ4_XS) {
    if (threadIdx.x < 16) kvalues[threadIdx.x] = qd::g_iq4nl_values[threadIdx.x];
  }
  if constexpr (kUsesIq<T>) __syncthreads();
}

// Lanes that share a row: a whole warp, or for rows of fewer than 32 units the next power of two.
__host__ __device__ inline uint32_t lanes_per_row(uint32_t units) {
  uint32_t l = 1;
  while (l < units && l < 32) l <<= 1;
  return l;
}

// WPR warps share a row (split over its units) when a matrix has too few rows to fill the device;
// with WPR 1, narrow rows put 32 / lanes_per_row rows in each warp.
template <int T, int NT, int WPR>
__global__ void __launch_bounds__(kWarps * 32) matvec_kernel(MatvecArgs a) {
  using Tr = qd::Traits<T>;
  __shared__ uint32_t grid[kUsesIq<T> ? 512 : 1];
  __shared__ int8_t kvalues[16];
  __shared__ float partial[WPR > 1 ? kWarps : 1][NT];
  load_tables<T>(grid, kvalues);

  const uint32_t units_all = a.w.cols / Tr::UE;
  const uint32_t lpr = WPR > 1 ? 32 : lanes_per_row(units_all);
  const uint32_t lane_all = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t lane = lane_all % lpr;
  const uint32_t part = warp % WPR;
  const uint32_t row = WPR > 1 ? blockIdx.x * (kWarps / WPR) + warp / WPR
                               : (blockIdx.x * kWarps + warp) * (32 / lpr) + lane_all / lpr;
  const uint32_t g = blockIdx.y;
  const MatvecPartView view = matvec_part_view(a, g);
  const bool live = row < view.rows;
  if (WPR == 1 && (blockIdx.x * kWarps + warp) * (32 / lpr) >= view.rows) return;
  const uint8_t* wrow = view.w + static_cast<size_t>(live ? row : 0) * a.w.row_bytes;
  const float* x = view.x;
  const uint32_t ntok = a.tokens;

  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;

  const uint32_t units = live ? units_all : 0;
#pragma unroll 2
  for (uint32_t u = part * lpr + lane; u < units; u += lpr * WPR) {
    float v[Tr::UE];
    qd::decode_unit<T>(wrow, u, v, grid, kvalues);
#pragma unroll
    for (int r = 0; r < Tr::RUNS; ++r) {
      const uint32_t c0 = qd::run_col<T>(u, r);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (t < static_cast<int>(ntok)) {
          const float* xt = x + t * a.x_tok_stride + c0;
          if constexpr (Tr::RL == 1) {
            acc[t] += v[r] * __ldg(xt);
          } else {
#pragma unroll
            for (int i = 0; i < Tr::RL / 4; ++i) {
              const float4 xv = __ldg(reinterpret_cast<const float4*>(xt) + i);
              const float* vv = v + r * Tr::RL + 4 * i;
              acc[t] += vv[0] * xv.x + vv[1] * xv.y + vv[2] * xv.z + vv[3] * xv.w;
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    float s = acc[t];
    for (uint32_t o = lpr / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    acc[t] = s;
  }
  if constexpr (WPR > 1) {
    if (lane == 0) {
#pragma unroll
      for (int t = 0; t < NT; ++t) partial[warp][t] = acc[t];
    }
    __syncthreads();
    if (part != 0 || !live) return;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      float s = 0.0f;
      for (int p = 0; p < WPR; ++p) s += partial[warp + p][t];
      acc[t] = s;
    }
  }
  if (lane == 0 && live) {
    float* y = view.y + static_cast<size_t>(g) * a.y_group_stride + row;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t < static_cast<int>(ntok)) y[t * view.y_tok_stride] = acc[t];
    }
  }
}

// A run of RL consecutive outputs of one unit. With kVec (16-byte aligned outputs), 16-byte stores:
// a warp's store then fills whole sectors, where element-wise stores write 2 bytes a lane at a
// lane stride of a run (32 sectors an instruction). The same values either way.
template <int RL, bool kVec>
__device__ __forceinline__ void store_run(const float* v, __half* hi_out, __half* lo_out) {
  if constexpr (kVec && RL % 8 == 0) {
#pragma unroll
    for (int g = 0; g < RL / 8; ++g) {
      uint4 hw, lw;
      split8(v + 8 * g, hw, lw);
      reinterpret_cast<uint4*>(hi_out)[g] = hw;
      if (lo_out) reinterpret_cast<uint4*>(lo_out)[g] = lw;
    }
  } else {
#pragma unroll
    for (int k = 0; k < RL; ++k) {
      __half hi, lo;
      split_half(v[k], hi, lo);
      hi_out[k] = hi;
      if (lo_out) lo_out[k] = lo;
    }
  }
}
template <int RL, bool kVec>
__device__ __forceinline__ void store_run(const float* v, float* out, __half*) {
  if constexpr (kVec && RL % 4 == 0) {
#pragma unroll
    for (int g = 0; g < RL / 4; ++g) {
      reinterpret_cast<float4*>(out)[g] = make_float4(v[4 * g], v[4 * g + 1], v[4 * g + 2], v[4 * g + 3]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < RL; ++k) out[k] = v[k];
  }
}

// The prefill conversions below: 32-bit index math (the host splits launches so that a launch's
// outputs, at their row stride, stay below 2^31), blocks of 256 threads over a grid-stride walk.
constexpr int kConvertThreads = 256;

// Units [0, total) of rows of `upr` units (flat), one a thread; output rows `ld` apart.
template <int T, class OutT, bool kVec>
__global__ void __launch_bounds__(kConvertThreads)
    dequant_flat_kernel(const uint8_t* __restrict__ data, size_t row_bytes, uint32_t upr, uint32_t total, OutT* dst,
                        __half* dst_lo, uint32_t ld) {
  using Tr = qd::Traits<T>;
  __shared__ uint32_t grid[kUsesIq<T> ? 512 : 1];
  __shared__ int8_t kvalues[16];
  load_tables<T>(grid, kvalues);
  for (uint32_t i = blockIdx.x * kConvertThreads + threadIdx.x; i < total; i += gridDim.x * kConvertThreads) {
    const uint32_t r = i / upr, u = i - r * upr;
    float v[Tr::UE];
    qd::decode_unit<T>(data + r * row_bytes, u, v, grid, kvalues);
#pragma unroll
    for (int run = 0; run < Tr::RUNS; ++run) {
      const uint32_t c = r * ld + qd::run_col<T>(u, run);
      store_run<Tr::RL, kVec>(v + run * Tr::RL, dst + c, dst_lo ? dst_lo + c : nullptr);
    }
  }
}

// As dequant_flat_kernel for 16-byte aligned fp16 outputs, through shared memory: a warp's 32
// consecutive units cover 32 * UE consecutive values of the rows laid end to end (units in block
// order), which it writes as consecutive 16-byte words (split where the rows are `ld` apart), hi then
// lo. Element-wise 16-byte stores reach ~34% of the copy bandwidth here, these ~46% (gpu/PERF.md, h74).
template <int T>
__global__ void __launch_bounds__(kConvertThreads)
    dequant_staged_kernel(const uint8_t* __restrict__ data, size_t row_bytes, uint32_t upr, uint32_t total,
                          __half* dst, __half* dst_lo, uint32_t ld) {
  using Tr = qd::Traits<T>;
  constexpr uint32_t kSpan = 32 * Tr::UE;
  __shared__ uint32_t grid[kUsesIq<T> ? 512 : 1];
  __shared__ int8_t kvalues[16];
  __shared__ __align__(16) __half stage[kConvertThreads / 32][kSpan];
  load_tables<T>(grid, kvalues);
  const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __half* mine = stage[warp];
  const uint32_t cols = upr * Tr::UE;
  const uint32_t step = gridDim.x * kConvertThreads;
  for (uint32_t w0 = blockIdx.x * kConvertThreads + warp * 32; w0 < total; w0 += step) {
    const uint32_t i = w0 + lane;
    const bool live = i < total;
    const uint32_t r = live ? i / upr : 0, u = live ? i - r * upr : 0;
    constexpr int kWords = Tr::UE / 8;  // run r's g-th 8 values: word r * RL / 8 + g
    uint4 hw[kWords], lw[kWords];
    if (live) {
      float v[Tr::UE];
      qd::decode_unit<T>(data + r * row_bytes, u, v, grid, kvalues);
#pragma unroll
      for (int k = 0; k < kWords; ++k) split8(v + 8 * k, hw[k], lw[k]);
    }
    const uint32_t local0 = r * cols - w0 * Tr::UE;
    const uint32_t span = (total - w0 < 32 ? total - w0 : 32) * Tr::UE;
    auto put = [&](const uint4* words, __half* out) {
      if (live) {
#pragma unroll
        for (int run = 0; run < Tr::RUNS; ++run) {
          uint4* at = reinterpret_cast<uint4*>(mine + local0 + qd::run_col<T>(u, run));
#pragma unroll
          for (int g = 0; g < Tr::RL / 8; ++g) at[g] = words[run * (Tr::RL / 8) + g];
        }
      }
      __syncwarp();
      for (uint32_t k = lane * 8; k < span; k += 256) {
        const uint32_t flat = w0 * Tr::UE + k;
        const uint32_t row = ld == cols ? 0 : flat / cols;
        *reinterpret_cast<uint4*>(out + flat + row * (ld - cols)) = *reinterpret_cast<const uint4*>(mine + k);
      }
      __syncwarp();
    };
    put(hw, dst);
    if (dst_lo) put(lw, dst_lo);
  }
}

// n / d for n < 2^31 as one 64-bit multiply and shift: with l = ceil(log2 d), m = ceil(2^(31+l) / d) fits in
// 32 bits and floor(n m / 2^(31+l)) = floor(n / d) (Granlund and Montgomery; the error term is below 2^-l <= 1/d).
struct RowDiv {
  uint64_t mul = 1;
  uint32_t shift = 0;
  explicit RowDiv(uint32_t d) {
    uint32_t l = 0;
    while ((uint64_t{1} << l) < d) ++l;
    shift = 31 + l;
    mul = ((uint64_t{1} << shift) + d - 1) / d;
  }
  __device__ __forceinline__ uint32_t of(uint32_t n) const { return static_cast<uint32_t>((n * mul) >> shift); }
};

// Pieces [0, total) of rows of `ppr` pieces laid end to end (qd::Piece: 8 consecutive values each), one a
// thread, each split into one 16-byte word of hi and one of lo: a warp's words are 512 consecutive bytes of
// each, and a thread's work is a float_to_half vector's (decode 8 values, split, two stores), where
// dequant_staged_kernel's thread decodes 32 to 64 values and stages them (~45% of the copy bandwidth).
// Output rows `ld` apart; the blocks of the rows are contiguous.
// kOut, for the e4m3 corrections (LayerRunner::mm_staged): kAmax writes nothing but the largest |value| into
// *amax (as f32 bits); kE4m3 the fp16 hi values into each row's first half (ld = 2 x 8 ppr), and in its second
// half the e4m3 values, then the e4m3 lo parts, both times e4m3_scale(*amax) (whose inverse goes to *descale).
enum PieceOut : int { kSplit16, kAmax, kE4m3 };
template <int T, int kOut = kSplit16>
__global__ void __launch_bounds__(kConvertThreads)
    dequant_pieces_kernel(const uint8_t* __restrict__ data, uint32_t total, uint32_t ppr, RowDiv rows, __half* dst,
                          __half* dst_lo, uint32_t ld, uint32_t* amax = nullptr, float* descale = nullptr) {
  using P = qd::Piece<T>;
  constexpr uint32_t kPieces = P::QK / 8;
  const uint32_t gap = ld - 8 * ppr;
  if constexpr (kOut == kSplit16) {
    for (uint32_t i = blockIdx.x * kConvertThreads + threadIdx.x; i < total; i += gridDim.x * kConvertThreads) {
      float v[8];
      qd::decode_piece<T>(data + static_cast<size_t>(i / kPieces) * P::BB, i % kPieces, v);
      uint4 hw, lw;
      split8(v, hw, lw);
      const uint32_t at = 8 * i + (gap != 0 ? rows.of(i) * gap : 0);
      *reinterpret_cast<uint4*>(dst + at) = hw;
      if (dst_lo) *reinterpret_cast<uint4*>(dst_lo + at) = lw;
    }
  } else if constexpr (kOut == kAmax) {
    float m = 0.0f;
    for (uint32_t i = blockIdx.x * kConvertThreads + threadIdx.x; i < total; i += gridDim.x * kConvertThreads) {
      float v[8];
      qd::decode_piece<T>(data + static_cast<size_t>(i / kPieces) * P::BB, i % kPieces, v);
#pragma unroll
      for (int k = 0; k < 8; ++k) m = fmaxf(m, fabsf(v[k]));
    }
    __shared__ float scratch[32];
    m = block_max(m, scratch);  // one atomic a block: on one word they serialise
    if (threadIdx.x == 0) atomicMax(amax, __float_as_uint(m));
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    const float s = e4m3_scale(*amax);
    if (blockIdx.x == 0 && threadIdx.x == 0) *descale = 1.0f / s;
    for (uint32_t i = blockIdx.x * kConvertThreads + threadIdx.x; i < total; i += gridDim.x * kConvertThreads) {
      float v[8], lo[8];
      qd::decode_piece<T>(data + static_cast<size_t>(i / kPieces) * P::BB, i % kPieces, v);
      uint32_t hw[4];  // split8's hi values
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const __half2 h = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
        const float2 back = __half22float2(h);
        lo[2 * k] = half_lo_part(v[2 * k], back.x);
        lo[2 * k + 1] = half_lo_part(v[2 * k + 1], back.y);
        hw[k] = *reinterpret_cast<const uint32_t*>(&h);
      }
      const uint32_t r = rows.of(i), c = 8 * (i - r * ppr);
      __half* row = dst + r * ld;
      *reinterpret_cast<uint4*>(row + c) = make_uint4(hw[0], hw[1], hw[2], hw[3]);
      uint8_t* fp8 = reinterpret_cast<uint8_t*>(row + 8 * ppr);
      *reinterpret_cast<uint2*>(fp8 + c) = e4m3x8(v, s);
      *reinterpret_cast<uint2*>(fp8 + 8 * ppr + c) = e4m3x8(lo, s);
    }
#else
    (void)descale;
    __trap();  // launched only where it was built for sm89+ (e4m3_split_ready)
#endif
  }
}

// A row's units to `copies` copies of it; kVec: 16-byte aligned copies, each run stored as float4s (a
// prefill chunk writes 4 x 2,048 rows: scalar stores a run apart bound it).
template <int T, bool kVec>
__global__ void embed_kernel(const uint8_t* data, size_t row_bytes, uint32_t cols, const int32_t* tokens,
                             uint32_t rows, float* dst, uint32_t copies) {
  using Tr = qd::Traits<T>;
  __shared__ uint32_t grid[kUsesIq<T> ? 512 : 1];
  __shared__ int8_t kvalues[16];
  load_tables<T>(grid, kvalues);
  const uint32_t units = cols / Tr::UE;
  const size_t total = static_cast<size_t>(rows) * units;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t r = i / units;
    const uint32_t u = static_cast<uint32_t>(i % units);
    float v[Tr::UE];
    qd::decode_unit<T>(data + static_cast<size_t>(tokens[r]) * row_bytes, u, v, grid, kvalues);
    for (uint32_t c = 0; c < copies; ++c) {
      float* out = dst + (r * copies + c) * cols;
#pragma unroll
      for (int run = 0; run < Tr::RUNS; ++run) {
        store_run<Tr::RL, kVec>(v + run * Tr::RL, out + qd::run_col<T>(u, run), static_cast<__half*>(nullptr));
      }
    }
  }
}

// Output rows of `vpr` vectors of 8 values, flat, one vector a thread: two float4 loads, two 16-byte stores
// (hi, lo); output rows `ld` apart. Output row r is group r % groups of source row r / groups, at src +
// (r / groups) * src_stride + (r % groups) * group_stride (float_to_half_groups; one group: float_to_half).
__global__ void __launch_bounds__(kConvertThreads)
    float_to_half_vec_kernel(const float* __restrict__ src, size_t src_stride, size_t group_stride, RowDiv groups,
                             uint32_t group_count, uint32_t vpr, uint32_t total, __half* dst, __half* dst_lo,
                             uint32_t ld) {
  for (uint32_t i = blockIdx.x * kConvertThreads + threadIdx.x; i < total; i += gridDim.x * kConvertThreads) {
    const uint32_t r = i / vpr, c = (i - r * vpr) * 8;
    const uint32_t sr = groups.of(r), g = r - sr * group_count;
    const float4* p = reinterpret_cast<const float4*>(src + sr * src_stride + g * group_stride + c);
    const float4 a = __ldg(p), b = __ldg(p + 1);
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    uint4 hw, lw;
    split8(v, hw, lw);
    const uint32_t at = r * ld + c;
    *reinterpret_cast<uint4*>(dst + at) = hw;
    if (dst_lo) *reinterpret_cast<uint4*>(dst_lo + at) = lw;
  }
}

// Any alignment: one value a thread.
__global__ void __launch_bounds__(kConvertThreads)
    float_to_half_flat_kernel(const float* __restrict__ src, size_t src_stride, size_t group_stride, RowDiv groups,
                              uint32_t group_count, uint32_t cols, uint32_t total, __half* dst, __half* dst_lo,
                              uint32_t ld) {
  for (uint32_t i = blockIdx.x * kConvertThreads + threadIdx.x; i < total; i += gridDim.x * kConvertThreads) {
    const uint32_t r = i / cols, c = i - r * cols;
    const uint32_t sr = groups.of(r), g = r - sr * group_count;
    __half hi, lo;
    split_half(__ldg(src + sr * src_stride + g * group_stride + c), hi, lo);
    dst[r * ld + c] = hi;
    if (dst_lo) dst_lo[r * ld + c] = lo;
  }
}

// Which kernel family reads `w`: the f32 vector path needs rows of whole float4 pairs.
int kernel_type(const DevMatrix& w) {
  const int t = static_cast<int>(w.type);
  if (t == qd::kF32 && w.cols % 8 != 0) return qd::kF32Scalar;
  if ((t == qd::kF16 || t == qd::kBF16) && w.cols % 8 != 0) {
    throw CudaError("f16/bf16 matrix rows of " + std::to_string(w.cols) + " elements are not a multiple of 8");
  }
  return t;
}

template <int T, int WPR>
void launch_matvec_split(const MatvecArgs& a, cudaStream_t s) {
  const uint32_t rows_per_block =
      WPR > 1 ? kWarps / WPR : kWarps * (32 / lanes_per_row(a.w.cols / qd::Traits<T>::UE));
  const dim3 grid((matvec_max_rows(a) + rows_per_block - 1) / rows_per_block, a.groups, a.parts);
  const dim3 block(kWarps * 32);
  if (a.tokens <= 1) {
    matvec_kernel<T, 1, WPR><<<grid, block, 0, s>>>(a);
  } else if (a.tokens <= 2) {
    matvec_kernel<T, 2, WPR><<<grid, block, 0, s>>>(a);
  } else if (a.tokens <= 4) {
    matvec_kernel<T, 4, WPR><<<grid, block, 0, s>>>(a);
  } else {
    matvec_kernel<T, 8, WPR><<<grid, block, 0, s>>>(a);
  }
}

// Fewer than ~1000 warps of rows cannot keep the memory system busy: then 8 warps share each row.
template <int T>
void launch_matvec(const MatvecArgs& a, cudaStream_t s) {
  const uint64_t row_warps = matvec_total_rows(a) * a.groups;
  const uint64_t units = a.w.cols / qd::Traits<T>::UE;
  if (row_warps < 1024 && units >= 256) {
    launch_matvec_split<T, 8>(a, s);
  } else {
    launch_matvec_split<T, 1>(a, s);
  }
}

unsigned convert_blocks(size_t items) {
  return static_cast<unsigned>(std::min<size_t>((items + kConvertThreads - 1) / kConvertThreads, 65535));
}

// Rows a launch may take so that its outputs, rows `ld` apart, stay below 2^31.
size_t rows_per_launch(size_t ld) { return std::max<size_t>(1, ((size_t{1} << 31) - 1) / std::max<size_t>(ld, 1) - 1); }

template <int T, class OutT>
void launch_dequant(const DevMatrix& w, size_t row0, size_t rows, OutT* dst, __half* lo, size_t ld, cudaStream_t s) {
  using Tr = qd::Traits<T>;
  // Runs start at multiples of 8 columns: 16-byte stores where the outputs and their rows are aligned.
  const bool vec = reinterpret_cast<uintptr_t>(dst) % 16 == 0 && reinterpret_cast<uintptr_t>(lo) % 16 == 0 &&
                   w.cols % 8 == 0 && ld % 8 == 0;
  const uint32_t upr = w.cols / Tr::UE;
  const size_t step = rows_per_launch(ld);
  for (size_t r0 = 0; r0 < rows; r0 += step) {
    const size_t n = std::min(step, rows - r0);
    const uint8_t* data = w.data + (row0 + r0) * w.row_bytes;
    const uint32_t total = static_cast<uint32_t>(n * upr);
    OutT* d = dst + r0 * ld;
    __half* l = lo ? lo + r0 * ld : nullptr;
    const unsigned blocks = convert_blocks(total);
    const uint32_t ld32 = static_cast<uint32_t>(ld);
    if constexpr (std::is_same_v<OutT, __half> && qd::Piece<T>::kHas) {
      if (vec && w.row_bytes == w.cols / qd::Piece<T>::QK * qd::Piece<T>::BB) {
        const uint32_t ppr = w.cols / 8, pieces = static_cast<uint32_t>(n * ppr);
        dequant_pieces_kernel<T><<<convert_blocks(pieces), kConvertThreads, 0, s>>>(data, pieces, ppr, RowDiv(ppr), d,
                                                                                    l, ld32);
        continue;
      }
    }
    if constexpr (std::is_same_v<OutT, __half> && Tr::RL % 8 == 0) {
      if (vec) {
        dequant_staged_kernel<T><<<blocks, kConvertThreads, 0, s>>>(data, w.row_bytes, upr, total, d, l, ld32);
        continue;
      }
    }
    if (vec) {
      dequant_flat_kernel<T, OutT, true><<<blocks, kConvertThreads, 0, s>>>(data, w.row_bytes, upr, total, d, l, ld32);
    } else {
      dequant_flat_kernel<T, OutT, false><<<blocks, kConvertThreads, 0, s>>>(data, w.row_bytes, upr, total, d, l, ld32);
    }
  }
}

// Blocks of a pass for the largest |value|: enough to fill an H200 (132 SMs x 8), few atomics.
constexpr unsigned kAmaxBlocks = 1024;

// dequantize_to_e4m3_split for the types with a pieces kernel: the largest |value| first (over every launch's
// rows) unless known, then the values.
template <int T>
bool launch_e4m3_split(const DevMatrix& w, size_t row0, size_t rows, __half* dst, size_t ld, uint32_t* amax,
                       float* descale, bool amax_known, cudaStream_t s) {
  if constexpr (qd::Piece<T>::kHas) {
    if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || w.cols % 8 != 0 || ld != 2 * w.cols ||
        w.row_bytes != w.cols / qd::Piece<T>::QK * qd::Piece<T>::BB) {
      return false;
    }
    if (!amax_known) FERRY_CUDA(cudaMemsetAsync(amax, 0, sizeof(uint32_t), s));
    const size_t step = rows_per_launch(ld);
    const uint32_t ppr = static_cast<uint32_t>(w.cols / 8);
    for (const int pass : {kAmax, kE4m3}) {
      if (pass == kAmax && amax_known) continue;
      for (size_t r0 = 0; r0 < rows; r0 += step) {
        const size_t n = std::min(step, rows - r0);
        const uint8_t* data = w.data + (row0 + r0) * w.row_bytes;
        const uint32_t pieces = static_cast<uint32_t>(n * ppr);
        auto kernel = pass == kAmax ? dequant_pieces_kernel<T, kAmax> : dequant_pieces_kernel<T, kE4m3>;
        const unsigned blocks = pass == kAmax ? std::min(convert_blocks(pieces), kAmaxBlocks) : convert_blocks(pieces);
        kernel<<<blocks, kConvertThreads, 0, s>>>(data, pieces, ppr, RowDiv(ppr), dst + r0 * ld, nullptr,
                                                  static_cast<uint32_t>(ld), amax, descale);
      }
    }
    return true;
  }
  return false;
}

// Expands CALL(T) for the kernel family `t` (a switch, so that each family is instantiated once).
#define FERRY_DISPATCH_TYPE(t, CALL)                                                             \
  switch (t) {                                                                                   \
    case qd::kF32: CALL(qd::kF32); break;                                                        \
    case qd::kF32Scalar: CALL(qd::kF32Scalar); break;                                            \
    case qd::kF16: CALL(qd::kF16); break;                                                        \
    case qd::kBF16: CALL(qd::kBF16); break;                                                      \
    case qd::kQ8_0: CALL(qd::kQ8_0); break;                                                      \
    case qd::kQ4_K: CALL(qd::kQ4_K); break;                                                      \
    case qd::kQ5_K: CALL(qd::kQ5_K); break;                                                      \
    case qd::kQ6_K: CALL(qd::kQ6_K); break;                                                      \
    case qd::kIQ4_XS: CALL(qd::kIQ4_XS); break;                                                  \
    case qd::kIQ3_S: CALL(qd::kIQ3_S); break;                                                    \
    default: throw CudaError("the CUDA backend cannot read weights of ggml type " + std::to_string(t)); \
  }

}  // namespace

// The current device's address of g_iq3s_grid for the kernels of other translation units, cached
// per device by upload_quant_tables so that matvec() asks nothing of the runtime while a graph is
// captured.
const uint32_t* iq3s_grid_address() {
  static std::atomic<const uint32_t*> cached[64];
  int dev = 0;
  FERRY_CUDA(cudaGetDevice(&dev));
  std::atomic<const uint32_t*>& slot = cached[dev & 63];
  const uint32_t* p = slot.load(std::memory_order_relaxed);
  if (p == nullptr) {
    void* addr = nullptr;
    FERRY_CUDA(cudaGetSymbolAddress(&addr, qd::g_iq3s_grid));
    p = static_cast<const uint32_t*>(addr);
    slot.store(p, std::memory_order_relaxed);
  }
  return p;
}

bool device_supports(model::GgmlType type) {
  switch (static_cast<int>(type)) {
    case qd::kF32: case qd::kF16: case qd::kBF16: case qd::kQ8_0: case qd::kQ4_K: case qd::kQ5_K:
    case qd::kQ6_K: case qd::kIQ4_XS: case qd::kIQ3_S:
      return true;
    default:
      return false;
  }
}

void upload_quant_tables() {
  FERRY_CUDA(cudaMemcpyToSymbol(qd::g_iq3s_grid, model::kIq3sGrid, sizeof(model::kIq3sGrid)));
  FERRY_CUDA(cudaMemcpyToSymbol(qd::g_iq4nl_values, model::kIq4nlValues, sizeof(model::kIq4nlValues)));
  iq3s_grid_address();
}

void matvec(const MatvecArgs& a, cudaStream_t stream) {
  if (a.tokens == 0 || a.groups == 0 || a.w.rows == 0) return;
  if (a.tokens > kMaxMatvecTokens) throw CudaError("matvec: more than 8 tokens");
  if (a.parts < 1 || a.parts > kMaxMatvecParts) {
    throw CudaError("matvec: parts must be 1 to " + std::to_string(kMaxMatvecParts));
  }
  const bool int16 = matvec_quantizes_activations(a);
  const bool named = a.group_count != nullptr;
  for (uint32_t p = 1; p < a.parts; ++p) {
    const MatvecPart& m = a.more[p - 1];
    if (m.y == nullptr || (m.data == nullptr && m.group_ptrs == nullptr)) {
      throw CudaError("matvec: part " + std::to_string(p) + " has no weights or no output");
    }
    if (m.single && (m.data == nullptr || !int16 || named)) {
      throw CudaError("matvec: single part " + std::to_string(p) +
                      " needs its data, the int16-activation path and no groups named on the device");
    }
    if (m.x_up != nullptr && !int16) throw CudaError("matvec: a SwiGLU input needs the int16-activation path");
    if (m.row_bytes != 0 && !int16) throw CudaError("matvec: a part of its own row format needs the int16-activation path");
  }
  if (a.x_up != nullptr && !int16) throw CudaError("matvec: a SwiGLU input needs the int16-activation path");
  if ((a.tok_count != nullptr) != named || (a.tok_x != nullptr) != named || (a.tok_y != nullptr) != named) {
    throw CudaError("matvec: group_count, tok_count, tok_x and tok_y are set together");
  }
  if (named && a.tokens < 2) throw CudaError("matvec: tokens named on the device need tokens >= 2");
  if (a.skip_negative_index && a.w_group_index == nullptr) {
    throw CudaError("matvec: skip_negative_index needs w_group_index");
  }
  if ((named || a.skip_negative_index) && !int16) {
    throw CudaError("matvec: tokens named on the device and skipped groups need the int16-activation path");
  }
  if (int16) {
    const bool iq3s = a.w.type == model::GgmlType::IQ3_S || matvec_second_type(a) == model::GgmlType::IQ3_S;
    launch_matvec_int16(a, iq3s ? iq3s_grid_address() : nullptr, stream);
    return;
  }
  if (matvec_wide_applies(a, current_sm_count())) {
    launch_matvec_wide(a, stream);
    return;
  }
  const int t = kernel_type(a.w);
  if (t != qd::kF32Scalar) {
    bool aligned = reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && a.x_tok_stride % 4 == 0 && a.x_group_stride % 4 == 0;
    for (uint32_t p = 1; p < a.parts; ++p) aligned = aligned && reinterpret_cast<uintptr_t>(a.more[p - 1].x) % 16 == 0;
    if (!aligned) throw CudaError("matvec: activations not 16-byte aligned");
  }
  #define CALL(T) launch_matvec<T>(a, stream)
  FERRY_DISPATCH_TYPE(t, CALL)
#undef CALL
  FERRY_CUDA_LAUNCHED();
}

void dequantize_to_half(const DevMatrix& w, size_t row0, size_t rows, void* dst_half, cudaStream_t stream,
                        void* dst_lo, size_t dst_ld) {
  if (rows == 0) return;
  const int t = kernel_type(w);
  const size_t ld = dst_ld != 0 ? dst_ld : w.cols;
#define CALL(T) \
  launch_dequant<T>(w, row0, rows, static_cast<__half*>(dst_half), static_cast<__half*>(dst_lo), ld, stream)
  FERRY_DISPATCH_TYPE(t, CALL)
#undef CALL
  FERRY_CUDA_LAUNCHED();
}

bool dequantize_to_e4m3_split(const DevMatrix& w, size_t row0, size_t rows, void* dst, size_t dst_ld, uint32_t* amax,
                              float* descale, bool amax_known, cudaStream_t stream) {
  if (rows == 0) return true;
  bool done = false;
  const int t = kernel_type(w);
#define CALL(T) \
  done = launch_e4m3_split<T>(w, row0, rows, static_cast<__half*>(dst), dst_ld, amax, descale, amax_known, stream)
  FERRY_DISPATCH_TYPE(t, CALL)
#undef CALL
  FERRY_CUDA_LAUNCHED();
  return done;
}

void dequantize_to_float(const DevMatrix& w, size_t row0, size_t rows, float* dst, cudaStream_t stream) {
  if (rows == 0) return;
  const int t = kernel_type(w);
#define CALL(T) launch_dequant<T>(w, row0, rows, dst, nullptr, w.cols, stream)
  FERRY_DISPATCH_TYPE(t, CALL)
#undef CALL
  FERRY_CUDA_LAUNCHED();
}

void embed_rows(const DevMatrix& embd, const int32_t* tokens, uint32_t rows, float* dst, uint32_t copies,
                cudaStream_t stream) {
  if (rows == 0) return;
  const int t = kernel_type(embd);
  const size_t units = static_cast<size_t>(rows) * (embd.cols / 8 + 1);
  const unsigned blocks = static_cast<unsigned>(std::min<size_t>((units + 255) / 256, 65535));
  const bool vec = embd.cols % 4 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
#define CALL(T)                                                                                   \
  if (vec) {                                                                                      \
    embed_kernel<T, true><<<blocks, 256, 0, stream>>>(embd.data, embd.row_bytes, embd.cols, tokens, \
                                                      rows, dst, copies);                         \
  } else {                                                                                        \
    embed_kernel<T, false><<<blocks, 256, 0, stream>>>(embd.data, embd.row_bytes, embd.cols, tokens, \
                                                       rows, dst, copies);                        \
  }
  FERRY_DISPATCH_TYPE(t, CALL)
#undef CALL
  FERRY_CUDA_LAUNCHED();
}

void float_to_half(const float* src, size_t src_stride, size_t rows, size_t cols, void* dst_half, cudaStream_t stream,
                   void* dst_lo, size_t dst_ld) {
  float_to_half_groups(src, src_stride, 0, rows, 1, cols, dst_half, stream, dst_lo, dst_ld);
}

void float_to_half_groups(const float* src, size_t src_stride, size_t group_stride, size_t rows, uint32_t groups,
                          size_t cols, void* dst_half, cudaStream_t stream, void* dst_lo, size_t dst_ld) {
  if (rows * groups * cols == 0) return;
  __half* hi = static_cast<__half*>(dst_half);
  __half* lo = static_cast<__half*>(dst_lo);
  const size_t ld = dst_ld != 0 ? dst_ld : cols;
  // Two float4 loads and two 16-byte stores a thread where the rows allow it.
  const bool vec = reinterpret_cast<uintptr_t>(src) % 16 == 0 && src_stride % 4 == 0 && group_stride % 4 == 0 &&
                   cols % 8 == 0 && ld % 8 == 0 && reinterpret_cast<uintptr_t>(hi) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(lo) % 16 == 0;
  // Whole source rows a launch, their outputs below 2^31.
  const size_t step = std::max<size_t>(1, rows_per_launch(ld) / groups);
  if (step * groups * ld >= (size_t{1} << 31)) throw CudaError("float_to_half_groups: one row's groups exceed 2^31 outputs");
  const RowDiv by_groups(groups);
  for (size_t r0 = 0; r0 < rows; r0 += step) {
    const size_t n = std::min(step, rows - r0) * groups;
    const float* s = src + r0 * src_stride;
    __half* h = hi + r0 * groups * ld;
    __half* l = lo ? lo + r0 * groups * ld : nullptr;
    const uint32_t ld32 = static_cast<uint32_t>(ld);
    if (vec) {
      const uint32_t total = static_cast<uint32_t>(n * cols / 8);
      float_to_half_vec_kernel<<<convert_blocks(total), kConvertThreads, 0, stream>>>(
          s, src_stride, group_stride, by_groups, groups, static_cast<uint32_t>(cols / 8), total, h, l, ld32);
    } else {
      const uint32_t total = static_cast<uint32_t>(n * cols);
      float_to_half_flat_kernel<<<convert_blocks(total), kConvertThreads, 0, stream>>>(
          s, src_stride, group_stride, by_groups, groups, static_cast<uint32_t>(cols), total, h, l, ld32);
    }
  }
  FERRY_CUDA_LAUNCHED();
}

}  // namespace ferry::gpu
