// The decode indexer kernels (gpu/indexer_decode.hpp) against the per-row kernels of gpu/dsa.cu and
// the CPU rule: on random pool keys with planted ties (zero keys, whose scores are exactly 0.0, and
// many copies of one key that scores high for the first row) at 1, 4 and 8 rows (rows of one slot
// apart and together, at different depths) and 100 to 140,000 pools, the scores must be bit for bit
// the per-row kernels', the selections (tokens and counts) identical, and equal to
// model::select_pools + expand_selection on the same scores; the scores are also checked against a
// double-precision sum on a sample of pools; the selection both on a block a row and per chunk then
// merged (with a scratch). Prints the paths' times per pool count (not asserted).
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/indexer_decode.hpp"
#include "model/cpu/dsa.hpp"
#include "tests/gpu/gpu_test_support.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::have_device;

struct Shape {
  uint32_t rows, pools, heads, dim, topk;
};

constexpr uint32_t kKpool = 4, kSlots = 2;

// A step's inputs on the device, the rows' slots and positions, and both paths' outputs.
class Step {
 public:
  Step(const Shape& s, bool ties, uint32_t seed)
      : s_(s), ctx_((s.pools + 2) * kKpool), max_tokens_(s.topk / kKpool * kKpool + kKpool),
        pools_h_(static_cast<size_t>(kSlots) * (ctx_ / kKpool) * s.dim, 0.0f),
        q_h_(static_cast<size_t>(s.rows) * s.heads * s.dim), w_h_(static_cast<size_t>(s.rows) * s.heads) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f), unit(0.0f, 1.0f);
    for (float& v : q_h_) v = u(rng);
    // Even rows weigh every head positively (scores >= 0: the zero keys tie at 0.0), odd rows by
    // either sign. Rows 1, 4, 7 take slot 1, the others slot 0, at depths from all the pools down.
    for (size_t i = 0; i < w_h_.size(); ++i) w_h_[i] = (i / s.heads) % 2 == 0 ? 0.05f + unit(rng) : u(rng);
    for (uint32_t r = 0; r < s.rows; ++r) {
      slot_h_.push_back(r % 3 == 1 ? 1 : 0);
      const uint32_t nv = std::max<uint32_t>(1, s.pools - (r * 7919u) % (s.pools / 3 + 1));
      pos_h_.push_back(static_cast<int32_t>(nv * kKpool + r % kKpool) - 1);
    }
    // A key scoring high for row 0: its heads' queries summed.
    std::vector<float> hot(s.dim, 0.0f);
    for (uint32_t h = 0; h < s.heads; ++h) {
      for (uint32_t c = 0; c < s.dim; ++c) hot[c] += q_h_[h * s.dim + c] / static_cast<float>(s.heads);
    }
    for (size_t p = 0; p < pools_h_.size() / s.dim; ++p) {
      float* k = pools_h_.data() + p * s.dim;
      const float x = unit(rng);
      if (ties && x < 0.3f) continue;  // zero key: every head's dot is 0
      if (ties && x < 0.36f) {
        std::copy(hot.begin(), hot.end(), k);
        continue;
      }
      for (uint32_t c = 0; c < s.dim; ++c) k[c] = u(rng);
    }
    pools_ = upload(pools_h_);
    q_ = upload(q_h_);
    w_ = upload(w_h_);
    slot_ = upload(slot_h_);
    pos_ = upload(pos_h_);
    const size_t max_pools = ctx_ / kKpool;
    scores_ = DeviceBuffer(s.rows * max_pools * sizeof(float));
    tokens_ = DeviceBuffer(s.rows * max_tokens_ * sizeof(int32_t));
    counts_ = DeviceBuffer(s.rows * sizeof(int32_t));
    const size_t chunks = (max_pools + 8191) / 8192;
    scratch_ = DeviceBuffer(s.rows * chunks * 2 * (s.topk / kKpool) * sizeof(uint32_t));
  }

  // With `scratch`, deep rows select per chunk and merge (indexer_decode_select).
  IndexerArgs args(bool scratch) const {
    IndexerArgs a;
    a.row.slot = slot_.as<int32_t>();
    a.row.pos = pos_.as<int32_t>();
    a.rows = s_.rows;
    a.heads = s_.heads;
    a.head_dim = s_.dim;
    a.kpool = kKpool;
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
    if (scratch) {
      a.select_scratch = scratch_.get();
      a.select_scratch_bytes = scratch_.bytes();
    }
    a.skip_whole_selections = skip_;
    return a;
  }
  // Whether the decode scores skip slots whose rows select every pool (IndexerArgs::skip_whole_selections).
  void skip_whole_selections(bool on) { skip_ = on; }

  struct Out {
    std::vector<float> scores;
    std::vector<int32_t> tokens, counts;
  };
  Out run(bool decode, bool scratch) {
    EXPECT_EQ(cudaMemset(scores_.get(), 0xff, scores_.bytes()), cudaSuccess);
    EXPECT_EQ(cudaMemset(tokens_.get(), 0xff, tokens_.bytes()), cudaSuccess);
    EXPECT_EQ(cudaMemset(counts_.get(), 0xff, counts_.bytes()), cudaSuccess);
    launch(decode, scratch, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    Out o{std::vector<float>(scores_.bytes() / sizeof(float)), std::vector<int32_t>(tokens_.bytes() / sizeof(int32_t)),
          std::vector<int32_t>(s_.rows)};
    EXPECT_EQ(cudaMemcpy(o.scores.data(), scores_.get(), scores_.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(o.tokens.data(), tokens_.get(), tokens_.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(o.counts.data(), counts_.get(), counts_.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    return o;
  }
  // Microseconds per step of scores and selection, the median of `reps` after a warm-up.
  float time_us(bool decode, bool scratch, int reps) {
    Stream st;
    Event e0, e1;
    std::vector<float> ms;
    for (int i = 0; i <= reps; ++i) {
      e0.record(st.get());
      launch(decode, scratch, st.get());
      e1.record(st.get());
      st.synchronize();
      if (i > 0) ms.push_back(e1.since(e0));
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2] * 1000.0f;
  }

  uint32_t visible(uint32_t r) const { return static_cast<uint32_t>(pos_h_[r] + 1) / kKpool; }
  uint32_t max_pools() const { return ctx_ / kKpool; }
  const Shape& shape() const { return s_; }
  int32_t pos(uint32_t r) const { return pos_h_[r]; }
  // Pool p's score for row r in double, and a bound on the float sum's error.
  std::pair<double, double> reference(uint32_t r, uint32_t p) const {
    const float* k = pools_h_.data() + (static_cast<size_t>(slot_h_[r]) * max_pools() + p) * s_.dim;
    const double scale = 1.0 / std::sqrt(static_cast<double>(s_.dim));
    const double wscale = 1.0 / std::sqrt(static_cast<double>(s_.heads));
    double sum = 0.0, mag = 0.0;
    for (uint32_t h = 0; h < s_.heads; ++h) {
      const float* q = q_h_.data() + (static_cast<size_t>(r) * s_.heads + h) * s_.dim;
      double dot = 0.0, dmag = 0.0;
      for (uint32_t c = 0; c < s_.dim; ++c) {
        dot += static_cast<double>(q[c]) * k[c];
        dmag += std::fabs(static_cast<double>(q[c]) * k[c]);
      }
      const double w = static_cast<double>(w_h_[static_cast<size_t>(r) * s_.heads + h]) * wscale;
      sum += w * std::max(dot * scale, 0.0);
      mag += std::fabs(w) * dmag * scale;
    }
    return {sum, 3e-5 * mag};
  }
  bool zero_key(uint32_t r, uint32_t p) const {
    const float* k = pools_h_.data() + (static_cast<size_t>(slot_h_[r]) * max_pools() + p) * s_.dim;
    return std::all_of(k, k + s_.dim, [](float v) { return v == 0.0f; });
  }

 private:
  template <class T>
  static DeviceBuffer upload(const std::vector<T>& v) {
    DeviceBuffer b(v.size() * sizeof(T));
    EXPECT_EQ(cudaMemcpy(b.get(), v.data(), b.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
    return b;
  }
  void launch(bool decode, bool scratch, cudaStream_t st) {
    const IndexerArgs a = args(scratch);
    if (decode) {
      ASSERT_TRUE(indexer_decode_fits(a));
      indexer_decode_scores(a, st);
      indexer_decode_select(a, st);
    } else {
      indexer_scores_by_row(a, st);
      indexer_select_by_row(a, st);
    }
  }

  Shape s_;
  bool skip_ = false;
  uint32_t ctx_, max_tokens_;
  std::vector<float> pools_h_, q_h_, w_h_;
  std::vector<int32_t> slot_h_, pos_h_;
  DeviceBuffer pools_, q_, w_, slot_, pos_, scores_, tokens_, counts_, scratch_;
};

void check_against(const Step& step, const Step::Out& ref, const Step::Out& got, bool scratch);

void check_step(const Shape& s, bool ties, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "rows " << s.rows << " pools " << s.pools << " heads " << s.heads << " dim "
                                    << s.dim << " topk " << s.topk << (ties ? " ties" : ""));
  Step step(s, ties, seed);
  const Step::Out ref = step.run(false, false);
  for (bool scratch : {false, true}) check_against(step, ref, step.run(true, scratch), scratch);
}

void check_against(const Step& step, const Step::Out& ref, const Step::Out& got, bool scratch) {
  const Shape& s = step.shape();
  const uint32_t K = s.topk / kKpool;
  for (uint32_t r = 0; r < s.rows; ++r) {
    SCOPED_TRACE(::testing::Message() << "row " << r << (scratch ? ", chunked selection" : ", one block a row"));
    const uint32_t nv = step.visible(r);
    const float* sr = ref.scores.data() + static_cast<size_t>(r) * step.max_pools();
    const float* sg = got.scores.data() + static_cast<size_t>(r) * step.max_pools();
    ASSERT_EQ(std::memcmp(sr, sg, nv * sizeof(float)), 0) << "scores differ from the per-row kernel's";
    for (uint32_t p = 0; p < nv; p += (p < 64 ? 1 : 97)) {
      const auto [want, tol] = step.reference(r, p);
      ASSERT_NEAR(sg[p], want, tol) << "pool " << p;
      if (step.zero_key(r, p)) {
        ASSERT_EQ(sg[p], 0.0f) << "pool " << p;
      }
    }
    std::vector<uint32_t> pools, tokens;
    model::select_pools(std::span<const float>(sg, nv), K, pools);
    model::expand_selection(pools, static_cast<uint32_t>(step.pos(r)), kKpool, true, tokens);
    ASSERT_EQ(got.counts[r], ref.counts[r]);
    ASSERT_EQ(got.counts[r], static_cast<int32_t>(tokens.size()));
    const int32_t* tg = got.tokens.data() + static_cast<size_t>(r) * (got.tokens.size() / s.rows);
    const int32_t* tr = ref.tokens.data() + static_cast<size_t>(r) * (ref.tokens.size() / s.rows);
    for (size_t i = 0; i < tokens.size(); ++i) {
      ASSERT_EQ(tg[i], tr[i]) << "token " << i << " differs from the per-row kernel's";
      ASSERT_EQ(tg[i], static_cast<int32_t>(tokens[i])) << "token " << i << " differs from model::select_pools";
    }
  }
}

TEST(IndexerDecode, MatchesPerRowKernelsAndCpuRule) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 1;
  for (uint32_t rows : {1u, 4u, 8u}) {
    for (uint32_t pools : {100u, 1000u, 8192u, 33333u, 140000u}) {
      for (bool ties : {false, true}) check_step({rows, pools, 32, 128, 2048}, ties, seed++);
    }
  }
}

TEST(IndexerDecode, OtherHeadCountsAndBudgets) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 100;
  for (uint32_t rows : {1u, 3u, 8u}) {
    for (uint32_t pools : {5u, 700u, 20000u}) {
      check_step({rows, pools, 16, 16, 8}, true, seed++);     // the tests' tiny shape: lanes without a head
      check_step({rows, pools, 48, 64, 2048}, true, seed++);  // two heads on some lanes
      check_step({rows, pools, 32, 128, 40000}, true, seed++);  // a budget of more pools than one chunk
    }
  }
}

// A decode step's slots whose rows all select every visible pool (at most topk / kpool) skip their
// scores: the selections are the per-row kernels' all the same, at depths around that budget (slots
// with rows on both sides of it are scored).
TEST(IndexerDecode, WholeSelectionsNeedNoScores) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 300;
  for (uint32_t rows : {1u, 4u, 8u}) {
    for (uint32_t pools : {5u, 300u, 512u, 513u, 1500u, 33333u}) {
      SCOPED_TRACE(::testing::Message() << "rows " << rows << " pools " << pools);
      Step step({rows, pools, 32, 128, 2048}, true, seed++);
      const Step::Out ref = step.run(false, false);
      step.skip_whole_selections(true);
      for (bool scratch : {false, true}) {
        const Step::Out got = step.run(true, scratch);
        for (uint32_t r = 0; r < rows; ++r) {
          ASSERT_EQ(got.counts[r], ref.counts[r]) << "row " << r;
          const size_t at = static_cast<size_t>(r) * (got.tokens.size() / rows);
          for (int32_t i = 0; i < ref.counts[r]; ++i) {
            ASSERT_EQ(got.tokens[at + i], ref.tokens[at + i]) << "row " << r << " token " << i;
          }
        }
      }
    }
  }
}

TEST(IndexerDecode, Timing) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  for (uint32_t rows : {1u, 8u}) {
    for (uint32_t pools : {8192u, 32768u, 131072u}) {
      Step step({rows, pools, 32, 128, 2048}, true, 7);
      const float by_row = step.time_us(false, false, 5), one = step.time_us(true, false, 5),
                  chunked = step.time_us(true, true, 5);
      std::printf("indexer scores+select, %u rows, %u pools: per-row kernels %.1f us, decode kernels %.1f us "
                  "(selection on a block a row: %.1f us)\n",
                  rows, pools, static_cast<double>(by_row), static_cast<double>(chunked), static_cast<double>(one));
    }
  }
}

}  // namespace
}  // namespace ferry::gpu
#endif
