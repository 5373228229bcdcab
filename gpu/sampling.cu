// Token choice on the device, one thread block per row: gpu::sample_rows's path for a vocabulary too
// large for the many-block kernel (sampling_grid.cu) to hold on the device at once. The block takes
// the argmax, and for a row with temperature > 0 draws the token of model::sample_token by the same
// rule (model/cpu/sampling_rule.hpp): the radix selects run here as block-wide passes over the row in
// global memory, and over a list of keys in shared memory once a cut (top-k, top-p, a vocabulary this
// small) leaves at most kCompactCap.
#include <climits>
#include <string>

#include "gpu/cuda_check.hpp"
#include "gpu/kernels.hpp"
#include "gpu/warp_u128.cuh"
#include "model/cpu/sampling_rule.hpp"

namespace ferry::gpu {
namespace {

namespace rule = model::sampling;
using rule::u128;
using ull = unsigned long long;

constexpr int kThreads = 1024;
constexpr uint32_t kCompactCap = 4096;
constexpr int kPerThread = kCompactCap / kThreads;
constexpr int kUnroll = 4;  // row loads in flight per thread

// Plain fields only: __shared__ variables take no constructors.
struct Shared {
  ull list[kCompactCap];  // the keys that still matter, once compact
  uint32_t count[256];
  ull mass_lo[256], mass_hi[256];
  uint32_t bucket, bucket_count, n;
  ull count_before, need_lo, need_hi, key;
  float best_v[32];
  int best_i[32];
};

// The first maximum of the row (NaN never wins; a row without a number above -inf gives token 0),
// which is the rank-0 token of the sampling order. Every thread gets it.
__device__ uint32_t block_argmax(const float* row, uint32_t vocab, Shared& sh) {
  float best = -INFINITY;
  int best_i = INT_MAX;
  for (uint32_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = row[i];
    if (v > best) {  // strided ascending scan: the first maximum seen is this thread's lowest id
      best = v;
      best_i = static_cast<int>(i);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (ov > best || (ov == best && oi < best_i)) {
      best = ov;
      best_i = oi;
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sh.best_v[warp] = best;
    sh.best_i[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) {
      if (sh.best_v[w] > best || (sh.best_v[w] == best && sh.best_i[w] < best_i)) {
        best = sh.best_v[w];
        best_i = sh.best_i[w];
      }
    }
    sh.n = best_i == INT_MAX ? 0u : static_cast<uint32_t>(best_i);
  }
  __syncthreads();
  return sh.n;
}

// The executor of rule::draw_token for one row: every thread of the block calls each method.
class BlockRow {
 public:
  __device__ BlockRow(Shared& sh, const float* row, uint32_t vocab, const rule::KeySpace& ks, const rule::WeightRule& w)
      : sh_(sh), row_(row), vocab_(vocab), ks_(ks), weight_(w) {}

  __device__ void histogram(uint64_t lb, uint64_t prefix, uint32_t left, uint32_t shift, bool by_mass) {
    by_mass_ = by_mass;
    __syncthreads();  // the previous choice has been read
    for (int b = threadIdx.x; b < 256; b += kThreads) {
      sh_.count[b] = 0;
      sh_.mass_lo[b] = 0;
      sh_.mass_hi[b] = 0;
    }
    __syncthreads();
    const uint64_t digit = (uint64_t{1} << (left - shift)) - 1;
    // Keys of one bucket are added up in a run before one atomic each: the first digits put most of
    // a row in a few buckets.
    int run = -1;
    uint32_t run_count = 0;
    u128 run_mass = 0;
    for_each_key([&](uint64_t key) {
      if (key < lb || (key >> left) != prefix) return;
      const int b = static_cast<int>((key >> shift) & digit);
      if (b != run) {
        add(run, run_count, run_mass);
        run = b;
        run_count = 0;
        run_mass = 0;
      }
      ++run_count;
      if (by_mass) run_mass += weight_(ks_.value(key));
    });
    add(run, run_count, run_mass);
    __syncthreads();
  }

  // Warp 0 scans the 256 buckets from the highest, 8 per lane; the lane holding the goal writes it.
  __device__ rule::Choice choose(const rule::Goal& goal) {
    if (threadIdx.x < 32) {
      const int lane = static_cast<int>(threadIdx.x);
      u128 mine = 0;
      ull mine_count = 0;
      for (int j = 0; j < 8; ++j) {
        const int b = 255 - 8 * lane - j;
        mine += measure(b);
        mine_count += sh_.count[b];
      }
      u128 incl = mine;
      ull incl_count = mine_count;
      for (int o = 1; o < 32; o <<= 1) {
        const u128 m = shfl_up128(incl, o);
        const ull c = __shfl_up_sync(0xffffffffu, incl_count, o);
        if (lane >= o) {
          incl += m;
          incl_count += c;
        }
      }
      const u128 want = goal.of(shfl128(incl, 31));
      u128 before = incl - mine;
      ull count_before = incl_count - mine_count;
      if (before < want && want <= incl) {
        for (int j = 0; j < 8; ++j) {
          const int b = 255 - 8 * lane - j;
          const u128 m = measure(b);
          if (want <= before + m) {
            const u128 need = want - before;
            sh_.bucket = static_cast<uint32_t>(b);
            sh_.bucket_count = sh_.count[b];
            sh_.count_before = count_before;
            sh_.need_lo = static_cast<ull>(need);
            sh_.need_hi = static_cast<ull>(need >> 64);
            break;
          }
          before += m;
          count_before += sh_.count[b];
        }
      }
    }
    __syncthreads();
    rule::Choice c;
    c.bucket = sh_.bucket;
    c.count = sh_.bucket_count;
    c.count_before = sh_.count_before;
    c.need = (static_cast<u128>(sh_.need_hi) << 64) | sh_.need_lo;
    return c;
  }

  __device__ uint64_t only_key(uint64_t lb, uint64_t prefix, uint32_t left) {
    __syncthreads();
    for_each_key([&](uint64_t key) {
      if (key >= lb && (key >> left) == prefix) sh_.key = key;  // exactly one key matches
    });
    __syncthreads();
    return sh_.key;
  }

  __device__ uint64_t first_past_lighter(uint64_t lb, uint64_t threshold) {
    __syncthreads();
    if (threadIdx.x == 0) sh_.key = 0;
    __syncthreads();
    ull best = 0;
    for_each_key([&](uint64_t key) {
      if (key >= lb && key + 1 > best && weight_(ks_.value(key)) < threshold) best = key + 1;
    });
    if (best != 0) atomicMax(&sh_.key, best);
    __syncthreads();
    return sh_.key;
  }

  // Gathers the keys >= lb into shared memory when they fit (`rank` says how many there are; a
  // compact list is filtered in place). Keys are above 0, so 0 marks an empty register.
  __device__ void narrow(uint64_t lb, uint64_t rank) {
    if (!compact_ && rank > kCompactCap) return;
    ull mine[kPerThread];
    for (int j = 0; j < kPerThread; ++j) {
      const uint32_t i = threadIdx.x + static_cast<uint32_t>(j) * kThreads;
      mine[j] = compact_ && i < n_ ? sh_.list[i] : 0;
    }
    __syncthreads();
    if (threadIdx.x == 0) sh_.n = 0;
    __syncthreads();
    auto keep = [&](uint64_t key) {
      const uint32_t at = atomicAdd(&sh_.n, 1u);
      if (at < kCompactCap) sh_.list[at] = key;
    };
    if (compact_) {
      for (int j = 0; j < kPerThread; ++j) {
        if (mine[j] != 0 && mine[j] >= lb) keep(mine[j]);
      }
    } else {
      for_each_key([&](uint64_t key) {
        if (key >= lb) keep(key);
      });
    }
    __syncthreads();
    n_ = sh_.n;
    compact_ = n_ <= kCompactCap;  // a wrong `rank` costs speed, never keys
  }

 private:
  // Calls f(key) for every key of the current view, each on one thread.
  template <class F>
  __device__ void for_each_key(F&& f) const {
    if (compact_) {
      for (uint32_t i = threadIdx.x; i < n_; i += kThreads) f(sh_.list[i]);
      return;
    }
    for (uint32_t base = 0; base < vocab_; base += kUnroll * kThreads) {
      float v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const uint32_t i = base + static_cast<uint32_t>(u) * kThreads + threadIdx.x;
        v[u] = i < vocab_ ? row_[i] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const uint32_t i = base + static_cast<uint32_t>(u) * kThreads + threadIdx.x;
        if (i < vocab_) f(ks_.key(v[u], i));
      }
    }
  }

  __device__ u128 measure(int b) const {
    return by_mass_ ? (static_cast<u128>(sh_.mass_hi[b]) << 64) | sh_.mass_lo[b] : static_cast<u128>(sh_.count[b]);
  }

  // A 128-bit add into shared memory as two 64-bit atomics and a carry.
  __device__ void add(int b, uint32_t count, u128 mass) {
    if (count == 0) return;
    atomicAdd(&sh_.count[b], count);
    if (!by_mass_) return;
    const ull lo = static_cast<ull>(mass);
    ull hi = static_cast<ull>(mass >> 64);
    if (atomicAdd(&sh_.mass_lo[b], lo) + lo < lo) ++hi;
    if (hi != 0) atomicAdd(&sh_.mass_hi[b], hi);
  }

  Shared& sh_;
  const float* row_;
  uint32_t vocab_;
  rule::KeySpace ks_;
  rule::WeightRule weight_;
  bool compact_ = false;
  bool by_mass_ = false;
  uint32_t n_ = 0;
};

__global__ void __launch_bounds__(kThreads) sample_kernel(const float* logits, uint32_t vocab, const SampleRow* rows,
                                                          int32_t* out) {
  __shared__ Shared sh;
  const SampleRow r = rows[blockIdx.x];
  const float* row = logits + static_cast<size_t>(r.logit_row) * vocab;
  const uint32_t top = block_argmax(row, vocab, sh);
  if (!(r.temperature > 0.0f)) {
    if (threadIdx.x == 0) out[blockIdx.x] = static_cast<int32_t>(top);
    return;
  }
  const rule::KeySpace ks(vocab);
  BlockRow ex(sh, row, vocab, ks, rule::WeightRule(ks.value(ks.key(row[top], top)), r.temperature));
  ex.narrow(0, vocab);
  const uint32_t token =
      rule::draw_token(ex, ks, vocab, r.top_k, r.top_p, r.min_p, rule::draw_bits(r.seed, r.position));
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<int32_t>(token);
}

}  // namespace

void sample_rows_by_block(const float* logits, uint32_t vocab, const SampleRow* rows, uint32_t n, int32_t* out,
                          cudaStream_t stream) {
  if (n == 0) return;
  if (vocab == 0 || vocab > (1u << 31)) throw CudaError("sample_rows_by_block: a vocabulary of " + std::to_string(vocab) + " ids");
  sample_kernel<<<n, kThreads, 0, stream>>>(logits, vocab, rows, out);
  FERRY_CUDA_LAUNCHED();
}

}  // namespace ferry::gpu
