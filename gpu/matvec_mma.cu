// The int16-activation decode matvec (gpu/matvec_int16.cu) on int8 tensor cores (issue 15).
//
// The dp2a kernel spends its time unpacking weights and issuing 2 MACs an instruction, not waiting on
// memory (the output head streams at ~60% of the copy bandwidth). Here one mma.sync m16n8k32
// (gpu/mma_int8.cuh) multiplies a 16-row x 32-column tile of weights, their quantized bytes as they
// lie (A), by the launch's tokens (B: up to 8 columns, unused ones zero); each int16 activation is
// hi (s8) * 256 + lo (u8), two exact MMAs, so the int32 sum of a 32-weight sub-block is the dp2a
// kernel's, and only the f32 order of the scale and minimum terms differs. The activations are
// quantized as the dp2a kernel does (one scale a 32 values, amax / 32767; the f32 sums of the
// values for the minimum terms) into shared memory in B's fragment order.
//
// Work: a warp's step is 16 rows x one 256-column superblock, its loads (8-byte pieces: a lane holds
// rows g and g + 8 of an MMA tile, at the same columns) requested one step ahead. The warps of a
// block share a tile's superblocks (8 warps on rows of 8 or more superblocks, fewer tiles a block
// otherwise) and add their partial sums through shared memory in a fixed order; a token's result
// is the same whatever the launch's token count.
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <utility>

#include "gpu/cuda_check.hpp"
#include "gpu/matvec_mma.hpp"
#include "gpu/matvec_part.cuh"
#include "gpu/mma_int8.cuh"
#include "gpu/pdl.cuh"
#include "gpu/pdl.hpp"
#include "gpu/quant_device.cuh"
#include "gpu/swiglu.cuh"

namespace ferry::gpu {
namespace {

constexpr uint32_t kWarps = 8, kThreads = kWarps * 32;
// Dynamic shared memory the kernels are allowed (the opt-in above 48 KiB, sm80+): what the largest
// call that takes the int16 path needs here (8 tokens of 2,432 columns: ~52 KiB) fits.
constexpr size_t kMaxSmem = 64 * 1024;

// Shared memory of a block for `tokens` tokens of `units` 32-column units:
//   B: per token (tok_stride bytes, 64 more than the values so that two tokens' fragment loads of one
//      quarter-warp fall in different banks), per unit, per lane q 16 bytes: the hi bytes of columns
//      8q..8q+7 of the unit, then their lo bytes;
//   scales: per token (units + 1: the pad again), per unit, float2 {amax / 32767, sum of the 32 x};
//   partial sums: two buffers (steps alternate) x warps x tokens x 16 rows.
struct Layout {
  uint32_t units, tokens;
  __host__ __device__ uint32_t tok_stride() const { return units * 64 + 64; }
  __host__ __device__ uint32_t scale_stride() const { return units + 1; }
  __host__ __device__ uint32_t scales_at() const { return tokens * tok_stride(); }
  __host__ __device__ uint32_t partials_at() const { return scales_at() + tokens * scale_stride() * 8; }
  __host__ __device__ uint32_t bytes() const { return partials_at() + 2 * kWarps * tokens * 16 * 4; }
};

// Warps sharing a tile's superblocks: a power of two up to 8, at most the superblocks of a row.
__host__ __device__ constexpr uint32_t warps_per_tile(uint32_t superblocks) {
  return superblocks >= 8 ? 8 : superblocks >= 4 ? 4 : superblocks >= 2 ? 2 : 1;
}

// The int32 sums of one 32-column sub-block for the lane's C fragment (rows g, g + 8 x tokens 2q,
// 2q + 1: s[2r + t]): A holds the lane's weight bytes of rows g and g + 8 for columns 8q..8q+7 of
// the sub-block (a[0], a[1]: columns 8q..8q+3; a[2], a[3]: 8q+4..8q+7), B token g's activations of
// the same columns from shared memory.
template <bool SignedA>
__device__ __forceinline__ void sub_block_sums(const mma::FragA& A, const unsigned char* xb, uint32_t tok_stride,
                                               uint32_t unit, uint32_t g, uint32_t q, uint32_t ntok, int (&s)[4]) {
  uint4 v = make_uint4(0, 0, 0, 0);
  if (g < ntok) v = *reinterpret_cast<const uint4*>(xb + g * tok_stride + unit * 64 + q * 16);
  const mma::FragB hi{{v.x, v.y}}, lo{{v.z, v.w}};
  mma::FragC ch{{0, 0, 0, 0}}, cl{{0, 0, 0, 0}};
  mma::mma_k32<SignedA, true>(ch, A, hi);
  mma::mma_k32<SignedA, false>(cl, A, lo);
#pragma unroll
  for (int i = 0; i < 4; ++i) s[i] = ch.r[i] * 256 + cl.r[i];
}

// Token t's scale and sum of unit `unit`, zero past the group's tokens.
__device__ __forceinline__ float2 x_scale(const float2* xs, const Layout& lay, uint32_t t, uint32_t unit,
                                          uint32_t ntok) {
  return t < ntok ? xs[t * lay.scale_stride() + unit] : make_float2(0.0f, 0.0f);
}

// Per type: a superblock's bytes, what a lane loads of it for rows g and g + 8 (Regs, load), and its
// products for the lane's C fragment added to acc (product).
template <int T> struct MmaReader;

// Q4_K: d, dmin (f16), 12 bytes of 6-bit scales and minimums, then 4 chunks of 32 bytes: chunk c's
// low nibbles are sub-block 2c, its high nibbles sub-block 2c + 1 (byte l: column l of both).
template <> struct MmaReader<qd::kQ4_K> {
  static constexpr uint32_t kBlockBytes = 144;
  static constexpr bool kSignedA = false;
  struct Regs {
    uint4 head[2];    // bytes 0..15 of rows g, g + 8
    uint2 qs[2][4];   // bytes 8q..8q+7 of each chunk
  };
  __device__ static void load(const uint8_t* blk, uint32_t r, uint32_t q, Regs& w) {
    w.head[r] = *reinterpret_cast<const uint4*>(blk);
#pragma unroll
    for (int c = 0; c < 4; ++c) w.qs[r][c] = *reinterpret_cast<const uint2*>(blk + 16 + 32 * c + 8 * q);
  }
  __device__ static void clear(uint32_t r, Regs& w) {
    w.head[r] = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int c = 0; c < 4; ++c) w.qs[r][c] = make_uint2(0, 0);
  }
  // Superblock sb: per sub-block j, sum(q x) * scale * x's step summed in f32, and minimum * sum(x);
  // d and dmin once for the superblock.
  __device__ static void product(const Regs& w, uint32_t sb, const unsigned char* xb, const float2* xs,
                                 const Layout& lay, uint32_t g, uint32_t q, uint32_t ntok, float (&acc)[4]) {
    float d[2], dmin[2];
    uint32_t sc[2][2], mn[2][2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint4 h = w.head[r];
      d[r] = qd::h2f(h.x & 0xffff);
      dmin[r] = qd::h2f(h.x >> 16);
      // Bytes j of sc[r][0] / sc[r][1]: the scales of sub-blocks j / 4 + j (k4_scale_min's rule).
      sc[r][0] = h.y & 0x3f3f3f3fu;
      mn[r][0] = h.z & 0x3f3f3f3fu;
      sc[r][1] = (h.w & 0x0f0f0f0fu) | ((h.y >> 2) & 0x30303030u);
      mn[r][1] = ((h.w >> 4) & 0x0f0f0f0fu) | ((h.z >> 2) & 0x30303030u);
    }
    float sd[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sm[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int c = j >> 1, shift = 4 * (j & 1);
      mma::FragA A;
      A.r[0] = (w.qs[0][c].x >> shift) & 0x0f0f0f0fu;
      A.r[1] = (w.qs[1][c].x >> shift) & 0x0f0f0f0fu;
      A.r[2] = (w.qs[0][c].y >> shift) & 0x0f0f0f0fu;
      A.r[3] = (w.qs[1][c].y >> shift) & 0x0f0f0f0fu;
      const uint32_t unit = 8 * sb + j;
      int s[4];
      sub_block_sums<kSignedA>(A, xb, lay.tok_stride(), unit, g, q, ntok, s);
      const float2 x0 = x_scale(xs, lay, 2 * q, unit, ntok), x1 = x_scale(xs, lay, 2 * q + 1, unit, ntok);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int scale = static_cast<int>((sc[r][j >> 2] >> (8 * (j & 3))) & 0xff);
        const float m = qd::byte_f(mn[r][j >> 2], j & 3);
        sd[2 * r] += static_cast<float>(s[2 * r] * scale) * x0.x;
        sd[2 * r + 1] += static_cast<float>(s[2 * r + 1] * scale) * x1.x;
        sm[2 * r] += m * x0.y;
        sm[2 * r + 1] += m * x1.y;
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] += d[i >> 1] * sd[i] - dmin[i >> 1] * sm[i];
  }
};

// Token t's 16 values at columns 16p.. (SwiGLU of gate and up where x_up is set), as the dp2a kernel
// reads them.
__device__ __forceinline__ void read_x16(const MatvecArgs& a, const MatvecPartView& view, uint32_t g, size_t at,
                                         float (&v)[16]) {
  const float4* src = reinterpret_cast<const float4*>(view.x + at);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float4 f = src[k];
    v[4 * k] = f.x, v[4 * k + 1] = f.y, v[4 * k + 2] = f.z, v[4 * k + 3] = f.w;
  }
  if (a.x_up == nullptr) return;
  const float4* up =
      reinterpret_cast<const float4*>(a.x_up + static_cast<size_t>(g / a.x_group_div) * a.x_group_stride + at);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float4 u = up[k];
    v[4 * k] = swiglu_value(v[4 * k], u.x, a.swiglu_limit);
    v[4 * k + 1] = swiglu_value(v[4 * k + 1], u.y, a.swiglu_limit);
    v[4 * k + 2] = swiglu_value(v[4 * k + 2], u.z, a.swiglu_limit);
    v[4 * k + 3] = swiglu_value(v[4 * k + 3], u.w, a.swiglu_limit);
  }
}

// Quantizes the group's tokens into the B layout: a thread 16 values (half of a 32-value unit, its
// neighbour the other half), with the dp2a kernel's rounding: step amax / 32767 of the unit,
// round-to-nearest of v * (32767 / amax).
__device__ void quantize_x(const MatvecArgs& a, const MatvecPartView& view, uint32_t g, const int32_t* tok_x,
                           uint32_t ntok, const Layout& lay, unsigned char* smem) {
  const uint32_t K = a.w.cols, pieces = ntok * (K / 16);
  float2* xs = reinterpret_cast<float2*>(smem + lay.scales_at());
  for (uint32_t base = 0; base < pieces; base += kThreads) {
    const uint32_t i = base + threadIdx.x;
    const bool valid = i < pieces;
    const uint32_t t = valid ? i / (K / 16) : 0, p = valid ? i % (K / 16) : 0;
    float v[16];
    float amax = 0.0f, sum = 0.0f;
    if (valid) {
      read_x16(a, view, g, static_cast<size_t>(tok_x != nullptr ? tok_x[t] : t) * a.x_tok_stride + 16 * p, v);
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        amax = fmaxf(amax, fabsf(v[k]));
        sum += v[k];
      }
    }
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    const float other_sum = __shfl_xor_sync(0xffffffffu, sum, 1);
    if (!valid) continue;
    const float inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
    const uint32_t unit = p / 2, half = p % 2;
    uint32_t hi[4] = {0, 0, 0, 0}, lo[4] = {0, 0, 0, 0};
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      const int x = __float2int_rn(v[k] * inv);
      hi[k / 4] |= (static_cast<uint32_t>(x >> 8) & 0xffu) << (8 * (k % 4));
      lo[k / 4] |= (static_cast<uint32_t>(x) & 0xffu) << (8 * (k % 4));
    }
    // Columns 16 * half + 0..7 are lane q = 2 * half's, 8..15 lane 2 * half + 1's.
    uint4* dst = reinterpret_cast<uint4*>(smem + t * lay.tok_stride() + unit * 64 + half * 32);
    dst[0] = make_uint4(hi[0], hi[1], lo[0], lo[1]);
    dst[1] = make_uint4(hi[2], hi[3], lo[2], lo[3]);
    if (half == 0) xs[t * lay.scale_stride() + unit] = make_float2(amax / 32767.0f, sum + other_sum);
  }
}

template <int T>
__global__ void __launch_bounds__(kThreads, 2) mma_kernel(MatvecArgs a) {
  using R = MmaReader<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  // Groups, tokens named on the device and PDL as in the dp2a kernel (gpu/matvec_int16.cu): the
  // weights no earlier kernel picks are requested before the wait, x and y touched only after it.
  const bool fixed_weights = a.w_group_index == nullptr && a.w_group_ptrs == nullptr && a.group_count == nullptr &&
                             (a.parts < 2 || a.more[0].group_ptrs == nullptr) &&
                             (a.parts < 3 || a.more[1].group_ptrs == nullptr);
  if (!fixed_weights) pdl_wait();
  uint32_t g = blockIdx.y, bx = blockIdx.x, nb = gridDim.x, ntok = a.tokens;
  const int32_t *tok_x = nullptr, *tok_y = nullptr;
  if (a.group_count != nullptr) {
    const uint32_t groups = min(static_cast<uint32_t>(max(*a.group_count, 0)), a.groups);
    if (groups == 0) return;
    g = blockIdx.x % groups;
    bx = blockIdx.x / groups;
    nb = gridDim.x / groups + (g < gridDim.x % groups ? 1 : 0);
    ntok = min(static_cast<uint32_t>(max(a.tok_count[g], 0)), a.tokens);
    if (ntok == 0) return;
    tok_x = a.tok_x + static_cast<size_t>(g) * a.tokens;
    tok_y = a.tok_y + static_cast<size_t>(g) * a.tokens;
  }
  if (a.skip_negative_index && a.w_group_index[g] < 0) return;
  const uint32_t superblocks = a.w.cols / 256;
  const Layout lay{a.w.cols / 32, a.tokens};
  const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, lg = lane >> 2, lq = lane & 3;
  // Warp `warp` takes superblocks slice, slice + wpt, ... of tile `in_step` of each block step.
  const uint32_t wpt = warps_per_tile(superblocks), tiles_per_step = kWarps / wpt;
  const uint32_t in_step = warp / wpt, slice = warp % wpt;
  const uint32_t mine = (superblocks - slice + wpt - 1) / wpt;
  const MatvecPartView view = matvec_part_view(a, g);
  const uint32_t tiles = (view.rows + 15) / 16;
  auto tile_of = [&](uint32_t step, uint32_t at) { return (bx + step * nb) * tiles_per_step + at; };
  auto load = [&](uint32_t step, uint32_t j, typename R::Regs& w) {
    const uint32_t row0 = tile_of(step, in_step) * 16 + lg;
    const size_t col_bytes = static_cast<size_t>(slice + j * wpt) * R::kBlockBytes;
#pragma unroll
    for (uint32_t r = 0; r < 2; ++r) {
      const uint32_t row = row0 + 8 * r;
      if (row < view.rows) {
        R::load(view.w + static_cast<size_t>(row) * a.w.row_bytes + col_bytes, r, lq, w);
      } else {
        R::clear(r, w);
      }
    }
  };

  typename R::Regs cur;
  load(0, 0, cur);
  if (fixed_weights) pdl_wait();
  pdl_launch_dependents();
  quantize_x(a, view, g, tok_x, ntok, lay, smem);
  __syncthreads();

  const float2* xs = reinterpret_cast<const float2*>(smem + lay.scales_at());
  float* partials = reinterpret_cast<float*>(smem + lay.partials_at());
  auto store = [&](uint32_t row, uint32_t t, float v) {
    const size_t yt = tok_y != nullptr ? static_cast<size_t>(tok_y[t]) : static_cast<size_t>(t);
    view.y[static_cast<size_t>(g) * a.y_group_stride + row + yt * view.y_tok_stride] = v;
  };
  for (uint32_t step = 0; tile_of(step, 0) < tiles; ++step) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (uint32_t j = 0; j < mine; ++j) {
      typename R::Regs next;
      if (j + 1 < mine) {
        load(step, j + 1, next);
      } else {
        load(step + 1, 0, next);
      }
      R::product(cur, slice + j * wpt, smem, xs, lay, lg, lq, ntok, acc);
      cur = next;
    }
    // acc[2r + t]: row lg + 8r, token 2 lq + t of the tile.
    if (wpt == 1) {
#pragma unroll
      for (uint32_t i = 0; i < 4; ++i) {
        const uint32_t row = tile_of(step, in_step) * 16 + lg + 8 * (i >> 1), t = 2 * lq + (i & 1);
        if (row < view.rows && t < ntok) store(row, t, acc[i]);
      }
      continue;
    }
    float* buf = partials + (step & 1) * kWarps * a.tokens * 16;
#pragma unroll
    for (uint32_t i = 0; i < 4; ++i) {
      const uint32_t t = 2 * lq + (i & 1);
      if (t < ntok) buf[(warp * a.tokens + t) * 16 + lg + 8 * (i >> 1)] = acc[i];
    }
    // One barrier a step: a buffer is written again two steps on, after every thread has passed the
    // next step's barrier and so finished reading it.
    __syncthreads();
    for (uint32_t idx = threadIdx.x; idx < tiles_per_step * ntok * 16; idx += kThreads) {
      const uint32_t at = idx / (ntok * 16), t = idx / 16 % ntok, rl = idx % 16;
      const uint32_t row = tile_of(step, at) * 16 + rl;
      float sum = 0.0f;
      for (uint32_t w = 0; w < wpt; ++w) sum += buf[((at * wpt + w) * a.tokens + t) * 16 + rl];
      if (row < view.rows) store(row, t, sum);
    }
  }
}

void (*kernel_for(model::GgmlType type))(MatvecArgs) {
  switch (type) {
    case model::GgmlType::Q4_K: return mma_kernel<qd::kQ4_K>;
    default: return nullptr;
  }
}

// The shared-memory opt-in, once a kernel and device; then the blocks an SM holds at `smem` bytes
// (asked once a device, kernel and size: a decode graph's capture finds them asked by its eager step).
uint32_t resident_per_sm(void (*kernel)(MatvecArgs), size_t smem) {
  static std::mutex mutex;
  static std::set<std::pair<int, const void*>> opted;
  static std::map<std::tuple<int, const void*, size_t>, uint32_t> cache;
  int dev = 0;
  FERRY_CUDA(cudaGetDevice(&dev));
  const std::lock_guard<std::mutex> lock(mutex);
  const void* k = reinterpret_cast<const void*>(kernel);
  if (opted.insert({dev, k}).second) {
    FERRY_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kMaxSmem)));
  }
  auto [it, fresh] = cache.try_emplace({dev, k, smem}, 0);
  if (fresh) {
    int n = 0;
    FERRY_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, smem));
    it->second = static_cast<uint32_t>(std::max(n, 1));
  }
  return it->second;
}

}  // namespace

bool matvec_mma_applies(const MatvecArgs& a) {
  if (!matvec_quantizes_activations(a)) return false;
  void (*kernel)(MatvecArgs) = kernel_for(a.w.type);
  return kernel != nullptr && code_built_for(reinterpret_cast<const void*>(kernel), 8) &&
         Layout{a.w.cols / 32, a.tokens}.bytes() <= kMaxSmem;
}

void launch_matvec_mma(const MatvecArgs& a, cudaStream_t stream) {
  if (!matvec_mma_applies(a)) throw CudaError("launch_matvec_mma: no tensor-core kernel for this call");
  void (*kernel)(MatvecArgs) = kernel_for(a.w.type);
  const size_t smem = Layout{a.w.cols / 32, a.tokens}.bytes();
  const uint32_t rows_per_block = 16 * (kWarps / warps_per_tile(a.w.cols / 256));
  // Enough blocks to fill the device once; each block quantizes its input once and loops over tiles.
  const uint32_t wanted = (matvec_max_rows(a) + rows_per_block - 1) / rows_per_block;
  const uint32_t resident = static_cast<uint32_t>(current_sm_count()) * resident_per_sm(kernel, smem);
  dim3 grid;
  if (a.group_count != nullptr) {
    const uint32_t all = std::max<uint32_t>(1, resident / a.parts);
    grid = dim3(std::max(a.groups, std::min(wanted * a.groups, all)), 1, a.parts);
  } else {
    const uint32_t fill = std::max<uint32_t>(1, resident / (a.groups * a.parts));
    grid = dim3(std::min(wanted, fill), a.groups, a.parts);
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  pdl_configure(cfg, attr, reinterpret_cast<const void*>(kernel));
  FERRY_CUDA(cudaLaunchKernelEx(&cfg, kernel, a));
  FERRY_CUDA_LAUNCHED();
}

}  // namespace ferry::gpu
