// The prefill indexer on tensor cores (gpu/indexer_prefill.hpp, then indexer_select_rows) against
// the f32 path it replaces (gpu/dsa.cu's per-row kernels) and the CPU rule, on chunks of rows at
// consecutive positions (one slot, two slots one after the other, or alternating row by row) over
// random pool keys with planted ties: zero keys (every head's dot 0: the score must be exactly +0.0),
// exact copies of a key that scores high for every row (equal scores, the lower pool first) and
// near-copies of it (scores apart by about an ulp: near-ties at and around the cut). Asserted: each
// score within rounding of the f32 path's and, on a sample, of a double-precision sum; the
// selection exactly model::select_pools + expand_selection on the kernel's own scores (and the decode
// steps' selection kernel's on them); the counts the f32 path's; and every pool selected by one path
// but not the other a near-tie of the f32 path's cut (its score within rounding of the K-th best).
// Prints how many rows differ, and the times of a 2,048-row chunk of the real indexer shape at depths
// 0, 32K and 128K (not asserted).
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>
#include <span>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/indexer_decode.hpp"
#include "gpu/indexer_prefill.hpp"
#include "gpu/workspace.hpp"
#include "model/cpu/dsa.hpp"
#include "tests/gpu/gpu_test_support.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::have_device;

enum class Slots { one, two_runs, alternating };

struct Shape {
  uint32_t rows, depth, heads, dim, kpool, topk;
  Slots slots = Slots::one;
  bool ties = true;
};

template <class T>
DeviceBuffer upload(const std::vector<T>& v) {
  DeviceBuffer b(std::max<size_t>(v.size() * sizeof(T), 16));
  EXPECT_EQ(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return b;
}

template <class T>
std::vector<T> download(const DeviceBuffer& b) {
  std::vector<T> v(b.bytes() / sizeof(T));
  EXPECT_EQ(cudaMemcpy(v.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// A chunk's indexer inputs on the device: the rows' slots and positions, queries, weights, the
// slots' pool keys, and the outputs.
class Chunk {
 public:
  Chunk(const Shape& s, uint32_t seed, size_t scratch_bytes)
      : s_(s), slots_(s.slots == Slots::one ? 1 : 2), ctx_(((s.depth + s.rows + 8) / s.kpool + 2) * s.kpool),
        max_tokens_(s.topk / s.kpool * s.kpool + s.kpool) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f), unit(0.0f, 1.0f);
    // Rows of one slot share most of their queries, so that the planted key scores high for all.
    std::vector<float> base(static_cast<size_t>(s.heads) * s.dim);
    for (float& v : base) v = u(rng);
    q_h_.resize(static_cast<size_t>(s.rows) * s.heads * s.dim);
    for (size_t i = 0; i < q_h_.size(); ++i) q_h_[i] = base[i % base.size()] + 0.25f * u(rng);
    w_h_.resize(static_cast<size_t>(s.rows) * s.heads);
    // Even rows weigh every head positively (scores >= 0: the zero keys tie at 0.0), odd rows by
    // either sign.
    for (size_t i = 0; i < w_h_.size(); ++i) w_h_[i] = (i / s.heads) % 2 == 0 ? 0.05f + unit(rng) : u(rng);
    uint32_t next[2] = {s.depth, s.depth / 2};
    for (uint32_t r = 0; r < s.rows; ++r) {
      const int32_t slot = s.slots == Slots::one ? 0 : s.slots == Slots::two_runs ? (r >= s.rows / 2) : r % 2;
      slot_h_.push_back(slot);
      pos_h_.push_back(static_cast<int32_t>(next[slot]++));
    }
    std::vector<float> hot(s.dim, 0.0f);
    for (uint32_t h = 0; h < s.heads; ++h) {
      for (uint32_t c = 0; c < s.dim; ++c) hot[c] += base[h * s.dim + c] / static_cast<float>(s.heads);
    }
    const size_t max_pools = ctx_ / s.kpool;
    pools_h_.assign(slots_ * max_pools * s.dim, 0.0f);
    // About 1.5 budgets of copies and near-copies of the hot key, so that cuts fall among them.
    const float hot_share = s.ties ? std::min(0.5f, 1.5f * static_cast<float>(s.topk / s.kpool) /
                                                        static_cast<float>(std::max<size_t>(max_pools, 1))) : 0.0f;
    for (size_t p = 0; p < slots_ * max_pools; ++p) {
      float* k = pools_h_.data() + p * s.dim;
      const float x = unit(rng);
      if (s.ties && x < 0.2f) continue;  // zero key
      if (s.ties && x < 0.2f + hot_share) {
        const bool exact = unit(rng) < 0.5f;
        for (uint32_t c = 0; c < s.dim; ++c) k[c] = exact ? hot[c] : hot[c] * (1.0f + 2e-7f * u(rng));
        continue;
      }
      for (uint32_t c = 0; c < s.dim; ++c) k[c] = u(rng);
    }
    for (size_t slot = 0; slot < slots_; ++slot) {
      double kmax = 0.0;
      for (size_t p = 0; p < max_pools; ++p) {
        const float* k = pools_h_.data() + (slot * max_pools + p) * s.dim;
        double n = 0.0;
        for (uint32_t c = 0; c < s.dim; ++c) n += static_cast<double>(k[c]) * k[c];
        kmax = std::max(kmax, n);
      }
      key_norm_.push_back(std::sqrt(kmax));
    }
    pools_ = upload(pools_h_);
    q_ = upload(q_h_);
    w_ = upload(w_h_);
    slot_ = upload(slot_h_);
    pos_ = upload(pos_h_);
    scores_ = DeviceBuffer(static_cast<size_t>(s.rows) * max_pools * sizeof(float));
    tokens_ = DeviceBuffer(static_cast<size_t>(s.rows) * max_tokens_ * sizeof(int32_t));
    counts_ = DeviceBuffer(s.rows * sizeof(int32_t));
    if (scratch_bytes > 0) scratch_ = DeviceBuffer(scratch_bytes);
  }

  IndexerArgs args() const {
    IndexerArgs a;
    a.row.slot = slot_.as<int32_t>();
    a.row.pos = pos_.as<int32_t>();
    a.rows = s_.rows;
    a.heads = s_.heads;
    a.head_dim = s_.dim;
    a.kpool = s_.kpool;
    a.topk = s_.topk;
    a.ctx = ctx_;
    a.select_tail = true;
    a.pool_cache = pools_.as<float>();
    a.q = q_.as<float>();
    a.w = w_.as<float>();
    a.scores = scores_.as<float>();
    a.tokens = tokens_.as<int32_t>();
    a.counts = counts_.as<int32_t>();
    a.max_tokens = max_tokens_;
    a.select_scratch = scratch_.get();
    a.select_scratch_bytes = scratch_.get() == nullptr ? 0 : scratch_.bytes();
    return a;
  }

  struct Out {
    std::vector<float> scores;
    std::vector<int32_t> tokens, counts;
  };
  // The f32 path (per-row kernels) or the tensor-core scores and the selection of prefill rows.
  Out run(bool tensor_cores) {
    EXPECT_EQ(cudaMemset(scores_.get(), 0xff, scores_.bytes()), cudaSuccess);
    EXPECT_EQ(cudaMemset(tokens_.get(), 0xff, tokens_.bytes()), cudaSuccess);
    EXPECT_EQ(cudaMemset(counts_.get(), 0xff, counts_.bytes()), cudaSuccess);
    const IndexerArgs a = args();
    if (tensor_cores) {
      indexer_prefill_scores(a, nullptr);
      indexer_select_rows(a, nullptr);
    } else {
      indexer_scores_by_row(a, nullptr);
      indexer_select_by_row(a, nullptr);
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return {download<float>(scores_), download<int32_t>(tokens_), download<int32_t>(counts_)};
  }

  // The decode steps' selection on the scores the last run left.
  Out reselect_as_decode() {
    EXPECT_EQ(cudaMemset(tokens_.get(), 0xff, tokens_.bytes()), cudaSuccess);
    EXPECT_EQ(cudaMemset(counts_.get(), 0xff, counts_.bytes()), cudaSuccess);
    indexer_decode_select(args(), nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return {{}, download<int32_t>(tokens_), download<int32_t>(counts_)};
  }

  // Milliseconds of `launch` (median of `reps` after a warm-up).
  template <class Launch>
  float time_ms(const Launch& launch, int reps) {
    Stream st;
    Event e0, e1;
    std::vector<float> ms;
    for (int i = 0; i <= reps; ++i) {
      e0.record(st.get());
      launch(args(), st.get());
      e1.record(st.get());
      st.synchronize();
      if (i > 0) ms.push_back(e1.since(e0));
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }

  const Shape& shape() const { return s_; }
  uint32_t max_pools() const { return ctx_ / s_.kpool; }
  uint32_t visible(uint32_t r) const { return static_cast<uint32_t>(pos_h_[r] + 1) / s_.kpool; }
  int32_t pos(uint32_t r) const { return pos_h_[r]; }
  const float* key(uint32_t r, uint32_t p) const {
    return pools_h_.data() + (static_cast<size_t>(slot_h_[r]) * max_pools() + p) * s_.dim;
  }
  bool zero_key(uint32_t r, uint32_t p) const {
    return std::all_of(key(r, p), key(r, p) + s_.dim, [](float v) { return v == 0.0f; });
  }
  // Row r's rounding scale: sum over heads of |w| |q| max |key| head_dim^-0.5 heads^-0.5 bounds
  // every sum of |products| a score of the row adds (Cauchy-Schwarz); f32 sums of 128 terms and the
  // hi/lo split stay far below 1e-5 of it.
  double rounding(uint32_t r) const {
    double sum = 0.0;
    for (uint32_t h = 0; h < s_.heads; ++h) {
      const float* q = q_h_.data() + (static_cast<size_t>(r) * s_.heads + h) * s_.dim;
      double n = 0.0;
      for (uint32_t c = 0; c < s_.dim; ++c) n += static_cast<double>(q[c]) * q[c];
      sum += std::fabs(w_h_[static_cast<size_t>(r) * s_.heads + h]) * std::sqrt(n);
    }
    return 1e-5 * sum * key_norm_[static_cast<size_t>(slot_h_[r])] / std::sqrt(static_cast<double>(s_.dim)) /
           std::sqrt(static_cast<double>(s_.heads));
  }
  // Pool p's score for row r in double, and a bound on a float sum's error.
  std::pair<double, double> reference(uint32_t r, uint32_t p) const {
    const double scale = 1.0 / std::sqrt(static_cast<double>(s_.dim));
    const double wscale = 1.0 / std::sqrt(static_cast<double>(s_.heads));
    double sum = 0.0, mag = 0.0;
    for (uint32_t h = 0; h < s_.heads; ++h) {
      const float* q = q_h_.data() + (static_cast<size_t>(r) * s_.heads + h) * s_.dim;
      double dot = 0.0, dmag = 0.0;
      for (uint32_t c = 0; c < s_.dim; ++c) {
        dot += static_cast<double>(q[c]) * key(r, p)[c];
        dmag += std::fabs(static_cast<double>(q[c]) * key(r, p)[c]);
      }
      const double w = static_cast<double>(w_h_[static_cast<size_t>(r) * s_.heads + h]) * wscale;
      sum += w * std::max(dot * scale, 0.0);
      mag += std::fabs(w) * dmag * scale;
    }
    return {sum, 3e-5 * mag};
  }

 private:
  Shape s_;
  size_t slots_;
  uint32_t ctx_, max_tokens_;
  std::vector<float> pools_h_, q_h_, w_h_;
  std::vector<int32_t> slot_h_, pos_h_;
  std::vector<double> key_norm_;  // per slot: the largest |key|
  DeviceBuffer pools_, q_, w_, slot_, pos_, scores_, tokens_, counts_, scratch_;
};

// The pools of a row's selected tokens (their first tokens / kpool), without the tail.
std::set<uint32_t> selected_pools(const int32_t* tokens, int32_t count, uint32_t pos, uint32_t kpool) {
  const int32_t tail = static_cast<int32_t>((pos + 1) % kpool);
  std::set<uint32_t> out;
  for (int32_t i = 0; i < count - tail; i += static_cast<int32_t>(kpool)) {
    out.insert(static_cast<uint32_t>(tokens[i]) / kpool);
  }
  return out;
}

void check_chunk(const Shape& s, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "rows " << s.rows << " depth " << s.depth << " heads " << s.heads << " dim "
                                    << s.dim << " kpool " << s.kpool << " topk " << s.topk << " slots "
                                    << static_cast<int>(s.slots) << (s.ties ? " ties" : ""));
  Chunk chunk(s, seed, 0);
  ASSERT_TRUE(indexer_prefill_applies(chunk.args()));
  const Chunk::Out ref = chunk.run(false), got = chunk.run(true);
  {
    const Chunk::Out again = chunk.reselect_as_decode();
    ASSERT_EQ(again.counts, got.counts) << "the decode steps' selection";
    ASSERT_EQ(again.tokens, got.tokens) << "the decode steps' selection";
  }
  const uint32_t K = s.topk / s.kpool;
  uint32_t rows_differing = 0, pools_differing = 0;
  for (uint32_t r = 0; r < s.rows; ++r) {
    SCOPED_TRACE(::testing::Message() << "row " << r);
    const uint32_t nv = chunk.visible(r);
    const float* sr = ref.scores.data() + static_cast<size_t>(r) * chunk.max_pools();
    const float* sg = got.scores.data() + static_cast<size_t>(r) * chunk.max_pools();
    const double tol = chunk.rounding(r);
    for (uint32_t p = 0; p < nv; ++p) {
      ASSERT_NEAR(sg[p], sr[p], tol) << "pool " << p << " against the f32 path";
      if (chunk.zero_key(r, p)) {
        ASSERT_EQ(std::signbit(sg[p]), false) << "pool " << p;
        ASSERT_EQ(sg[p], 0.0f) << "pool " << p;
      }
    }
    if (r % 17 == 0) {
      for (uint32_t p = 0; p < nv; p += (p < 64 ? 1 : 131)) {
        const auto [want, bound] = chunk.reference(r, p);
        ASSERT_NEAR(sg[p], want, bound) << "pool " << p << " against the double sum";
      }
    }
    std::vector<uint32_t> pools, tokens;
    model::select_pools(std::span<const float>(sg, nv), K, pools);
    model::expand_selection(pools, static_cast<uint32_t>(chunk.pos(r)), s.kpool, true, tokens);
    ASSERT_EQ(got.counts[r], ref.counts[r]);
    ASSERT_EQ(got.counts[r], static_cast<int32_t>(tokens.size()));
    const int32_t* tg = got.tokens.data() + static_cast<size_t>(r) * (got.tokens.size() / s.rows);
    const int32_t* tr = ref.tokens.data() + static_cast<size_t>(r) * (ref.tokens.size() / s.rows);
    for (size_t i = 0; i < tokens.size(); ++i) {
      ASSERT_EQ(tg[i], static_cast<int32_t>(tokens[i])) << "token " << i << " differs from model::select_pools";
    }
    // Pools one path selects and the other not: near-ties of the f32 path's cut.
    const uint32_t pos = static_cast<uint32_t>(chunk.pos(r));
    const std::set<uint32_t> a = selected_pools(tr, ref.counts[r], pos, s.kpool),
                             b = selected_pools(tg, got.counts[r], pos, s.kpool);
    if (a == b) continue;
    std::vector<float> sorted(sr, sr + nv);
    std::nth_element(sorted.begin(), sorted.begin() + (K - 1), sorted.end(), std::greater<float>());
    const double cut = sorted[K - 1];
    ++rows_differing;
    for (uint32_t p : a) {
      if (b.count(p) == 0) {
        ++pools_differing;
        ASSERT_LE(std::fabs(sr[p] - cut), 2 * tol) << "pool " << p << " dropped, no near-tie of the cut " << cut;
      }
    }
    for (uint32_t p : b) {
      if (a.count(p) == 0) {
        ASSERT_LE(std::fabs(sr[p] - cut), 2 * tol) << "pool " << p << " taken, no near-tie of the cut " << cut;
      }
    }
  }
  std::printf("indexer prefill %u rows at depth %u (%u heads x %u, kpool %u, topk %u): %u rows select other pools "
              "than the f32 path at near-ties (%u pools)\n",
              s.rows, s.depth, s.heads, s.dim, s.kpool, s.topk, rows_differing, pools_differing);
}

TEST(IndexerPrefill, TensorCoreScoresSelectTheF32PathsPoolsUpToNearTies) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  if (!indexer_prefill_applies(Chunk({9, 0, 32, 128, 4, 2048}, 1, 0).args())) {
    GTEST_SKIP() << "no sm80+ code for the tensor-core kernel on this device";
  }
  uint32_t seed = 1;
  for (bool ties : {false, true}) {
    check_chunk({64, 0, 32, 128, 4, 2048, Slots::one, ties}, seed++);
    check_chunk({300, 40000, 32, 128, 4, 2048, Slots::one, ties}, seed++);
    check_chunk({2048, 32768, 32, 128, 4, 2048, Slots::one, ties}, seed++);  // the real chunk
  }
  check_chunk({9, 5000, 32, 128, 4, 2048, Slots::one}, seed++);  // just past a decode step
  check_chunk({130, 9000, 32, 128, 4, 2048, Slots::two_runs}, seed++);
  check_chunk({101, 3000, 32, 128, 4, 2048, Slots::alternating}, seed++);
}

TEST(IndexerPrefill, TheTestModelsShapes) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  if (!indexer_prefill_applies(Chunk({9, 0, 16, 16, 4, 8}, 1, 0).args())) {
    GTEST_SKIP() << "no sm80+ code for the tensor-core kernel on this device";
  }
  uint32_t seed = 50;
  for (Slots slots : {Slots::one, Slots::two_runs, Slots::alternating}) {
    check_chunk({37, 100, 16, 16, 4, 8, slots}, seed++);   // tests/gpu's tiny stage
    check_chunk({50, 30, 20, 12, 3, 12, slots}, seed++);   // the dsa_adjacent fixture
    check_chunk({40, 600, 8, 32, 4, 256, slots}, seed++);  // trained_small
    check_chunk({77, 2000, 16, 64, 8, 16, slots}, seed++);
  }
}

TEST(IndexerPrefill, Timing) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  // The real indexer (configs/glm-5.3-flash-12-layers.json): 32 heads x 128, kpool 4, topk 2,048; the
  // selection scratch a layer has (the sparse attention's split partials: 64 heads, rank 512).
  const size_t scratch = size_t{kMlaPartialRows} * 64 * (512 + 2) * sizeof(float);
  for (uint32_t depth : {0u, 32768u, 131072u}) {
    Chunk chunk({2048, depth, 32, 128, 4, 2048, Slots::one, false}, 7, scratch);
    if (!indexer_prefill_applies(chunk.args())) GTEST_SKIP() << "no sm80+ code for the tensor-core kernel";
    auto no_scratch = [](IndexerArgs a) {
      a.select_scratch = nullptr;
      a.select_scratch_bytes = 0;
      return a;
    };
    using Launch = void (*)(const IndexerArgs&, cudaStream_t);
    const Launch scores_by_row = [](const IndexerArgs& a, cudaStream_t st) { indexer_scores_by_row(a, st); };
    const Launch select_by_row = [](const IndexerArgs& a, cudaStream_t st) { indexer_select_by_row(a, st); };
    const Launch tc = [](const IndexerArgs& a, cudaStream_t st) { indexer_prefill_scores(a, st); };
    const Launch decode_select = [](const IndexerArgs& a, cudaStream_t st) { indexer_decode_select(a, st); };
    const Launch rows_select = [](const IndexerArgs& a, cudaStream_t st) { indexer_select_rows(a, st); };
    const Launch all = [](const IndexerArgs& a, cudaStream_t st) { indexer_select(a, st); };
    const float by_row_scores = chunk.time_ms(scores_by_row, 3), by_row_select = chunk.time_ms(select_by_row, 3);
    const float tc_scores = chunk.time_ms(tc, 5);
    const float select_one =
        chunk.time_ms([&](const IndexerArgs& a, cudaStream_t st) { decode_select(no_scratch(a), st); }, 5);
    const float select_chunked = chunk.time_ms(decode_select, 5), rows = chunk.time_ms(rows_select, 5);
    const float layer = chunk.time_ms(all, 5);
    std::printf("indexer prefill timing, 2048 rows at depth %u (%u pools): f32 path scores %.3f ms + select %.3f ms; "
                "tensor-core scores %.3f ms; selection 512 threads a row %.3f ms (the decode steps' one block a row "
                "%.3f ms, with the layer's scratch %.3f ms); indexer_select() one layer %.3f ms\n",
                depth, chunk.visible(2047), static_cast<double>(by_row_scores), static_cast<double>(by_row_select),
                static_cast<double>(tc_scores), static_cast<double>(rows), static_cast<double>(select_one),
                static_cast<double>(select_chunked), static_cast<double>(layer));
  }
}

}  // namespace
}  // namespace ferry::gpu
#endif
