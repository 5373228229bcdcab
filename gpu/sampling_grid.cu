// Token choice on the device over many blocks per row. Each block holds kBlockKeys of the row's keys
// (and, for a drawn row, their weights) in registers, computed once; every pass of the radix selects of
// model/cpu/sampling_rule.hpp is a per-block histogram added into one in global memory, a barrier among
// the row's blocks, and the same choice made by every block from that sum. The sums are of the rule's
// integer weights, so the order the blocks add in changes nothing: the tokens are the CPU's.
// The barrier spins, so a row's blocks must be resident together: a launch takes at most the blocks
// the device holds at once, and a vocabulary that needs more takes the one-block path (sampling.cu).
//
// A drawn row first takes one histogram of (value - top) / T in 256 buckets of an eighth each. Every
// cut the rule makes (top-k, top-p, min-p, the draw) keeps an upper set of keys, so the first bucket
// reaching the first cut's goal bounds the keys that matter. When they fit in one block (kBlockKeys),
// they are gathered into a list (during the histogram already for keys within 16 T of the top, else in
// one more pass), and the row's first block runs the rule on that list alone, in registers and shared
// memory, with no more barriers (model/cpu/sampling_list.hpp): each select finds its value bucket in
// the histogram and its key within that bucket, by counting ranks for a bucket of few keys, else by
// radix passes over the bucket's keys. A top-p nucleus too large for that lists only top-p's bucket
// and the buckets the draw can reach (a band), which are all the walk looks in. Otherwise the row
// goes on with the radix passes over all blocks, unless each of its cuts falls in a value bucket of one
// value (rows of ties): then the first block decides the row from the value histogram alone
// (model/cpu/sampling_buckets.hpp), finding the i-th id of a run of ties from per-block counts of its
// bucket and one read of the block's logits. The sizes, the scratch and the shared memory are in
// sampling_grid_state.cuh. Over 800 lines: one kernel's executor, its parts share its registers and
// shared memory (out of line, as calls, they measured ~7 us slower a launch: gpu/PERF.md, h43).
// The launch's first block marks its phases (GridRow::mark: after the load, the arg-max, the
// weights, the value histogram and its barrier, the plan, the list, each scan and select of a list
// or walk, each key of a walk, the end), which sample_phases reads for the timing tests.
#include <algorithm>
#include <array>
#include <atomic>
#include <string>

#include "gpu/cuda_check.hpp"
#include "gpu/kernels.hpp"
#include "gpu/sample_scratch.hpp"
#include "gpu/sampling_grid_state.cuh"
#include "gpu/warp_u128.cuh"
#include "model/cpu/sampling_buckets.hpp"
#include "model/cpu/sampling_list.hpp"
#include "model/cpu/sampling_rule.hpp"

namespace ferry::gpu {
namespace {

namespace rule = model::sampling;
using rule::u128;
using ull = unsigned long long;

using namespace sample_grid;
using rule::ValueBuckets;

// The executor of rule::draw_token for one row's blocks: every thread of each of them calls each
// method, in the same order, so every block passes the same barriers.
class GridRow {
 public:
  __device__ GridRow(Local& sh, RowScratch& g, uint32_t blocks, bool first, uint32_t bits)
      : sh_(sh), g_(g), blocks_(blocks), first_(first), bits_(bits) {}

  // A phase mark of the launch's first block (sample_phases reads them): thread 0's SM clock, counted
  // in shared memory so that no register is held for it across the kernel.
  __device__ void mark(bool first = false) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const unsigned n = first ? 0 : sh_.marks;
    if (n >= kMarks) return;
    g_.mark_clock[n] = clock64();
    sh_.marks = n + 1;
    g_.marks = n + 1;
  }

  __device__ void load(const float* row, uint32_t vocab, uint32_t begin, const rule::KeySpace& ks) {
    if (threadIdx.x == 0) {  // read after max_key's barrier
      sh_.row = row;
      sh_.vocab = vocab;
    }
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
    by_mass_ = by_mass;
    clear_local();
    const uint64_t digit = (uint64_t{1} << (left - shift)) - 1;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const ull k = key_[j];
      const bool in = k != 0 && k >= lb && (k >> left) == prefix && ((view_ >> j) & 1u) != 0;
      add_grouped(in ? static_cast<int>((k >> shift) & digit) : -1, by_mass ? w_[j] : 0, k, false);
    }
    if (local_) {
      __syncthreads();
      return;
    }
    publish(next_pass(), false);
  }

  // The value histogram's choices (the plan, the walks, a list's scans) read its sums cached after its
  // barrier; a radix pass's sums its histogram first: this block's (a list's) or the row's in L2.
  __device__ rule::Choice choose(const rule::Goal& goal) {
    if (!local_ && pass_ == 1) return pick(sh_.value_sums, goal, by_mass_, -1, 0);
    uint32_t c = 0;
    u128 m = 0;
    ull top = 0;
    if (threadIdx.x < 256) {
      const int b = 255 - static_cast<int>(threadIdx.x);
      if (local_) {
        c = sh_.count[b];
        m = static_cast<u128>(sh_.m0[b]) + (static_cast<u128>(sh_.m1[b]) << 32) + (static_cast<u128>(sh_.m2[b]) << 64);
        top = sh_.top[b];
      } else {
        const Pass& p = g_.pass[pass_];
        c = load_l2(p.count[b]);
        m = static_cast<u128>(load_l2(p.lo[b])) + (static_cast<u128>(load_l2(p.hi[b])) << 32);
        top = load_l2(p.top[b]);
      }
    }
    sum_above(sh_.pass_sums, c, m, top);
    return pick(sh_.pass_sums, goal, by_mass_, -1, 0);
  }

  // Called right after a choice of a bucket holding one key: the histogram kept it.
  __device__ uint64_t only_key(uint64_t, uint64_t, uint32_t) const { return only_; }

  // min-p's pass over all blocks (list_draw takes the whole row's answer from the value histogram).
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

  // The value histogram of a drawn row and the way it goes on (see the top of the file). all_blocks:
  // the radix passes over all blocks. list: the first block now holds the list (all keys of the value
  // buckets list_draw looks in) and draws with list_draw; elsewhere: another block does.
  __device__ Way shortcut(const SampleRow& row, uint32_t vocab, const rule::KeySpace& ks, const rule::WeightRule& wr,
                          uint64_t bits) {
    const ValueBuckets vb(wr);
    const uint64_t light = row.min_p > 0.0f ? rule::min_p_weight(row.min_p) : 0;
    by_mass_ = true;
    clear_local();
    ull past = 0;
    // Bucket 0 (keys 32 T or more below the top: most of a row at a low temperature) is summed in
    // registers, then once a warp: every warp's adds would meet there. The other buckets hold a few
    // keys of a warp at most, on most rows, so each lane adds its own.
    ull n0 = 0, lo0 = 0, hi0 = 0, top0 = 0, low0 = ~0ull;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const ull k = key_[j];
      int b = k != 0 ? vb(ks.value(k)) : -1;
      if (b == 0) {
        ++n0;
        lo0 += w_[j] & 0xffffffffull;
        hi0 += w_[j] >> 32;
        top0 = k > top0 ? k : top0;
        low0 = k < low0 ? k : low0;
        b = -1;
      }
      add_each(b, w_[j], k);
      if (k != 0 && w_[j] < light && k + 1 > past) past = k + 1;
    }
    if (__any_sync(kAll, n0 != 0)) {
      n0 = warp_sum_u64(n0);
      lo0 = warp_sum_u64(lo0);
      hi0 = warp_sum_u64(hi0);
      top0 = warp_max_u64(top0);
      low0 = warp_min_u64(low0);
      if ((threadIdx.x & 31) == 0) add_local(0, static_cast<uint32_t>(n0), lo0, hi0, top0, low0, true);
    }
    past = warp_max_u64(past);
    if ((threadIdx.x & 31) == 0 && past != 0) atomicMax(&g_.past, past);
    gather(vb, ks, Band{kSpecBucket, kSpecBucket, 255}, g_.listed_early);
    if (threadIdx.x == 0) {  // read after publish's barrier
      sh_.wr_top = wr.top;
      sh_.wr_inv_t = wr.inv_t;
    }
    mark();
    publish(next_pass(), true);
    cache_values();
    mark();
    if (light != 0) past_ = load_l2(g_.past);

    // The bucket of the first cut: every key the rule looks at after it is in that bucket or above.
    const bool top_k = row.top_k > 0 && row.top_k < vocab;
    int cut;
    rule::Choice nucleus;
    if (top_k) {
      by_mass_ = false;
      cut = static_cast<int>(choose(rule::Goal::exactly(row.top_k)).bucket);
      by_mass_ = true;
    } else if (row.top_p < 1.0f) {
      const uint64_t tp = row.top_p > 0.0f ? static_cast<uint64_t>(ldexp(static_cast<double>(row.top_p), 32)) : 0;
      nucleus = choose(rule::Goal{rule::Goal::top_p, tp, 0});
      cut = static_cast<int>(nucleus.bucket);
    } else if (light != 0 && past_ != 0) {
      cut = vb(ks.value(past_));  // at most the bucket of any key >= past_
    } else {
      cut = static_cast<int>(choose(rule::Goal{rule::Goal::draw, bits, 0}).bucket);
    }
    const Tally from_cut = above(cut);
    mark();
    ull listed = 0;  // keys in the list
    if (cut >= kSpecBucket && above(kSpecBucket).count <= kBlockKeys) {
      listed = above(kSpecBucket).count;
    } else if (walk(row, vocab, bits, cut)) {
      return first_ ? Way::buckets : Way::elsewhere;
    } else if (from_cut.count <= kBlockKeys) {
      gather(vb, ks, Band{cut, cut, 255}, g_.listed);
      next_pass();
      barrier();
      listed = from_cut.count;
    } else if (!top_k && row.top_p < 1.0f && light == 0) {
      // A nucleus of more keys than a block holds: top-p's key is in bucket `cut`, and the draw's in
      // the buckets its goal can reach for any total between (keys above cut) + need and (keys of cut
      // and above). Those buckets are listed when they fit.
      const u128 over = above(cut + 1).mass, cut_mass = from_cut.mass - over;
      const u128 least = rule::scale_by_draw(bits, over + nucleus.need) + 1;
      const u128 most = rule::scale_by_draw(bits, over + cut_mass) + 1;
      const int hi = static_cast<int>(choose(rule::Goal::exactly(least)).bucket);
      const int lo = static_cast<int>(choose(rule::Goal::exactly(most)).bucket);
      // The keys of lo..hi, and of cut when it is below lo.
      listed = above(lo).count - above(hi + 1).count + (lo > cut ? from_cut.count - above(cut + 1).count : 0);
      if (listed > kBlockKeys) return Way::all_blocks;
      gather(vb, ks, Band{cut, lo, hi}, g_.listed);
      next_pass();
      barrier();
    } else {
      return Way::all_blocks;
    }
    if (!first_) return Way::elsewhere;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const uint32_t i = static_cast<uint32_t>(j * kThreads) + threadIdx.x;
      key_[j] = i < listed ? load_l2(g_.list[i]) : 0;
    }
    weigh(wr, ks);
    local_ = true;
    mark();
    return Way::list;
  }

  // Every pass skips the keys below its lb already.
  __device__ void narrow(uint64_t, uint64_t) {}

  // The bucket walk (model/cpu/sampling_buckets.hpp) when the first cut's value bucket holds one value:
  // the first block finds the keys, the others only plan, with the same answer, so all of them leave
  // for the radix passes together when it does not hold.
  __device__ bool walk(const SampleRow& row, uint32_t vocab, uint64_t bits, int cut) {
    if (blocks_ > kCountedBlocks || !one_value(cut)) return false;
    const rule::BucketDraw d = rule::bucket_draw(*this, vocab, row.top_k, row.top_p, row.min_p, bits, first_);
    walked_ = d.key;
    return d.ok;
  }
  __device__ uint64_t walked() const { return walked_; }

  // list_draw's select within value bucket b, all of whose keys the first block holds. The radix
  // passes of select_key on this block, but from the first bit where b's values differ (the value
  // histogram's range of b) and only while the keys left hold more than kRankKeys: those are
  // gathered in shared memory and each key's count and weight over those at or above it counted by
  // kRankLanes threads. Any digits give the same key: it is the one where the goal is reached.
  __device__ rule::Within select_in(int b, uint64_t lb, u128 need, bool by_mass) {
    mark();
    view(ValueBuckets(weight_rule()), rule::KeySpace(sh_.vocab), b);
    const uint32_t vhi = sh_.value_max[b], vlo = ~sh_.value_low[b];
    const auto common = static_cast<uint32_t>(__clz(static_cast<int>(vhi ^ vlo)));
    uint32_t left = bits_ - common;  // keys of b agree above bit `left`
    uint64_t prefix = common == 0 ? 0 : vhi >> (32 - common);
    uint64_t count = this->count(b);  // at least the keys left
    int passes = 0;
    while (count > kRankKeys) {
      const uint32_t shift = left > 8 ? left - 8 : 0;
      histogram(lb, prefix, left, shift, by_mass);
      const rule::Choice c = choose(rule::Goal::exactly(need));
      prefix = (prefix << (left - shift)) | c.bucket;
      need = c.need;
      left = shift;
      count = c.count;
      ++passes;
      if (count == 1) {
        rule::Within s;
        s.key = left > 0 ? only_ : prefix;
        s.at = measure_view(s.key);
        return s;
      }
    }
    __syncthreads();  // the previous users of group_k / group_w and sel_* are done
    if (threadIdx.x == 0) {
      sh_.rank_n = 0;
      sh_.sel_key = 0;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (((view_ >> j) & 1u) != 0 && key_[j] >= lb && (key_[j] >> left) == prefix) {
        const unsigned i = atomicAdd(&sh_.rank_n, 1u);
        if (i < kRankKeys) {
          sh_.group_k[i] = key_[j];
          sh_.group_w[i] = w_[j];
        }
      }
    }
    __syncthreads();
    const unsigned m = sh_.rank_n;
    if (m > kRankKeys) __trap();  // the histograms counted at most kRankKeys keys left
    // Key q's count and weight over the keys at or above it: its four threads take a quarter each.
    const unsigned q = threadIdx.x / kRankLanes, part = threadIdx.x % kRankLanes;
    ull n = 0;
    u128 c = 0;
    if (q < m) {
      const ull k = sh_.group_k[q];
      for (unsigned i = part; i < m; i += kRankLanes) {
        if (sh_.group_k[i] >= k) {
          ++n;
          c += sh_.group_w[i];
        }
      }
    }
    for (unsigned o = 1; o < kRankLanes; o <<= 1) {
      n += __shfl_xor_sync(kAll, n, o);
      c += shfl_xor128(c, static_cast<int>(o));
    }
    if (q < m && part == 0) {
      const ull k = sh_.group_k[q], wk = sh_.group_w[q];
      // Keys are distinct, so one of them is where the goal is reached.
      if (by_mass ? (c - wk < need && need <= c) : u128{n} == need) {
        sh_.sel_key = k;
        sh_.sel_n = n;
        sh_.sel_lo = static_cast<ull>(c);
        sh_.sel_hi = static_cast<ull>(c >> 64);
      }
    }
    __syncthreads();
    if (sh_.sel_key == 0) __trap();  // a goal beyond the keys left: the list missed some
    rule::Within s;
    s.key = sh_.sel_key;
    if (passes > 0) {  // counted among the keys left, not the bucket's
      s.at = measure_view(s.key);
      return s;
    }
    s.at.n = sh_.sel_n;
    s.at.mass = (static_cast<u128>(sh_.sel_hi) << 64) | sh_.sel_lo;
    return s;
  }

  // list_draw's measure of value bucket b's keys >= lb.
  __device__ rule::Measure measure_in(int b, uint64_t lb) {
    view(ValueBuckets(weight_rule()), rule::KeySpace(sh_.vocab), b);
    return measure_view(lb);
  }

  // The walk's executor, over the value histogram (pass 1) summed over the row's blocks.
  __device__ rule::Choice scan(const rule::Goal& goal, bool by_mass, int low, u128 low_measure) {
    mark();
    return pick(sh_.value_sums, goal, by_mass, low, low_measure);
  }
  __device__ uint64_t count(int b) const { return above(b).count - above(b + 1).count; }
  __device__ u128 mass(int b) const { return above(b).mass - above(b + 1).mass; }
  __device__ bool one_value(int b) const { return count(b) != 0 && sh_.value_max[b] == ~sh_.value_low[b]; }
  __device__ uint64_t weight(int b) const { return weight_rule()(rule::order_value(sh_.value_max[b])); }
  __device__ uint64_t past() const { return past_; }
  __device__ int bucket_of(uint64_t key) const {
    return ValueBuckets(weight_rule())(rule::order_value(static_cast<uint32_t>(key >> (bits_ - 32))));
  }

  // The i-th largest key of one-value bucket b (1-based): the i-th lowest id of its value. The block
  // holding it from the per-block counts of b, then its rank there from the block's logits. Every
  // thread of the first block calls it.
  __device__ uint64_t nth_key(int b, uint64_t i) {
    __syncthreads();  // the previous answer has been read
    if (threadIdx.x < 32) {
      const uint32_t lane = threadIdx.x, p0 = 2 * lane, p1 = p0 + 1;
      const ull c0 = p0 < blocks_ ? load_l2(g_.block_count[p0][b]) : 0;
      const ull c1 = p1 < blocks_ ? load_l2(g_.block_count[p1][b]) : 0;
      ull incl = c0 + c1;
      for (int o = 1; o < 32; o <<= 1) {
        const ull up = __shfl_up_sync(kAll, incl, o);
        if (static_cast<int>(lane) >= o) incl += up;
      }
      const ull before = incl - c0 - c1;
      if (before < i && i <= incl) {
        const bool second = i > before + c0;
        sh_.nth_block = second ? p1 : p0;
        sh_.nth_rank = i - before - (second ? c0 : 0);
      }
    }
    __syncthreads();
    const uint32_t vbits = sh_.value_max[b];
    const uint64_t rank = sh_.nth_rank;
    const uint32_t first_id = sh_.nth_block * kBlockKeys + threadIdx.x * kPer;
    const float* row = sh_.row;
    const uint32_t vocab = sh_.vocab;
    unsigned match = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const uint32_t id = first_id + static_cast<uint32_t>(j);
      if (id < vocab && rule::order_bits(row[id]) == vbits) match |= 1u << j;
    }
    const auto c = static_cast<unsigned>(__popc(match));
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned incl = c;
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned up = __shfl_up_sync(kAll, incl, o);
      if (static_cast<int>(lane) >= o) incl += up;
    }
    if (lane == 31) sh_.warp_total[warp] = incl;
    __syncthreads();
    uint64_t before = incl - c;
    for (unsigned w = 0; w < warp; ++w) before += sh_.warp_total[w];
    if (before < rank && rank <= before + c) {
      unsigned m = match;
      for (uint64_t k = rank - before; k > 1; --k) m &= m - 1;  // drop the lower matches
      const uint32_t id = first_id + static_cast<uint32_t>(__ffs(m) - 1);
      const ull id_mask = (ull{1} << (bits_ - 32)) - 1;
      sh_.nth_key = (ull{vbits} << (bits_ - 32)) | (id_mask - id);
    }
    __syncthreads();
    mark();
    return sh_.nth_key;
  }

  // The last block of the row to leave resets what the next launch expects zero.
  __device__ void leave() {
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      if (atomicAdd(&g_.exited, 1u) == blocks_ - 1) {
        g_.pass[0].top[0] = 0;
        g_.arrived = 0;
        g_.exited = 0;
        g_.listed_early = g_.listed = 0;
        g_.past = 0;
        __threadfence();
      }
    }
  }

 private:
  __device__ rule::WeightRule weight_rule() const {
    rule::WeightRule w(sh_.wr_top, 1.0f);
    w.inv_t = sh_.wr_inv_t;
    return w;
  }

  __device__ Pass& next_pass() {
    if (++pass_ >= kPasses) __trap();  // draw_token passes at most kPasses barriers
    return g_.pass[pass_];
  }

  // The count and weight of the keys in view and >= lb, on every thread.
  __device__ rule::Measure measure_view(uint64_t lb) {
    ull n = 0, lo = 0, hi = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (((view_ >> j) & 1u) != 0 && key_[j] >= lb) {
        ++n;
        lo += w_[j] & 0xffffffffull;
        hi += w_[j] >> 32;
      }
    }
    n = warp_sum_u64(n);
    lo = warp_sum_u64(lo);
    hi = warp_sum_u64(hi);
    const unsigned warp = threadIdx.x >> 5;
    __syncthreads();  // the previous users of group_w / group_k / warp_total are done
    if ((threadIdx.x & 31) == 0) {
      sh_.group_w[warp] = lo;
      sh_.group_k[warp] = hi;
      sh_.warp_total[warp] = static_cast<uint32_t>(n);
    }
    __syncthreads();
    rule::Measure m;
    for (unsigned w = 0; w < kThreads / 32; ++w) {
      m.n += sh_.warp_total[w];
      m.mass += static_cast<u128>(sh_.group_w[w]) + (static_cast<u128>(sh_.group_k[w]) << 32);
    }
    return m;
  }

  // Only the keys of value bucket b take part from now on.
  __device__ void view(const ValueBuckets& vb, const rule::KeySpace& ks, int b) {
    view_ = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (key_[j] != 0 && vb(ks.value(key_[j])) == b) view_ |= 1u << j;
    }
  }

  __device__ void clear_local() {
    __syncthreads();  // the previous choice has been read
    for (int b = threadIdx.x; b < 256; b += kThreads) {
      sh_.count[b] = sh_.m0[b] = sh_.m1[b] = sh_.m2[b] = 0;
      sh_.vmax[b] = sh_.vlow[b] = 0;
    }
    __syncthreads();
  }

  // Adds the block's histogram into the pass's sums, then waits for the row's other blocks. The value
  // histogram also keeps each bucket's value range and this block's counts.
  __device__ void publish(Pass& p, bool value_pass) {
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += kThreads) {
      const uint32_t part = blockIdx.x % blocks_;
      if (value_pass && part < kCountedBlocks) {
        *reinterpret_cast<volatile uint16_t*>(&g_.block_count[part][b]) = static_cast<uint16_t>(sh_.count[b]);
      }
      if (sh_.count[b] == 0) continue;
      if (value_pass) {
        atomicMax(&g_.vmax[b], sh_.vmax[b]);
        atomicMax(&g_.vlow[b], sh_.vlow[b]);
      }
      atomicAdd(&p.count[b], sh_.count[b]);
      if (sh_.m0[b] != 0) atomicAdd(&p.lo[b], ull{sh_.m0[b]});
      const ull hi = sh_.m1[b] | (ull{sh_.m2[b]} << 32);
      if (hi != 0) atomicAdd(&p.hi[b], hi);
      *reinterpret_cast<volatile ull*>(&p.top[b]) = sh_.top[b];  // the one writer when the row's count is 1
    }
    barrier();
  }

  // Appends the block's keys of the band's value buckets to the row's list: one atomic a warp.
  // A list that would overflow is never read (the histogram counted the same keys).
  __device__ void gather(const ValueBuckets& vb, const rule::KeySpace& ks, const Band& band, unsigned& counter) {
    const unsigned lane = threadIdx.x & 31;
    unsigned in[kPer];
    unsigned n = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      in[j] = __ballot_sync(kAll, key_[j] != 0 && band.has(vb(ks.value(key_[j]))));
      n += static_cast<unsigned>(__popc(in[j]));
    }
    if (n == 0) return;
    unsigned at = 0;
    if (lane == 0) at = atomicAdd(&counter, n);
    at = __shfl_sync(kAll, at, 0);
    const unsigned below = (1u << lane) - 1;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if ((in[j] >> lane) & 1u) {
        const unsigned i = at + static_cast<unsigned>(__popc(in[j] & below));
        if (i < kBlockKeys) store_l2(g_.list[i], key_[j]);
      }
      at += static_cast<unsigned>(__popc(in[j]));
    }
  }

  // Sums the buckets of a histogram from each one up into `a`: thread t < 256 brings bucket 255 - t's
  // count, weight and key, its warp sums them in that order, then each adds the warps before its own.
  __device__ void sum_above(Above& a, ull c, u128 m, ull top) {
    const unsigned t = threadIdx.x, lane = t & 31, warp = t >> 5;
    if (t < 256) {
      for (int o = 1; o < 32; o <<= 1) {
        const ull cu = __shfl_up_sync(kAll, c, o);
        const u128 mu = shfl_up128(m, o);
        if (static_cast<int>(lane) >= o) {
          c += cu;
          m += mu;
        }
      }
      if (lane == 31) {
        sh_.sum_count[warp] = c;
        sh_.sum_lo[warp] = static_cast<ull>(m);
        sh_.sum_hi[warp] = static_cast<ull>(m >> 64);
      }
    }
    __syncthreads();
    if (t < 256) {
      for (unsigned w = 0; w < warp; ++w) {
        c += sh_.sum_count[w];
        m += (static_cast<u128>(sh_.sum_hi[w]) << 64) | sh_.sum_lo[w];
      }
      const unsigned b = 255 - t;
      a.count[b] = c;
      a.mass_lo[b] = static_cast<ull>(m);
      a.mass_hi[b] = static_cast<ull>(m >> 64);
      a.top[b] = top;
      if (t == 0) a.count[256] = a.mass_lo[256] = a.mass_hi[256] = 0;
    }
    __syncthreads();
  }

  // The bucket of `a` where the goal is reached, scanning from the highest, counting keys or adding
  // weights: the buckets above `floor` with their own measure, `floor` with floor_measure, none below
  // (floor -1: every bucket with its own). The measure from a bucket up never falls as the bucket
  // does, so the bucket is the highest whose measure from it up reaches the goal: every thread finds
  // it by bisection, with no barrier and no shared write. Sets only_ (a key of it).
  __device__ rule::Choice pick(const Above& a, const rule::Goal& goal, bool by_mass, int floor, u128 floor_measure) {
    const auto measure = [&](int b) {
      return by_mass ? (static_cast<u128>(a.mass_hi[b]) << 64) | a.mass_lo[b] : u128{a.count[b]};
    };
    const u128 want = goal.of(floor >= 0 ? measure(floor + 1) + floor_measure : measure(0));
    int b = floor > 0 ? floor : 0, top = 255;  // the measure from b up reaches want: it is the total
    while (b < top) {
      const int mid = (b + top + 1) >> 1;
      if (measure(mid) >= want) {
        b = mid;
      } else {
        top = mid - 1;
      }
    }
    only_ = a.top[b];
    rule::Choice ch;
    ch.bucket = static_cast<uint32_t>(b);
    ch.count = static_cast<uint32_t>(a.count[b] - a.count[b + 1]);
    ch.count_before = a.count[b + 1];
    ch.need = want - measure(b + 1);
    return ch;
  }

  // The value histogram summed over the row's blocks, into shared memory (every thread, after its
  // barrier): nothing adds to it after that barrier.
  __device__ void cache_values() {
    ull c = 0, top = 0;
    u128 m = 0;
    if (threadIdx.x < 256) {
      const Pass& p = g_.pass[1];
      const int b = 255 - static_cast<int>(threadIdx.x);
      c = load_l2(p.count[b]);
      m = static_cast<u128>(load_l2(p.lo[b])) + (static_cast<u128>(load_l2(p.hi[b])) << 32);
      top = load_l2(p.top[b]);
      sh_.value_max[b] = load_l2(g_.vmax[b]);
      sh_.value_low[b] = load_l2(g_.vlow[b]);
    }
    sum_above(sh_.value_sums, c, m, top);
  }

  // The count and weight of the keys in value buckets b and above (none for 256).
  __device__ Tally above(int b) const {
    const Above& a = sh_.value_sums;
    return Tally{a.count[b], (static_cast<u128>(a.mass_hi[b]) << 64) | a.mass_lo[b]};
  }

  // Adds key k (bucket b, -1 for none) of every lane. Lanes of one bucket are summed in the warp
  // first, since the first digits put most of a row in a few buckets: a whole-warp bucket by shuffles,
  // smaller groups by their lowest lane reading its peers' weights from shared memory. `ranged` also
  // keeps the bucket's value range.
  __device__ void add_grouped(int b, ull w, ull k, bool ranged) {
    if (__ballot_sync(kAll, b >= 0) == 0) return;
    const unsigned peers = __match_any_sync(kAll, b);
    const int lane = static_cast<int>(threadIdx.x & 31);
    if (__all_sync(kAll, peers == kAll)) {  // every lane in bucket b
      const ull lo = warp_sum_u64(w & 0xffffffffull), hi = warp_sum_u64(w >> 32), top = warp_max_u64(k);
      const ull low = ranged ? warp_min_u64(k) : k;
      if (lane == 0) add_local(b, 32, lo, hi, top, low, ranged);
      return;
    }
    const unsigned base = threadIdx.x & ~31u;
    sh_.group_w[threadIdx.x] = w;
    sh_.group_k[threadIdx.x] = k;
    __syncwarp();
    if (b >= 0 && lane == __ffs(peers) - 1) {
      ull lo = 0, hi = 0, top = 0, low = ~0ull;
      for (unsigned m = peers; m != 0; m &= m - 1) {
        const unsigned i = base + static_cast<unsigned>(__ffs(m) - 1);
        const ull wi = sh_.group_w[i], ki = sh_.group_k[i];
        lo += wi & 0xffffffffull;
        hi += wi >> 32;
        top = ki > top ? ki : top;
        low = ki < low ? ki : low;
      }
      add_local(b, static_cast<uint32_t>(__popc(peers)), lo, hi, top, low, ranged);
    }
    __syncwarp();
  }

  // Adds key k (value bucket b, -1 for none) of every lane, each lane by its own atomics (lanes of one
  // bucket meet in them), a bucket of the whole warp by shuffles.
  __device__ void add_each(int b, ull w, ull k) {
    if (__all_sync(kAll, b == __shfl_sync(kAll, b, 0))) {
      if (b < 0) return;
      const ull lo = warp_sum_u64(w & 0xffffffffull), hi = warp_sum_u64(w >> 32);
      const ull top = warp_max_u64(k), low = warp_min_u64(k);
      if ((threadIdx.x & 31) == 0) add_local(b, 32, lo, hi, top, low, true);
      return;
    }
    if (b >= 0) add_local(b, 1, w & 0xffffffffull, w >> 32, k, k, true);
  }

  // Adds `count` keys of weight lo + hi * 2^32 (lo, hi < 2^63) and one of their keys to bucket b; when
  // `ranged`, their largest and smallest value too (top, low: their largest and smallest key).
  __device__ void add_local(int b, uint32_t count, ull lo, ull hi, ull top, ull low, bool ranged) {
    atomicAdd(&sh_.count[b], count);
    sh_.top[b] = top;
    if (ranged) {
      atomicMax(&sh_.vmax[b], static_cast<uint32_t>(top >> (bits_ - 32)));
      atomicMax(&sh_.vlow[b], ~static_cast<uint32_t>(low >> (bits_ - 32)));
    }
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
        if (pass_ == 0) g_.vmax[b] = g_.vlow[b] = 0;  // the value histogram's ranges, too
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
  uint32_t bits_;
  ull walked_ = 0;  // the bucket walk's key
  ull only_ = 0;    // a key of the last choice's bucket: the key when it holds one
  int pass_ = 0;
  bool by_mass_ = false;
  bool local_ = false;  // drawing from the list in registers: no global sums, no barriers
  ull past_ = 0;        // min-p's first_past_lighter over the whole row
  unsigned view_ = 0xffu;  // bit j: key_[j] takes part (select_in looks at one value bucket at a time)
  ull key_[kPer];
  ull w_[kPer] = {};
};

__global__ void __launch_bounds__(kThreads) sample_grid_kernel(const float* logits, uint32_t vocab, const SampleRow* rows,
                                                               int32_t* out, RowScratch* scratch, uint32_t blocks) {
  __shared__ Local sh;
  const uint32_t r = blockIdx.x / blocks, part = blockIdx.x % blocks;
  const SampleRow row = rows[r];
  const rule::KeySpace ks(vocab);
  GridRow ex(sh, scratch[r], blocks, part == 0, ks.bits());
  ex.mark(true);
  ex.load(logits + static_cast<size_t>(row.logit_row) * vocab, vocab, part * kBlockKeys, ks);
  ex.mark();
  const ull top = ex.max_key();
  ex.mark();
  uint32_t token = ks.id(top);
  if (row.temperature > 0.0f) {
    const rule::WeightRule wr(ks.value(top), row.temperature);
    ex.weigh(wr, ks);
    ex.mark();
    const uint64_t bits = rule::draw_bits(row.seed, row.position);
    const Way way = ex.shortcut(row, vocab, ks, wr, bits);
    if (way == Way::list) {
      token = ks.id(rule::list_draw(ex, vocab, row.top_k, row.top_p, row.min_p, bits));
    } else if (way == Way::buckets) {
      token = ks.id(ex.walked());
    } else if (way == Way::all_blocks) {
      token = rule::draw_token(ex, ks, vocab, row.top_k, row.top_p, row.min_p, bits);
    }
  }
  ex.mark();
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

SamplePhases sample_phases(const void* scratch) {
  const auto* row0 = static_cast<const RowScratch*>(scratch);
  unsigned n = 0;
  FERRY_CUDA(cudaMemcpy(&n, &row0->marks, sizeof n, cudaMemcpyDeviceToHost));
  SamplePhases p;
  p.clocks.resize(std::min(n, kMarks));
  FERRY_CUDA(cudaMemcpy(p.clocks.data(), row0->mark_clock, p.clocks.size() * sizeof(ull), cudaMemcpyDeviceToHost));
  return p;
}
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
