// The int16-activation decode matvec (gpu/matvec_int16.cu) on int8 tensor cores for Q4_K and Q5_K
// (issue 15).
//
// The dp2a kernel spends much of its time unpacking weights and issuing 2 MACs an instruction. Here
// one mma.sync m16n8k32 (gpu/mma_int8.cuh) multiplies a 16-row x 32-column tile of weights, their
// quantized bytes as they lie (A), by the launch's tokens (B: up to 8 columns); each int16
// activation is hi (s8) * 256 + lo (u8), two exact MMAs, so the int32 sum of a 32-weight sub-block
// is the dp2a kernel's, and only the f32 order of the scale terms differs; the minimum terms (a
// superblock's 8 minimums times the f32 sums of x) are one more MMA over tf32, the sums split into
// two tf32 parts (~22 bits). The activations are quantized as the dp2a kernel does
// (gpu/x_int16.cuh) into shared memory in B's fragment order. At one token (decode's Q4_K calls) B's
// columns carry four sub-blocks' bytes instead of copies of the token, so that every lane's outputs
// are used: 210 instructions a superblock instead of 357, the same bits (K4One,
// gpu/matvec_mma_readers.cuh; the output head 127 -> 103 us, gpu/PERF.md, h101).
//
// Work: a warp's step is 16 rows x one 256-column superblock (8-byte pieces: a lane holds rows g and
// g + 8 of an MMA tile, at the same columns, and one word of each row's 16-byte head, the quad's
// lanes sharing the rest by shuffles). Each piece of a superblock is loaded again from the next one
// as soon as the products have used it, so that the next superblock is in flight in the registers
// of one (128 registers, 2 blocks of 8 warps an SM: 3 blocks at 80 registers measured slower). The
// warps of a block share a tile's superblocks (8 warps a tile on rows of 8 or more superblocks;
// fewer warps a tile, so more tiles a block, otherwise) and add their partial sums through shared
// memory in a fixed order, meeting at a barrier once every few steps (Layout::ring); a token's
// result is the same whatever the launch's token count. A launch
// of several groups or parts may instead share its blocks out by the groups' steps (one wave where
// the 3-D grid would take two: one row's routed and shared down; gpu/matvec_share.cuh) or, where
// every group reads one x (one row's routed and shared gate / up), walk its steps flat, a block's
// contiguous share running on from one group into the next: the same tiles computed alike by other
// blocks.
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <type_traits>
#include <utility>

#include "gpu/cuda_check.hpp"
#include "gpu/matvec_mma.hpp"
#include "gpu/matvec_mma_readers.cuh"
#include "gpu/matvec_part.cuh"
#include "gpu/matvec_share.cuh"
#include "gpu/mma_int8.cuh"
#include "gpu/pdl.cuh"
#include "gpu/pdl.hpp"
#include "gpu/quant_device.cuh"
#include "gpu/swiglu.cuh"
#include "gpu/x_int16.cuh"

namespace ferry::gpu {
namespace {

using namespace matvec_mma_detail;

// Token t's 16 values at columns 16p.. (SwiGLU of gate and up where x_up is set), as the dp2a kernel
// reads them.
__device__ __forceinline__ void read_x16(const MatvecArgs& a, const MatvecPartView& view, const float* x_up, size_t at,
                                         float (&v)[16]) {
  const float4* src = reinterpret_cast<const float4*>(view.x + at);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float4 f = src[k];
    v[4 * k] = f.x, v[4 * k + 1] = f.y, v[4 * k + 2] = f.z, v[4 * k + 3] = f.w;
  }
  if (x_up != nullptr) swiglu_values16(v, x_up + at, a.swiglu_limit);
}

// Quantizes the group's tokens into the B layout: a thread 16 values (half of a 32-value unit, its
// neighbour the other half), rounded as the dp2a kernel rounds them (gpu/x_int16.cuh), each int16 as
// its hi and lo bytes.
__device__ void quantize_x(const MatvecArgs& a, const MatvecPartView& view, const float* x_up, const int32_t* tok_x,
                           uint32_t ntok, const Layout& lay, unsigned char* smem) {
  const uint32_t K = a.w.cols, pieces = ntok * (K / 16);
  float* steps = reinterpret_cast<float*>(smem + lay.steps_at());
  if (lay.one && threadIdx.x < 9) reinterpret_cast<uint4*>(smem + lay.zero_at())[threadIdx.x] = make_uint4(0, 0, 0, 0);
  for (uint32_t base = 0; base < pieces; base += kThreads) {
    const uint32_t i = base + threadIdx.x;
    const bool valid = i < pieces;
    const uint32_t t = valid ? i / (K / 16) : 0, p = valid ? i % (K / 16) : 0;
    float v[16] = {};
    if (valid) read_x16(a, view, x_up, static_cast<size_t>(tok_x != nullptr ? tok_x[t] : t) * a.x_tok_stride + 16 * p, v);
    float amax, sum;
    x16_stats(v, amax, sum);
    amax = x32_amax(amax);
    const float other_sum = __shfl_xor_sync(0xffffffffu, sum, 1);
    if (!valid) continue;
    uint32_t packed[8];
    x16_pack(v, amax, packed);
    // hi[k], lo[k]: the high / low bytes of columns 16 half + 4k..4k+3.
    uint32_t hi[4], lo[4];
    x16_bytes(packed, hi, lo);
    const uint32_t unit = p / 2, half = p % 2;
    // Columns 16 half + 0..7 are lane 2 half's, 8..15 lane 2 half + 1's.
    if (lay.one) {
#pragma unroll
      for (int k = 0; k < 4; ++k) lo[k] ^= 0x80808080u;  // s8: lo - 128
    }
    uint4* dst = reinterpret_cast<uint4*>(smem + t * lay.tok_stride() + unit * lay.unit_bytes() + half * 32);
    dst[0] = make_uint4(hi[0], hi[1], lo[0], lo[1]);
    dst[1] = make_uint4(hi[2], hi[3], lo[2], lo[3]);
    if (half == 0) {
      steps[t * lay.step_stride() + unit] = x32_scale(amax);
      const float total = sum + other_sum, hi_part = tf32_round(total);
      const uint32_t j = unit % 8;
      float* slot = reinterpret_cast<float*>(smem + lay.sums_at() + t * lay.sum_stride() + unit / 8 * 64 + (j % 4) * 16);
      slot[j / 4] = hi_part;
      slot[2 + j / 4] = tf32_round(total - hi_part);
    }
  }
}

// How a launch's blocks find their work: a 3-D grid of blockIdx.y groups and blockIdx.z parts
// (matvec_block_take), a 1-D grid shared out by the groups' steps (share_of, gpu/matvec_share.cuh),
// or a 1-D grid walking the launch's steps flat (flat_segment).
enum class Walk : uint32_t { grid, shared_out, flat };

// Steps [from, from + count) of group g of part `part`.
struct Segment {
  uint32_t part, g, from, count;
};
// Flat (every group reads the same x: one row's routed and shared gate and up): block b of N takes
// steps [b S / N, (b + 1) S / N) of the launch's groups in order, contiguous ones, across a group's
// end into the next; its segment from launch step s on, up to `end`.
__device__ inline Segment flat_segment(const MatvecArgs& a, uint32_t rows_per_step, uint32_t s, uint32_t end) {
  uint32_t before = 0;
  for (uint32_t p = 0; p < a.parts && p < kMaxMatvecParts; ++p) {
    const uint32_t steps = share_group_steps(a, p, rows_per_step), in = share_part_groups(a, p) * steps;
    if (s < before + in) {
      const uint32_t at = s - before, g = at / steps, from = at % steps;
      return {p, g, from, min(steps - from, end - s)};
    }
    before += in;
  }
  return {0, 0, 0, 0};
}
__device__ inline uint64_t flat_first_step(uint32_t b, uint32_t N, uint64_t S) { return S * b / N; }

// Flat: the kernel of flat walks (their segments' bookkeeping kept out of the others' registers); One:
// of one-token launches (K4One, Q4_K).
template <int T, bool Flat, bool One>
__global__ void __launch_bounds__(kThreads, 2)
    matvec_mma_kernel(MatvecArgs a, Walk walk) {
  using R = std::conditional_t<One, K4One, MmaReader<T>>;
  extern __shared__ __align__(16) unsigned char smem[];
  const uint32_t superblocks = a.w.cols / 256;
  const uint32_t wpt = warps_per_tile(superblocks), tiles_per_step = kWarps / wpt;
  // Groups, tokens named on the device and PDL as in the dp2a kernel (gpu/matvec_int16.cu): the
  // weights no earlier kernel picks are requested before the wait, x and y touched only after it.
  // The block's first segment: its group's steps bx, bx + nb, ... (strided by the group's blocks), or
  // `count` contiguous ones (flat).
  uint32_t part = blockIdx.z, count = ~0u;
  uint32_t flat_at = 0, flat_end = 0;
  MatvecBlockTake take;
  if (!Flat && walk == Walk::shared_out) {
    const MatvecShare sh = share_of(a, 16 * tiles_per_step, blockIdx.x, gridDim.x);
    part = sh.part;
    take = {sh.g, sh.bx, sh.nb, a.tokens, nullptr, nullptr};
  } else if (Flat) {
    uint32_t U;
    uint64_t S;
    share_totals(a, 16 * tiles_per_step, U, S);
    flat_at = static_cast<uint32_t>(flat_first_step(blockIdx.x, gridDim.x, S));
    flat_end = static_cast<uint32_t>(flat_first_step(blockIdx.x + 1, gridDim.x, S));
    if (flat_at >= flat_end) return;
    const Segment seg = flat_segment(a, 16 * tiles_per_step, flat_at, flat_end);
    part = seg.part, count = seg.count;
    take = {seg.g, seg.from, 1, a.tokens, nullptr, nullptr};
  }
  const bool fixed_weights = matvec_part_fixed_weights(a, part);
  if (!fixed_weights) pdl_wait();
  if (!Flat && walk == Walk::grid && !matvec_block_take(a, a.group_count != nullptr, take)) return;
  uint32_t g = take.g, bx = take.bx, nb = take.nb;
  const uint32_t ntok = take.ntok;
  const int32_t *tok_x = take.tok_x, *tok_y = take.tok_y;
  const Layout lay{a.w.cols / 32, a.tokens, One};
  const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, lg = lane >> 2, lq = lane & 3;
  // Warp `warp` takes superblocks slice, slice + wpt, ... of tile `in_step` of each block step.
  const uint32_t in_step = warp / wpt, slice = warp % wpt;
  const uint32_t mine = (superblocks - slice + wpt - 1) / wpt;
  MatvecPartView view = matvec_part_view(a, g, part);
  if (view.rows == 0) return;
  auto tile_in = [&](uint32_t from, uint32_t stride, uint32_t ls, uint32_t at) {
    return (from + ls * stride) * tiles_per_step + at;
  };
  // The segment's steps: flat ones counted, strided ones up to the group's last tile.
  auto steps_of = [&](uint32_t rows, uint32_t from, uint32_t stride, uint32_t n) {
    const uint32_t total = ((rows + 15) / 16 + tiles_per_step - 1) / tiles_per_step;
    return min(n, total > from ? (total - from + stride - 1) / stride : 0);
  };
  count = steps_of(view.rows, bx, nb, count);
  // The lane's rows g and g + 8 of the warp's tile in step ls of a segment. Rows past the matrix (the
  // last tile's, the step after a block's last) read its last row instead: their sums are not
  // stored, and the loads need no predicate or zeroing.
  struct Rows {
    const uint8_t* p[2];
  };
  auto rows_in = [&](const uint8_t* w, uint32_t rows, uint32_t tile) {
    const uint32_t row0 = tile * 16 + lg;
    Rows r;
#pragma unroll
    for (uint32_t i = 0; i < 2; ++i) r.p[i] = w + static_cast<size_t>(min(row0 + 8 * i, rows - 1)) * a.w.row_bytes;
    return r;
  };
  auto rows_of = [&](uint32_t ls) { return rows_in(view.w, view.rows, tile_in(bx, nb, ls, in_step)); };
  auto load = [&](const Rows& rows, uint32_t j, typename R::Regs& w) {
    const uint32_t col_bytes = (slice + j * wpt) * R::kBlockBytes;
#pragma unroll
    for (uint32_t r = 0; r < 2; ++r) R::load(rows.p[r] + col_bytes, r, lq, w);
  };

  // The rows of a block step lie together: one thread asks for the next step's into L2 while the
  // current one runs (step 0's are the warps' first loads: asking twice slowed 1-step calls) (weights that no earlier kernel picks only: a routed expert's call is one step
  // a block, and its pointers may be mapped host memory), so that the warps' own loads, one
  // superblock ahead, find them there.
  bool fixed_here = fixed_weights;
  auto prefetch_step = [&](uint32_t ls) {
    const uint32_t row0 = tile_in(bx, nb, ls, 0) * 16;
    if (!fixed_here || threadIdx.x != 0 || ls >= count || row0 >= view.rows) return;
    const uint32_t n = min(tiles_per_step * 16, view.rows - row0);
    prefetch_l2(view.w + static_cast<size_t>(row0) * a.w.row_bytes, static_cast<size_t>(n) * a.w.row_bytes);
  };
  prefetch_step(1);
  Rows rows = rows_of(0);
  typename R::Regs cur;
  load(rows, 0, cur);
  if (fixed_weights) pdl_wait();
  pdl_launch_dependents();
  // Flat walks read one x for every group: quantized once.
  quantize_x(a, view, matvec_part_x_up(a, g, part), tok_x, ntok, lay, smem);
  __syncthreads();

  float* partials = reinterpret_cast<float*>(smem + lay.partials_at());
  auto store = [&](uint32_t row, uint32_t t, float v) {
    const size_t yt = tok_y != nullptr ? static_cast<size_t>(tok_y[t]) : static_cast<size_t>(t);
    view.y[static_cast<size_t>(g) * a.y_group_stride + row + yt * view.y_tok_stride] = v;
  };
  const typename R::Lane lane_x(smem, lay, lg, lq, ntok);
  // ls: the segment's step; pending: the steps whose partial sums wait in half `half` of the ring.
  const uint32_t ring = lay.ring();
  uint32_t pending = 0, half = 0;
  for (uint32_t ls = 0; ls < count;) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    // The next step's rows: the segment's, or the next segment's first (flat), whose loads the
    // products below keep in flight.
    Segment next_seg{0, 0, 0, 0};
    Rows after;
    if (Flat && ls + 1 >= count && flat_at + count < flat_end) {
      next_seg = flat_segment(a, 16 * tiles_per_step, flat_at + count, flat_end);
      const MatvecPartView nv = matvec_part_view(a, next_seg.g, next_seg.part);
      after = rows_in(nv.w, nv.rows, tile_in(next_seg.from, 1, 0, in_step));
    } else {
      after = rows_of(ls + 1);
    }
    for (uint32_t j = 0; j < mine; ++j) {
      const bool same_step = j + 1 < mine;
      const uint32_t col_bytes = (slice + (same_step ? j + 1 : 0) * wpt) * R::kBlockBytes;
      const uint8_t* const next[2] = {(same_step ? rows.p[0] : after.p[0]) + col_bytes,
                                      (same_step ? rows.p[1] : after.p[1]) + col_bytes};
      R::product_reload(cur, slice + j * wpt, lane_x, lq, next, acc);
    }
    rows = after;
    prefetch_step(ls + 2);
    // acc[2r + t]: row lg + 8r, token 2 lq + t of the tile.
    if (wpt == 1) {
#pragma unroll
      for (uint32_t i = 0; i < 4; ++i) {
        const uint32_t row = tile_in(bx, nb, ls, in_step) * 16 + lg + 8 * (i >> 1), t = 2 * lq + (i & 1);
        if (row < view.rows && t < ntok) store(row, t, acc[i]);
      }
    } else {
      float* buf = partials + half * ring * lay.step_floats();
#pragma unroll
      for (uint32_t i = 0; i < 4; ++i) {
        const uint32_t t = 2 * lq + (i & 1);
        if (t < ntok) buf[pending * lay.step_floats() + (warp * a.tokens + t) * 16 + lg + 8 * (i >> 1)] = acc[i];
      }
      // The warps run on without waiting for each other until the ring's half is full or the
      // segment ends (its rows and view are needed for the stores); then every thread adds up the
      // pending steps' tiles, each in the warps' order as one step's barrier did (the same bits). A
      // half is written again only after the next barrier, which every thread passes once it has
      // finished reading it.
      if (++pending == ring || ls + 1 == count) {
        __syncthreads();
        const uint32_t per_step = tiles_per_step * ntok * 16;
        for (uint32_t idx = threadIdx.x; idx < pending * per_step; idx += kThreads) {
          const uint32_t st = idx / per_step, in = idx % per_step;
          const uint32_t at = in / (ntok * 16), t = in / 16 % ntok, rl = in % 16;
          const uint32_t row = tile_in(bx, nb, ls + 1 - pending + st, at) * 16 + rl;
          const float* sb = buf + st * lay.step_floats();
          float sum = 0.0f;
          for (uint32_t w = 0; w < wpt; ++w) sum += sb[((at * wpt + w) * a.tokens + t) * 16 + rl];
          if (row < view.rows) store(row, t, sum);
        }
        pending = 0, half ^= 1;
      }
    }
    if (!Flat || ++ls < count || next_seg.count == 0) {
      if (!Flat) ++ls;
      continue;
    }
    // On into the next segment (flat): its group's view; its first rows are loaded already.
    flat_at += count;
    part = next_seg.part, g = next_seg.g, bx = next_seg.from, nb = 1, ls = 0;
    view = matvec_part_view(a, g, part);
    count = steps_of(view.rows, bx, 1, next_seg.count);
    fixed_here = matvec_part_fixed_weights(a, part);
    prefetch_step(1);
  }
}

using Kernel = void (*)(MatvecArgs, Walk);
// The types the kernel reads: Q4_K, and Q5_K (the user's mix: its routed down + shared 34.6 -> 25.0 us
// a layer, 4,096 x 12,288 19.5 -> 15.3 us, tg64 407 -> 444 t/s, though 4,096 x 2,048 alone 5.0 -> 5.6:
// gpu/PERF.md, h82); the Q6_K, IQ4_XS and IQ3_S readers measured 3-25% slower than the dp2a kernel at
// one token (h42).
Kernel kernel_for(model::GgmlType type, bool flat = false, bool one = false) {
  if (type == model::GgmlType::Q5_K) {
    return flat ? matvec_mma_kernel<qd::kQ5_K, true, false> : matvec_mma_kernel<qd::kQ5_K, false, false>;
  }
  if (type != model::GgmlType::Q4_K) return nullptr;
  if (one) return flat ? matvec_mma_kernel<qd::kQ4_K, true, true> : matvec_mma_kernel<qd::kQ4_K, false, true>;
  return flat ? matvec_mma_kernel<qd::kQ4_K, true, false> : matvec_mma_kernel<qd::kQ4_K, false, false>;
}
Layout layout_of(const MatvecArgs& a, bool one = false) { return {a.w.cols / 32, a.tokens, one}; }

// Whether a launch takes the one-token products (K4One): Q4_K at one token where its layout fits
// (Q5_K's, its fifth bits shuffled in, measured no faster: gpu/PERF.md, h101).
bool one_token(const MatvecArgs& a) {
  return a.w.type == model::GgmlType::Q4_K && a.tokens == 1 && layout_of(a, true).bytes() <= kMaxSmem;
}

// The shared-memory opt-in, once a kernel and device; then the blocks an SM holds at `smem` bytes
// (asked once a device, kernel and size: a decode graph's capture finds them asked by its eager step).
uint32_t resident_per_sm(Kernel kernel, size_t smem) {
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

// Whether every group of every part reads one x (and SwiGLU input): one row's routed and shared gate
// and up.
bool one_x(const MatvecArgs& a) {
  bool one = a.groups < 2 || a.x_group_stride == 0 || (a.groups - 1) / a.x_group_div == 0;
  for (uint32_t p = 1; p < a.parts && p < kMaxMatvecParts; ++p) {
    const MatvecPart& m = a.more[p - 1];
    one = one && (m.x == nullptr || m.x == a.x) && (m.x_up == nullptr || m.x_up == a.x_up);
  }
  return one && a.group_count == nullptr;
}

}  // namespace

bool matvec_mma_takes(model::GgmlType type) {
  const Kernel kernel = kernel_for(type);
  return kernel != nullptr && code_built_for(reinterpret_cast<const void*>(kernel), 8);
}

bool matvec_mma_applies(const MatvecArgs& a) {
  if (!matvec_quantizes_activations(a)) return false;
  for (uint32_t p = 1; p < a.parts && p < kMaxMatvecParts; ++p) {
    if (matvec_part_own_format(a, p)) return false;  // one type a launch here
  }
  const Kernel kernel = kernel_for(a.w.type);
  // The tokens are the MMA's 8 columns (n of m16n8k32).
  return kernel != nullptr && a.tokens <= 8 && code_built_for(reinterpret_cast<const void*>(kernel), 8) &&
         layout_of(a).bytes() <= kMaxSmem;
}

void launch_matvec_mma(const MatvecArgs& a, cudaStream_t stream) {
  if (!matvec_mma_applies(a)) throw CudaError("launch_matvec_mma: no tensor-core kernel for this call");
  const bool one = one_token(a);
  const Kernel kernel = kernel_for(a.w.type, false, one);
  const size_t smem = layout_of(a, one).bytes();
  const uint32_t rows_per_block = 16 * (kWarps / warps_per_tile(a.w.cols / 256));
  // Enough blocks to fill the device once; each block quantizes its input once and loops over tiles.
  const uint32_t wanted = (matvec_max_rows(a) + rows_per_block - 1) / rows_per_block;
  const uint32_t resident = static_cast<uint32_t>(current_sm_count()) * resident_per_sm(kernel, smem);
  // The 3-D grid, shared out where that shortens the longest block, or flat where every group reads
  // one x and that shortens it further: ceil(S / N) steps.
  dim3 grid;
  Walk walk = Walk::grid;
  const SharePlan plan = share_plan(a, resident, rows_per_block);
  uint32_t longest = plan.grid_longest;
  if (plan.blocks > 0 && plan.longest < longest) {
    walk = Walk::shared_out, longest = plan.longest;
    grid = dim3(plan.blocks);
  }
  if (plan.blocks > 0 && one_x(a)) {
    uint32_t U;
    uint64_t S;
    share_totals(a, rows_per_block, U, S);
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(S, resident));
    if ((S + n - 1) / n < longest) {
      walk = Walk::flat;
      grid = dim3(n);
    }
  }
  if (walk != Walk::grid) {
  } else if (a.group_count != nullptr) {
    const uint32_t all = std::max<uint32_t>(1, resident / a.parts);
    grid = dim3(std::max(a.groups, std::min(wanted * a.groups, all)), 1, a.parts);
  } else {
    // A single part's rows go to the blocks of all groups: the grouped parts set the fill.
    const uint32_t fill = std::max<uint32_t>(1, resident / (a.groups * matvec_grouped_parts(a)));
    grid = dim3(std::min(wanted, fill), a.groups, a.parts);
    // One step a block at two blocks an SM, each warp's share of it one superblock (K <= 2,048): a block
    // an SM instead, two steps each, so that the next launch's blocks are resident beside these and ask
    // for their weights before these end (a chain of 4,096 x 2,048: 5.42 -> 4.48 us a call; at K >=
    // 4,096, or for every call, slower: gpu/PERF.md, h92). Same tiles, same bits.
    const uint32_t sms = static_cast<uint32_t>(current_sm_count());
    if (a.groups == 1 && a.parts == 1 && a.w.cols <= 2048 && grid.x > sms && wanted <= resident) grid.x = sms;
  }
  const Kernel launched = walk == Walk::flat ? kernel_for(a.w.type, true, one) : kernel;
  launch_with_pdl(launched, grid, dim3(kThreads), smem, stream, a, walk);
  FERRY_CUDA_LAUNCHED();
}

}  // namespace ferry::gpu
