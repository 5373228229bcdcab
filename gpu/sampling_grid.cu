// Token choice on the device over many blocks per row. Each block holds kBlockKeys of the row's keys
// (and, for a drawn row, their weights) in registers, computed once; every pass of the radix selects of
// model/cpu/sampling_rule.hpp is a per-block histogram added into one in global memory, a barrier among
// the row's blocks, and the same choice made by every block from that sum. The sums are of the rule's
// integer weights, so the order the blocks add in changes nothing: the tokens are the CPU's.
// The barrier spins, so a row's blocks must be resident together: a launch takes at most the blocks
// the device holds at once, and a vocabulary that needs more takes the one-block path (sampling.cu).
#include <algorithm>
#include <array>
#include <atomic>
#include <string>

#include "gpu/cuda_check.hpp"
#include "gpu/kernels.hpp"
#include "gpu/sample_scratch.hpp"
#include "model/cpu/sampling_rule.hpp"

namespace ferry::gpu {
namespace {

namespace rule = model::sampling;
using rule::u128;
using ull = unsigned long long;

constexpr int kThreads = 512;
constexpr int kPer = 8;  // keys a thread holds
constexpr uint32_t kBlockKeys = uint32_t{kThreads} * kPer;
constexpr uint32_t kMaxRows = 8;  // rows of one launch: the scratch holds this many
// Barriers of one row: the argmax, up to 8 digits of a 63-bit key for each of the three selects
// (top-k, top-p, the draw), and min-p's.
constexpr int kPasses = 1 + 3 * 8 + 1;
constexpr unsigned kAll = 0xffffffffu;

// One pass's histogram summed over a row's blocks: a block's weight W of a bucket adds W mod 2^32 to lo
// and W >> 32 to hi (the bucket's weight is lo + hi * 2^32); neither sum can wrap for 2^31 keys.
struct Pass {
  uint32_t count[256];
  ull lo[256], hi[256];
  ull top[256];  // a key of the bucket, stored by each block that has one: the key when count is 1
};
struct RowScratch {
  unsigned arrived;  // blocks at a barrier, over the whole launch
  unsigned exited;
  Pass pass[kPasses];
};

// A block's histogram. Shared-memory atomics on 64 bits are compare-and-swap loops, slow when many
// warps hit one bucket, so a bucket's weight is a 96-bit number in three 32-bit words (m0 low) added
// with carries, and its key is stored, not maxed: it is read only when the bucket holds one key.
struct Local {
  uint32_t count[256];
  uint32_t m0[256], m1[256], m2[256];
  ull top[256];
  ull group_w[kThreads], group_k[kThreads];  // a warp's weights and keys, for the lowest lane of a bucket
  uint32_t bucket, bucket_count;
  ull count_before, need_lo, need_hi, only;
};

// Reads of what other blocks added: from L2, past this SM's L1 (ld.global.cg).
__device__ uint32_t load_l2(const uint32_t& x) {
  uint32_t v;
  asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(&x));
  return v;
}
__device__ ull load_l2(const ull& x) {
  ull v;
  asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(v) : "l"(&x));
  return v;
}

__device__ ull warp_max_u64(ull v) {
  for (int o = 16; o > 0; o >>= 1) {
    const ull other = __shfl_xor_sync(kAll, v, o);
    v = other > v ? other : v;
  }
  return v;
}
__device__ ull warp_sum_u64(ull v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kAll, v, o);
  return v;
}

__device__ u128 shfl_up128(u128 v, int by) {
  const ull lo = __shfl_up_sync(kAll, static_cast<ull>(v), by);
  const ull hi = __shfl_up_sync(kAll, static_cast<ull>(v >> 64), by);
  return (static_cast<u128>(hi) << 64) | lo;
}
__device__ u128 shfl128(u128 v, int lane) {
  const ull lo = __shfl_sync(kAll, static_cast<ull>(v), lane);
  const ull hi = __shfl_sync(kAll, static_cast<ull>(v >> 64), lane);
  return (static_cast<u128>(hi) << 64) | lo;
}

// The executor of rule::draw_token for one row's blocks: every thread of each of them calls each
// method, in the same order, so every block passes the same barriers.
class GridRow {
 public:
  __device__ GridRow(Local& sh, RowScratch& g, uint32_t blocks, bool first) : sh_(sh), g_(g), blocks_(blocks), first_(first) {}

  __device__ void load(const float* row, uint32_t vocab, uint32_t begin, const rule::KeySpace& ks) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const uint32_t i = begin + static_cast<uint32_t>(j * kThreads) + threadIdx.x;
      key_[j] = i < vocab ? ks.key(row[i], i) : 0;  // keys are above 0: 0 is an empty register
    }
  }

  // The row's largest key, the rank-0 token of the sampling order (pass 0).
  __device__ ull max_key() {
    ull m = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) m = key_[j] > m ? key_[j] : m;
    m = warp_max_u64(m);
    if ((threadIdx.x & 31) == 0 && m != 0) atomicMax(&g_.pass[0].top[0], m);
    barrier();
    return load_l2(g_.pass[0].top[0]);
  }

  __device__ void weigh(const rule::WeightRule& weight, const rule::KeySpace& ks) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) w_[j] = key_[j] != 0 ? weight(ks.value(key_[j])) : 0;
  }

  __device__ void histogram(uint64_t lb, uint64_t prefix, uint32_t left, uint32_t shift, bool by_mass) {
    Pass& p = next_pass();
    by_mass_ = by_mass;
    __syncthreads();  // the previous choice has been read
    for (int b = threadIdx.x; b < 256; b += kThreads) sh_.count[b] = sh_.m0[b] = sh_.m1[b] = sh_.m2[b] = 0;
    __syncthreads();
    const uint64_t digit = (uint64_t{1} << (left - shift)) - 1;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const ull k = key_[j];
      const bool in = k != 0 && k >= lb && (k >> left) == prefix;
      add_grouped(in ? static_cast<int>((k >> shift) & digit) : -1, by_mass ? w_[j] : 0, k);
    }
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += kThreads) {
      if (sh_.count[b] == 0) continue;
      atomicAdd(&p.count[b], sh_.count[b]);
      if (sh_.m0[b] != 0) atomicAdd(&p.lo[b], ull{sh_.m0[b]});
      const ull hi = sh_.m1[b] | (ull{sh_.m2[b]} << 32);
      if (hi != 0) atomicAdd(&p.hi[b], hi);
      *reinterpret_cast<volatile ull*>(&p.top[b]) = sh_.top[b];  // the one writer when the row's count is 1
    }
    barrier();
  }

  // Warp 0 scans the summed buckets from the highest, 8 per lane; the lane holding the goal writes it.
  __device__ rule::Choice choose(const rule::Goal& goal) {
    const Pass& p = g_.pass[pass_];
    if (threadIdx.x < 32) {
      const int lane = static_cast<int>(threadIdx.x);
      u128 m[8];
      uint32_t c[8];
      u128 mine = 0;
      ull mine_count = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int b = 255 - 8 * lane - j;
        c[j] = load_l2(p.count[b]);
        m[j] = by_mass_ ? static_cast<u128>(load_l2(p.lo[b])) + (static_cast<u128>(load_l2(p.hi[b])) << 32) : u128{c[j]};
        mine += m[j];
        mine_count += c[j];
      }
      u128 incl = mine;
      ull incl_count = mine_count;
      for (int o = 1; o < 32; o <<= 1) {
        const u128 up = shfl_up128(incl, o);
        const ull cu = __shfl_up_sync(kAll, incl_count, o);
        if (lane >= o) {
          incl += up;
          incl_count += cu;
        }
      }
      const u128 want = goal.of(shfl128(incl, 31));
      u128 before = incl - mine;
      ull count_before = incl_count - mine_count;
      if (before < want && want <= incl) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (want <= before + m[j]) {
            const int b = 255 - 8 * lane - j;
            const u128 need = want - before;
            sh_.bucket = static_cast<uint32_t>(b);
            sh_.bucket_count = c[j];
            sh_.count_before = count_before;
            sh_.need_lo = static_cast<ull>(need);
            sh_.need_hi = static_cast<ull>(need >> 64);
            sh_.only = load_l2(p.top[b]);
            break;
          }
          before += m[j];
          count_before += c[j];
        }
      }
    }
    __syncthreads();
    rule::Choice ch;
    ch.bucket = sh_.bucket;
    ch.count = sh_.bucket_count;
    ch.count_before = sh_.count_before;
    ch.need = (static_cast<u128>(sh_.need_hi) << 64) | sh_.need_lo;
    return ch;
  }

  // Called right after a choice of a bucket holding one key: the histogram kept it.
  __device__ uint64_t only_key(uint64_t, uint64_t, uint32_t) const { return sh_.only; }

  __device__ uint64_t first_past_lighter(uint64_t lb, uint64_t threshold) {
    Pass& p = next_pass();
    ull best = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const ull k = key_[j];
      if (k != 0 && k >= lb && k + 1 > best && w_[j] < threshold) best = k + 1;
    }
    best = warp_max_u64(best);
    if ((threadIdx.x & 31) == 0 && best != 0) atomicMax(&p.top[0], best);
    barrier();
    return load_l2(p.top[0]);
  }

  // Every pass skips the keys below its lb already.
  __device__ void narrow(uint64_t, uint64_t) {}

  // The last block of the row to leave resets what the next launch expects zero.
  __device__ void leave() {
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      if (atomicAdd(&g_.exited, 1u) == blocks_ - 1) {
        g_.pass[0].top[0] = 0;
        g_.arrived = 0;
        g_.exited = 0;
        __threadfence();
      }
    }
  }

 private:
  __device__ Pass& next_pass() {
    if (++pass_ >= kPasses) __trap();  // draw_token passes at most kPasses barriers
    return g_.pass[pass_];
  }

  // Adds key k (bucket b, -1 for none) of every lane. Lanes of one bucket are summed in the warp
  // first, since the first digits put most of a row in a few buckets: a whole-warp bucket by shuffles,
  // smaller groups by their lowest lane reading its peers' weights from shared memory.
  __device__ void add_grouped(int b, ull w, ull k) {
    if (__ballot_sync(kAll, b >= 0) == 0) return;
    const unsigned peers = __match_any_sync(kAll, b);
    const int lane = static_cast<int>(threadIdx.x & 31);
    if (__all_sync(kAll, peers == kAll)) {  // every lane in bucket b
      const ull lo = warp_sum_u64(w & 0xffffffffull), hi = warp_sum_u64(w >> 32), top = warp_max_u64(k);
      if (lane == 0) add_local(b, 32, lo, hi, top);
      return;
    }
    const unsigned base = threadIdx.x & ~31u;
    sh_.group_w[threadIdx.x] = w;
    sh_.group_k[threadIdx.x] = k;
    __syncwarp();
    if (b >= 0 && lane == __ffs(peers) - 1) {
      ull lo = 0, hi = 0, top = 0;
      for (unsigned m = peers; m != 0; m &= m - 1) {
        const unsigned i = base + static_cast<unsigned>(__ffs(m) - 1);
        const ull wi = sh_.group_w[i], ki = sh_.group_k[i];
        lo += wi & 0xffffffffull;
        hi += wi >> 32;
        top = ki > top ? ki : top;
      }
      add_local(b, static_cast<uint32_t>(__popc(peers)), lo, hi, top);
    }
    __syncwarp();
  }

  // Adds `count` keys of weight lo + hi * 2^32 (lo, hi < 2^37) and one of their keys to bucket b.
  __device__ void add_local(int b, uint32_t count, ull lo, ull hi, ull top) {
    atomicAdd(&sh_.count[b], count);
    sh_.top[b] = top;
    if ((lo | hi) == 0) return;
    const auto v0 = static_cast<uint32_t>(lo);
    const ull rest = (lo >> 32) + hi;
    const auto v1 = static_cast<uint32_t>(rest);
    uint32_t v2 = static_cast<uint32_t>(rest >> 32);
    if (v0 != 0 && atomicAdd(&sh_.m0[b], v0) > ~v0) {  // the low word wrapped: carry 1 into m1
      if (atomicAdd(&sh_.m1[b], 1u) == ~0u) ++v2;
    }
    if (v1 != 0 && atomicAdd(&sh_.m1[b], v1) > ~v1) ++v2;
    if (v2 != 0) atomicAdd(&sh_.m2[b], v2);
  }

  // Block 0 clears the next pass's sums before arriving: nobody adds into them until all have arrived.
  __device__ void barrier() {
    if (first_ && pass_ + 1 < kPasses) {
      Pass& n = g_.pass[pass_ + 1];
      for (int b = threadIdx.x; b < 256; b += kThreads) {
        n.count[b] = 0;
        n.lo[b] = n.hi[b] = n.top[b] = 0;
      }
    }
    // The block's writes are ordered before thread 0's release by the block barrier, and the other
    // blocks' before this block's reads by its acquire and the barrier after it.
    __syncthreads();
    if (threadIdx.x == 0) {
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(&g_.arrived) : "memory");
      const unsigned target = blocks_ * static_cast<unsigned>(pass_ + 1);
      unsigned seen = 0;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(&g_.arrived) : "memory");
      } while (seen < target);
    }
    __syncthreads();
  }

  Local& sh_;
  RowScratch& g_;
  uint32_t blocks_;
  bool first_;
  int pass_ = 0;
  bool by_mass_ = false;
  ull key_[kPer];
  ull w_[kPer] = {};
};

__global__ void __launch_bounds__(kThreads) sample_grid_kernel(const float* logits, uint32_t vocab, const SampleRow* rows,
                                                               int32_t* out, RowScratch* scratch, uint32_t blocks) {
  __shared__ Local sh;
  const uint32_t r = blockIdx.x / blocks, part = blockIdx.x % blocks;
  const SampleRow row = rows[r];
  const rule::KeySpace ks(vocab);
  GridRow ex(sh, scratch[r], blocks, part == 0);
  ex.load(logits + static_cast<size_t>(row.logit_row) * vocab, vocab, part * kBlockKeys, ks);
  const ull top = ex.max_key();
  uint32_t token = ks.id(top);
  if (row.temperature > 0.0f) {
    ex.weigh(rule::WeightRule(ks.value(top), row.temperature), ks);
    token = rule::draw_token(ex, ks, vocab, row.top_k, row.top_p, row.min_p, rule::draw_bits(row.seed, row.position));
  }
  if (part == 0 && threadIdx.x == 0) out[r] = static_cast<int32_t>(token);
  ex.leave();
}

// Blocks of the grid kernel the current device holds at once (cached for the first 64 devices).
uint32_t resident_blocks() {
  static std::array<std::atomic<uint32_t>, 64> cache{};
  int dev = 0;
  FERRY_CUDA(cudaGetDevice(&dev));
  std::atomic<uint32_t>* slot = dev < 64 ? &cache[static_cast<size_t>(dev)] : nullptr;
  if (slot != nullptr && slot->load(std::memory_order_relaxed) != 0) return slot->load(std::memory_order_relaxed);
  int per_sm = 0, sms = 0;
  FERRY_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, sample_grid_kernel, kThreads, 0));
  FERRY_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const auto n = static_cast<uint32_t>(std::max(per_sm, 0) * std::max(sms, 0));
  if (slot != nullptr) slot->store(n, std::memory_order_relaxed);
  return n;
}

}  // namespace

static_assert(sizeof(RowScratch) * kMaxRows <= kSampleScratchBytes, "the memory plan counts kSampleScratchBytes");
size_t sample_scratch_bytes() { return kSampleScratchBytes; }

void sample_rows(const float* logits, uint32_t vocab, const SampleRow* rows, uint32_t n, int32_t* out, void* scratch,
                 cudaStream_t stream) {
  if (n == 0) return;
  if (vocab == 0 || vocab > (1u << 31)) throw CudaError("sample_rows: a vocabulary of " + std::to_string(vocab) + " ids");
  const uint32_t blocks = (vocab - 1) / kBlockKeys + 1;
  const uint32_t per_launch = std::min(kMaxRows, resident_blocks() / blocks);
  if (per_launch == 0) {
    sample_rows_by_block(logits, vocab, rows, n, out, stream);
    return;
  }
  if (scratch == nullptr) throw CudaError("sample_rows: no scratch (sample_scratch_bytes(), zeroed)");
  for (uint32_t i = 0; i < n; i += per_launch) {
    const uint32_t cnt = std::min(per_launch, n - i);
    sample_grid_kernel<<<cnt * blocks, kThreads, 0, stream>>>(logits, vocab, rows + i, out + i,
                                                              static_cast<RowScratch*>(scratch), blocks);
    FERRY_CUDA_LAUNCHED();
  }
}

}  // namespace ferry::gpu
