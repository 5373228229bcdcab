// Sparse MLA of prefill rows on tensor cores (gpu/sparse_mla_tc.hpp) against gpu/dsa.cu's CUDA-core
// kernel and a double-precision CPU loop over the same decoded latents: random queries (some rows
// scaled up so that the softmax is peaked) and latents, in f32, f16 and int8 KV as store_latents
// encodes them, two slots, 32, 24 and 1 heads (whole and partial head groups), selections of 0, 1,
// fewer than a tile, a tile and a bit, and up to 200 positions in random order. The mma.sync kernel
// of int8 latents also against the WMMA kernel, at 64, 32, 24 and 1 heads, every rank step and
// selections around its 64-latent tiles. Also: which shapes sparse_mla() sends to them, that the
// dispatch does, and the errors for shapes they cannot take. Prints one DSA layer's prefill at 2,048
// rows (64 heads, rank 512; row r attending to r + 1 positions, and every row to 2,048 of 34,816 as at
// depth 32K) on each kernel (times not asserted).
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu/cuda_check.hpp"
#include "gpu/cuda_memory.hpp"
#include "gpu/pdl.hpp"
#include "gpu/sparse_mla_tc.hpp"
#include "kv/kv_codec.hpp"
#include "tests/gpu/gpu_test_support.hpp"

namespace ferry::gpu {
namespace {

using config::KvType;
using ferry::testing::have_device;

template <class T>
DeviceBuffer upload(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  FERRY_CUDA(cudaMemcpy(b.get(), v.data(), b.bytes(), cudaMemcpyHostToDevice));
  return b;
}
template <class T>
std::vector<T> download(const DeviceBuffer& b) {
  std::vector<T> v(b.bytes() / sizeof(T));
  FERRY_CUDA(cudaMemcpy(v.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost));
  return v;
}

// A step's sparse attention inputs on the device, with the latents as the cache holds them and as
// the CPU decodes them.
struct Case {
  uint32_t rows, heads, rank, ctx, max_tokens;
  static constexpr uint32_t kSlots = 2;
  std::vector<float> q, decoded;  // decoded: [kSlots * ctx][rank], the cache's values as floats
  std::vector<int32_t> slot, tokens, counts;
  DeviceBuffer d_q, d_lat, d_scales, d_slot, d_tokens, d_counts, d_out;
  KvType type;

  Case(uint32_t rows_, uint32_t heads_, uint32_t rank_, uint32_t ctx_, KvType type_, const std::vector<int32_t>& cnts,
       uint32_t seed)
      : rows(rows_),
        heads(heads_),
        rank(rank_),
        ctx(ctx_),
        max_tokens(static_cast<uint32_t>(*std::max_element(cnts.begin(), cnts.end())) + 4),
        counts(cnts),
        type(type_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    q.resize(size_t{rows} * heads * rank);
    for (size_t i = 0; i < q.size(); ++i) q[i] = nd(rng) * ((i / (size_t{heads} * rank)) % 3 == 2 ? 4.0f : 1.0f);
    std::vector<float> lat(size_t{kSlots} * ctx * rank);
    for (float& v : lat) v = nd(rng);
    tokens.assign(size_t{rows} * max_tokens, -1);
    for (uint32_t r = 0; r < rows; ++r) {
      slot.push_back(static_cast<int32_t>(r % kSlots));
      std::vector<int32_t> all(ctx);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      std::copy(all.begin(), all.begin() + counts[r], tokens.begin() + static_cast<ptrdiff_t>(size_t{r} * max_tokens));
    }
    // The cache in its type, encoded on the device as a stage stores it.
    const DeviceBuffer src = upload(lat);
    const size_t n = size_t{kSlots} * ctx;
    const size_t elem = type == KvType::f32 ? 4 : type == KvType::f16 ? 2 : 1;
    d_lat = DeviceBuffer(n * rank * elem);
    d_scales = DeviceBuffer(n * sizeof(float));
    store_latents(src.as<float>(), rank, RowInfo{}, static_cast<uint32_t>(n), rank, ctx, type, d_lat.get(),
                  d_scales.as<float>(), nullptr);
    FERRY_CUDA(cudaDeviceSynchronize());
    decoded.resize(n * rank);
    if (type == KvType::f32) {
      decoded = download<float>(d_lat);
    } else if (type == KvType::f16) {
      const std::vector<uint16_t> h = download<uint16_t>(d_lat);
      for (size_t i = 0; i < h.size(); ++i) decoded[i] = kv::f16_to_f32(h[i]);
    } else {
      const std::vector<int8_t> c = download<int8_t>(d_lat);
      const std::vector<float> s = download<float>(d_scales);
      for (size_t i = 0; i < c.size(); ++i) decoded[i] = static_cast<float>(c[i]) * s[i / rank];
    }
    d_q = upload(q);
    d_slot = upload(slot);
    d_tokens = upload(tokens);
    d_counts = upload(counts);
    d_out = DeviceBuffer(q.size() * sizeof(float));
  }

  SparseMlaArgs args() const {
    SparseMlaArgs a;
    a.row.slot = d_slot.as<int32_t>();
    a.rows = rows;
    a.heads = heads;
    a.rank = rank;
    a.ctx = ctx;
    a.max_tokens = max_tokens;
    a.scale = 1.0f / 16.0f;
    a.q_lat = d_q.as<float>();
    a.latents = d_lat.get();
    a.latent_scales = d_scales.as<float>();
    a.latent_type = type;
    a.tokens = d_tokens.as<int32_t>();
    a.counts = d_counts.as<int32_t>();
    a.out = d_out.as<float>();
    return a;
  }

  template <class Kernel>
  std::vector<float> run(Kernel kernel) {
    FERRY_CUDA(cudaMemset(d_out.get(), 0xff, d_out.bytes()));  // NaNs where nothing is written
    kernel(args(), nullptr);
    FERRY_CUDA(cudaDeviceSynchronize());
    return download<float>(d_out);
  }

  // out[r][h] = sum_i softmax_i(scale * q . L_i) L_i in doubles.
  std::vector<float> cpu() const {
    std::vector<float> out(q.size(), 0.0f);
    for (uint32_t r = 0; r < rows; ++r) {
      const int32_t* tk = tokens.data() + size_t{r} * max_tokens;
      for (uint32_t h = 0; h < heads; ++h) {
        const float* qh = q.data() + (size_t{r} * heads + h) * rank;
        std::vector<double> s(static_cast<size_t>(counts[r]));
        double mx = -INFINITY;
        for (size_t i = 0; i < s.size(); ++i) {
          const float* l = decoded.data() + (static_cast<size_t>(slot[r]) * ctx + static_cast<size_t>(tk[i])) * rank;
          double d = 0.0;
          for (uint32_t c = 0; c < rank; ++c) d += double{qh[c]} * l[c];
          s[i] = d / 16.0;
          mx = std::max(mx, s[i]);
        }
        double sum = 0.0;
        for (double& v : s) sum += (v = std::exp(v - mx));
        float* o = out.data() + (size_t{r} * heads + h) * rank;
        for (uint32_t c = 0; c < rank; ++c) {
          double acc = 0.0;
          for (size_t i = 0; i < s.size(); ++i) {
            acc += s[i] * decoded[(static_cast<size_t>(slot[r]) * ctx + static_cast<size_t>(tk[i])) * rank + c];
          }
          o[c] = s.empty() ? 0.0f : static_cast<float>(acc / sum);
        }
      }
    }
    return out;
  }
};

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " at " << i;
    ASSERT_NEAR(got[i], want[i], tol * (1.0f + std::fabs(want[i]))) << what << " at " << i;
    worst = std::max(worst, static_cast<double>(std::fabs(got[i] - want[i])));
  }
  std::printf("  %s: max |delta| %.3g\n", what.c_str(), worst);
}

TEST(SparseMlaTc, MatchesTheCudaCoreKernelAndTheCpuOnEveryKvType) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const std::vector<int32_t> counts = {0, 1, 5, 15, 16, 17, 31, 64, 100, 200, 137, 3};
  struct Shape {
    uint32_t heads, rank;
  };
  // Two whole head groups; a whole and a partial one; one head (trained_small's shape).
  for (const KvType type : {KvType::f32, KvType::f16, KvType::int8}) {
    for (const Shape sh : {Shape{32, 512}, Shape{24, 128}, Shape{1, 256}}) {
      const uint32_t rank = sh.rank;
      Case c(static_cast<uint32_t>(counts.size()), sh.heads, rank, 240, type, counts, 11 + rank);
      const std::string name = std::string(config::kv_type_name(type)) + " " + std::to_string(sh.heads) +
                               " heads rank " + std::to_string(rank);
      ASSERT_TRUE(sparse_mla_tc_applies(c.args())) << name;
      const std::vector<float> tc = c.run(sparse_mla_tc);
      const std::vector<float> simt = c.run(sparse_mla_simt);
      const std::vector<float> want = c.cpu();
      expect_close(tc, want, 1e-4f, name + " tensor cores vs CPU");
      expect_close(simt, want, 1e-4f, name + " CUDA cores vs CPU");
      expect_close(tc, simt, 1e-4f, name + " tensor cores vs CUDA cores");
      // sparse_mla() takes the tensor-core kernel for these rows: the same bits.
      EXPECT_EQ(c.run(sparse_mla), tc) << name;
    }
  }
}

TEST(SparseMlaTc, TheMmaKernelMatchesTheCpuAndTheWmmaKernelOnInt8Latents) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  // Around the kernel's 64-latent tiles: none, one, half a tile and one, a tile less one, a tile, a
  // tile and one, two and three tiles and a bit, the whole context.
  const std::vector<int32_t> counts = {0, 1, 33, 63, 64, 65, 128, 129, 200, 137, 3, 240};
  struct Shape {
    uint32_t heads, rank;
  };
  // Two 32-head groups; one; a partial one; one head; ranks of 1 to 4 k-steps a warp.
  for (const Shape sh : {Shape{64, 512}, Shape{32, 384}, Shape{24, 128}, Shape{1, 256}}) {
    Case c(static_cast<uint32_t>(counts.size()), sh.heads, sh.rank, 240, KvType::int8, counts, 7 + sh.rank);
    const std::string name = "int8 " + std::to_string(sh.heads) + " heads rank " + std::to_string(sh.rank);
    if (!sm80_code_ready()) {
      EXPECT_FALSE(sparse_mla_mma_applies(c.args())) << name;
      continue;
    }
    ASSERT_TRUE(sparse_mla_mma_applies(c.args())) << name;
    const std::vector<float> mma = c.run(sparse_mla_mma);
    const std::vector<float> wmma = c.run(sparse_mla_wmma);
    const std::vector<float> want = c.cpu();
    expect_close(mma, want, 1e-4f, name + " mma.sync vs CPU");
    expect_close(wmma, want, 1e-4f, name + " WMMA vs CPU");
    expect_close(mma, wmma, 1e-4f, name + " mma.sync vs WMMA");
    // The dispatch takes it for these rows: the same bits, run after run.
    EXPECT_EQ(c.run(sparse_mla), mma) << name;
    EXPECT_EQ(c.run(sparse_mla_tc), mma) << name;
  }
  if (!sm80_code_ready()) GTEST_SKIP() << "no sm80+ code of the mma.sync kernel on this device";
}

TEST(SparseMlaTc, TheMmaKernelTakesInt8LatentsOnly) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  SparseMlaArgs a;
  a.rows = 12;
  a.heads = 64;
  a.rank = 512;
  a.latent_type = KvType::int8;
  EXPECT_EQ(sparse_mla_mma_applies(a), sm80_code_ready());
  for (const KvType other : {KvType::f32, KvType::f16}) {
    a.latent_type = other;
    EXPECT_FALSE(sparse_mla_mma_applies(a)) << config::kv_type_name(other);
  }
  a.latent_type = KvType::int8;
  a.rank = 640;
  EXPECT_FALSE(sparse_mla_mma_applies(a));
  a.rank = 192;
  EXPECT_FALSE(sparse_mla_mma_applies(a));
  try {
    sparse_mla_mma(a, nullptr);
    FAIL() << "rank 192 was taken";
  } catch (const CudaError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 192"), std::string::npos) << e.what();
  }
}

TEST(SparseMlaTc, DecodeRowsAndShapesItCannotTakeStayOnTheCudaCoreKernel) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  SparseMlaArgs a;
  a.rows = 12;
  a.heads = 64;
  a.rank = 512;
  EXPECT_TRUE(sparse_mla_tc_applies(a));
  a.rows = kMaxMatvecTokens;
  EXPECT_FALSE(sparse_mla_tc_applies(a));
  a.split_rows = 64;  // a windowed step's group of rows plans as its whole step does
  EXPECT_TRUE(sparse_mla_tc_applies(a));
  a.rows = 12;
  a.heads = 1;
  EXPECT_TRUE(sparse_mla_tc_applies(a));
  a.rank = 640;
  EXPECT_FALSE(sparse_mla_tc_applies(a));
  a.rank = 32;
  EXPECT_FALSE(sparse_mla_tc_applies(a));
  try {
    sparse_mla_tc(a, nullptr);
    FAIL() << "rank 32 was taken";
  } catch (const CudaError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 32"), std::string::npos) << e.what();
  }
}

// Mean milliseconds of `kernel` on c over three runs after a warm-up, printed with its rate over
// `flop`; the warm-up's output.
template <class Kernel>
std::vector<float> time_kernel(Case& c, Kernel kernel, double flop, const std::string& what) {
  std::vector<float> out = c.run(kernel);
  Event start, stop;
  start.record(nullptr);
  constexpr int kReps = 3;
  for (int i = 0; i < kReps; ++i) kernel(c.args(), nullptr);
  stop.record(nullptr);
  FERRY_CUDA(cudaEventSynchronize(stop.get()));
  const double ms = stop.since(start) / kReps;
  std::printf("  sparse MLA, %s: %.2f ms (%.1f TFLOP/s of %.0f GFLOP)\n", what.c_str(), ms, flop / ms * 1e-9,
              flop * 1e-9);
  return out;
}

// One DSA layer's prefill of 2,048 rows x 64 heads x rank 512 (scores and values: 4 flop a head,
// position and rank column) on the tensor-core kernels and the CUDA-core one, compared.
void print_one_layer(uint32_t ctx, const std::vector<int32_t>& counts, const std::string& depth) {
  double pairs = 0.0;
  for (const int32_t n : counts) pairs += n;
  const double flop = 2.0 * 2.0 * 64 * 512 * pairs;
  for (const KvType type : {KvType::int8, KvType::f32}) {
    Case c(static_cast<uint32_t>(counts.size()), 64, 512, ctx, type, counts, 5);
    const std::string at = std::string(config::kv_type_name(type)) + " KV, 2048 rows x 64 heads x rank 512, " + depth;
    const std::vector<float> simt = time_kernel(c, sparse_mla_simt, flop, at + ": CUDA cores");
    const std::vector<float> wmma = time_kernel(c, sparse_mla_wmma, flop, at + ": WMMA");
    expect_close(wmma, simt, 1e-4f, at + ", WMMA vs CUDA cores");
    if (sparse_mla_mma_applies(c.args())) {
      const std::vector<float> mma = time_kernel(c, sparse_mla_mma, flop, at + ": mma.sync");
      expect_close(mma, simt, 1e-4f, at + ", mma.sync vs CUDA cores");
    }
  }
}

TEST(SparseMlaTc, PrintsOneLayersPrefillAt2048Rows) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  constexpr uint32_t kRows = 2048;
  std::vector<int32_t> counts(kRows);
  std::iota(counts.begin(), counts.end(), 1);  // row r attends to r + 1 positions, as under index_topk 2,048
  print_one_layer(kRows, counts, "depth 0");
}

TEST(SparseMlaTc, PrintsOneLayersPrefillAt2048RowsAtDepth32K) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  constexpr uint32_t kRows = 2048;
  // Every row selects index_topk 2,048 of 32,768 + 2,048 positions (random ones: the CPU loop would
  // take minutes, so the kernels are compared with each other).
  print_one_layer(32768 + kRows, std::vector<int32_t>(kRows, 2048), "depth 32K");
}

}  // namespace
}  // namespace ferry::gpu
#endif
