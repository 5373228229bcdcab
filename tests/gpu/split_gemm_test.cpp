// The prefill products' split, W_hi x_hi + (W_hi x_lo + W_lo x_hi) / 2^12 in fp16 GEMMs with fp32
// accumulation: the two correction products as one GEMM of depth 2K ([W_hi | W_lo] [x_lo ; x_hi]: each
// weight row holds its hi then its lo values, each input row its lo then its hi), as LayerRunner::mm and
// mm_grouped run them, against three GEMMs of depth K (both before), and on sm89+ the corrections as one e4m3
// product of depth 2K (cublasLt) as mm_staged runs them there. Printed, not asserted beyond loose bounds: the
// max |delta| of each form (and of plain fp16, the first product alone) against an f64 reference over a sample
// of outputs at a KDA projection's shape (Q4_K 8192 x 4096, 2,048 rows), and the time of each form at the GLM
// shapes (median of 5 runs of 5 calls, the first run a warm-up), per head for mm_grouped's.
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gpu/cuda_blas.hpp"
#include "gpu/cuda_blas_lt.hpp"
#include "gpu/cuda_check.hpp"
#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "gpu/workspace.hpp"
#include "model/formats/quant.hpp"
#include "model/formats/half.hpp"
#include "tests/gpu/e4m3_host.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/gpu/quant_rows.hpp"

namespace ferry::gpu {
namespace {

constexpr int kTokens = 2048;

void split(float v, uint16_t& hi, uint16_t& lo) {
  hi = model::f32_to_fp16(v);
  lo = model::f32_to_fp16((v - model::fp16_to_f32(hi)) * 4096.0f);
}

template <class E>
DeviceBuffer upload(const std::vector<E>& v) {
  DeviceBuffer b(v.size() * sizeof(E));
  FERRY_CUDA(cudaMemcpy(b.get(), v.data(), b.bytes(), cudaMemcpyHostToDevice));
  return b;
}

// The operands of both forms for W [M][K] (row-major) and x [kTokens][K].
struct Operands {
  DeviceBuffer wh, wl, xh, xl;  // three products: hi and lo apart, rows of K
  DeviceBuffer w2, x2;          // depth 2K: rows [hi | lo] and [lo | hi]
  DeviceBuffer w8, x8;          // e4m3 corrections: rows [hi | lo] * sw and [lo | hi] * sx
  DeviceBuffer descales;        // 1 / sw, then 1 / sx 16 bytes on
};

Operands make_operands(const std::vector<float>& w, const std::vector<float>& x, size_t M, size_t K) {
  std::vector<uint16_t> wh(M * K), wl(M * K), w2(M * 2 * K), xh(kTokens * K), xl(kTokens * K), x2(kTokens * 2 * K);
  for (size_t r = 0; r < M; ++r) {
    for (size_t k = 0; k < K; ++k) {
      split(w[r * K + k], wh[r * K + k], wl[r * K + k]);
      w2[r * 2 * K + k] = wh[r * K + k];
      w2[r * 2 * K + K + k] = wl[r * K + k];
    }
  }
  for (size_t t = 0; t < kTokens; ++t) {
    for (size_t k = 0; k < K; ++k) {
      split(x[t * K + k], xh[t * K + k], xl[t * K + k]);
      x2[t * 2 * K + k] = xl[t * K + k];
      x2[t * 2 * K + K + k] = xh[t * K + k];
    }
  }
  // The e4m3 corrections as the conversions write them: a weight's f32 value and the split's (v - hi) * 2^12
  // before its fp16 rounding (dequantize_to_e4m3_split), an input's fp16 lo and hi (half_split_to_e4m3).
  float wmax = 0.0f, xmax = 0.0f;
  for (float v : w) wmax = std::max(wmax, std::fabs(v));
  for (uint16_t h : xh) xmax = std::max(xmax, std::fabs(model::fp16_to_f32(h)));
  const float sw = testing::e4m3_scale(wmax), sx = testing::e4m3_scale(xmax);
  std::vector<uint8_t> w8(M * 2 * K), x8(kTokens * 2 * K);
  for (size_t r = 0; r < M; ++r) {
    for (size_t k = 0; k < K; ++k) {
      const float v = w[r * K + k], lo = (v - model::fp16_to_f32(wh[r * K + k])) * kHalfLoScale;
      w8[r * 2 * K + k] = testing::f32_to_e4m3(v * sw);
      w8[r * 2 * K + K + k] = testing::f32_to_e4m3(lo * sw);
    }
  }
  for (size_t t = 0; t < kTokens; ++t) {
    for (size_t k = 0; k < K; ++k) {
      x8[t * 2 * K + k] = testing::f32_to_e4m3(model::fp16_to_f32(xl[t * K + k]) * sx);
      x8[t * 2 * K + K + k] = testing::f32_to_e4m3(model::fp16_to_f32(xh[t * K + k]) * sx);
    }
  }
  const std::vector<float> descales = {1.0f / sw, 0.0f, 0.0f, 0.0f, 1.0f / sx};  // 16 bytes apart, as cublasLt wants
  return {upload(wh), upload(wl), upload(xh), upload(xl), upload(w2), upload(x2), upload(w8), upload(x8),
          upload(descales)};
}

class SplitGemm {
 public:
  SplitGemm() : ws_(Workspace::kCublasWorkspace) {
    FERRY_CUBLAS(blas::api().create(&h_));
    FERRY_CUBLAS(blas::api().set_stream(h_, s_.get()));
    FERRY_CUBLAS(blas::api().set_workspace(h_, ws_.get(), ws_.bytes()));
  }
  ~SplitGemm() { blas::api().destroy(h_); }
  cudaStream_t stream() const { return s_.get(); }
  void* workspace() const { return ws_.get(); }

  // y[t][M] = sum_k A[i][k] B[t][k] * alpha + beta y, A rows lda apart, B rows ldb apart.
  void gemm(size_t M, size_t K, const void* a, size_t lda, const void* b, size_t ldb, float alpha, float beta,
            float* y, int n = kTokens) {
    FERRY_CUBLAS(blas::api().gemm_ex(h_, blas::op_t, blas::op_n, static_cast<int>(M), n, static_cast<int>(K),
                                     &alpha, a, CUDA_R_16F, static_cast<int>(lda), b, CUDA_R_16F,
                                     static_cast<int>(ldb), &beta, y, CUDA_R_32F, static_cast<int>(M),
                                     blas::compute_32f, blas::gemm_default));
  }
  // Today's three products.
  void three(const Operands& o, size_t M, size_t K, float* y) {
    const float lo = 1.0f / kHalfLoScale;
    gemm(M, K, o.wh.get(), K, o.xh.get(), K, 1.0f, 0.0f, y);
    gemm(M, K, o.wh.get(), K, o.xl.get(), K, lo, 1.0f, y);
    gemm(M, K, o.wl.get(), K, o.xh.get(), K, lo, 1.0f, y);
  }
  // The main product, then both corrections as one of depth 2K.
  void two(const Operands& o, size_t M, size_t K, float* y) {
    const uint16_t* x2 = o.x2.as<uint16_t>();
    gemm(M, K, o.w2.get(), 2 * K, x2 + K, 2 * K, 1.0f, 0.0f, y);
    gemm(M, 2 * K, o.w2.get(), 2 * K, x2, 2 * K, 1.0f / kHalfLoScale, 1.0f, y);
  }
  // Per-head products (LayerRunner::mm_grouped): `heads` batches of W_g [M][K] x_g [kTokens][K], the inputs of a
  // token's heads side by side (rows of heads * K, or of heads * 2K as [lo | hi] per head in the depth-2K form).
  void batched(size_t heads, size_t M, size_t K, const void* a, size_t lda, const void* b, size_t ldb, size_t head_b,
               float alpha, float beta, float* y) {
    FERRY_CUBLAS(blas::api().gemm_strided_ex(
        h_, blas::op_t, blas::op_n, static_cast<int>(M), kTokens, static_cast<int>(K), &alpha, a, CUDA_R_16F,
        static_cast<int>(lda), static_cast<long long>(M * lda), b, CUDA_R_16F, static_cast<int>(ldb),
        static_cast<long long>(head_b), &beta, y, CUDA_R_32F, static_cast<int>(heads * M), static_cast<long long>(M),
        static_cast<int>(heads), blas::compute_32f, blas::gemm_default));
  }
  // The corrections as one e4m3 product of depth 2K (cublasLt, sm89+), then the main product in fp16 onto them
  // (LayerRunner::mm_staged's order). False where cublasLt takes none of it.
  bool fp8(blas::lt::Fp8Gemm& f8, const Operands& o, size_t M, size_t K, float* y) {
    const uint16_t* x2 = o.x2.as<uint16_t>();
    const float* d = o.descales.as<float>();
    if (!f8.run(static_cast<int>(M), kTokens, static_cast<int>(2 * K), 1.0f / kHalfLoScale, o.w8.get(),
                static_cast<int>(2 * K), d, o.x8.get(), static_cast<int>(2 * K), d + 4, 0.0f, y, static_cast<int>(M),
                ws_.get(), ws_.bytes(), s_.get())) {
      return false;
    }
    gemm(M, K, o.w2.get(), 2 * K, x2 + K, 2 * K, 1.0f, 1.0f, y);
    return true;
  }
  double median_us(const std::function<void()>& call) {
    Event e0, e1;
    std::vector<double> t;
    for (int run = 0; run < 6; ++run) {
      e0.record(s_.get());
      for (int i = 0; i < 5; ++i) call();
      e1.record(s_.get());
      s_.synchronize();
      if (run > 0) t.push_back(e1.since(e0) * 1000.0 / 5.0);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }

 private:
  Stream s_;
  DeviceBuffer ws_;
  blas::Handle h_ = nullptr;
};

TEST(SplitGemm, CorrectionsAsOneProductOfTwiceTheDepth) {
  if (!testing::have_device()) GTEST_SKIP() << "no CUDA device";
  constexpr size_t M = 8192, K = 4096;
  const std::vector<float> w =
      testing::dequant(model::GgmlType::Q4_K, testing::random_q4k_blocks(M, K), M * K);
  std::mt19937 rng(83);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t{kTokens} * K);
  for (float& v : x) v = nd(rng);
  const Operands o = make_operands(w, x, M, K);
  SplitGemm g;
  DeviceBuffer y3(size_t{kTokens} * M * 4), y2(y3.bytes()), y1(y3.bytes()), y8(y3.bytes());
  g.three(o, M, K, y3.as<float>());
  g.two(o, M, K, y2.as<float>());
  blas::lt::Fp8Gemm f8;
  const bool have8 = g.fp8(f8, o, M, K, y8.as<float>());
  g.gemm(M, K, o.wh.get(), K, o.xh.get(), K, 1.0f, 0.0f, y1.as<float>());
  FERRY_CUDA(cudaStreamSynchronize(g.stream()));
  std::vector<float> h3(size_t{kTokens} * M), h2(h3.size()), h1(h3.size()), h8(h3.size());
  FERRY_CUDA(cudaMemcpy(h8.data(), y8.get(), y8.bytes(), cudaMemcpyDeviceToHost));
  FERRY_CUDA(cudaMemcpy(h3.data(), y3.get(), y3.bytes(), cudaMemcpyDeviceToHost));
  FERRY_CUDA(cudaMemcpy(h2.data(), y2.get(), y2.bytes(), cudaMemcpyDeviceToHost));
  FERRY_CUDA(cudaMemcpy(h1.data(), y1.get(), y1.bytes(), cudaMemcpyDeviceToHost));
  // Every output against each other; a sample of 4,096 against the f64 sums (|delta| and |delta| over
  // the sum of |W x| terms).
  double d32 = 0.0;
  for (size_t i = 0; i < h3.size(); ++i) d32 = std::max(d32, double(std::fabs(h3[i] - h2[i])));
  double abs3 = 0.0, abs2 = 0.0, abs1 = 0.0, rel3 = 0.0, rel2 = 0.0, rel1 = 0.0, abs8 = 0.0, rel8 = 0.0;
  std::uniform_int_distribution<size_t> pick_row(0, M - 1), pick_tok(0, kTokens - 1);
  for (int s = 0; s < 4096; ++s) {
    const size_t r = pick_row(rng), t = pick_tok(rng);
    double sum = 0.0, mag = 0.0;
    for (size_t k = 0; k < K; ++k) {
      const double p = double(w[r * K + k]) * x[t * K + k];
      sum += p;
      mag += std::fabs(p);
    }
    const size_t at = t * M + r;
    const double e3 = std::fabs(h3[at] - sum), e2 = std::fabs(h2[at] - sum), e1 = std::fabs(h1[at] - sum);
    abs3 = std::max(abs3, e3), abs2 = std::max(abs2, e2), abs1 = std::max(abs1, e1);
    rel3 = std::max(rel3, e3 / mag), rel2 = std::max(rel2, e2 / mag), rel1 = std::max(rel1, e1 / mag);
    const double e8 = std::fabs(h8[at] - sum);
    abs8 = std::max(abs8, e8), rel8 = std::max(rel8, e8 / mag);
  }
  if (have8) {
    std::printf("[ split ] e4m3 corrections (sm89+) max |delta| %.3g (%.3g of sum |Wx|)\n", abs8, rel8);
    EXPECT_LT(rel8, rel1 / 10);  // well below plain fp16
  }
  std::printf("[ split ] Q4_K %zu x %zu, %d rows, 4096 sampled outputs against f64: three products max |delta| "
              "%.3g (%.3g of sum |Wx|), depth-2K form %.3g (%.3g), plain fp16 %.3g (%.3g); three vs 2K over every "
              "output %.3g\n",
              M, K, kTokens, abs3, rel3, abs2, rel2, abs1, rel1, d32);
  EXPECT_LT(rel2, 10 * rel3 + 1e-6);

  // Speed at the GLM shapes (contents do not matter here: fp16 ones).
  for (const auto& [rows, depth] : {std::pair<size_t, size_t>{8192, 4096}, {4096, 8192}, {12288, 4096},
                                    {4096, 12288}, {16384, 1536}, {2048, 4096}}) {
    Operands t;
    const size_t wn = rows * depth, xn = size_t{kTokens} * depth;
    t.wh = DeviceBuffer(wn * 2), t.wl = DeviceBuffer(wn * 2), t.w2 = DeviceBuffer(wn * 4);
    t.xh = DeviceBuffer(xn * 2), t.xl = DeviceBuffer(xn * 2), t.x2 = DeviceBuffer(xn * 4);
    for (DeviceBuffer* b : {&t.wh, &t.wl, &t.w2, &t.xh, &t.xl, &t.x2}) {
      FERRY_CUDA(cudaMemset(b->get(), 0x3c, b->bytes()));
    }
    DeviceBuffer y(size_t{kTokens} * rows * 4);
    const double us3 = g.median_us([&] { g.three(t, rows, depth, y.as<float>()); });
    const double us2 = g.median_us([&] { g.two(t, rows, depth, y.as<float>()); });
    t.w8 = DeviceBuffer(wn * 2), t.x8 = DeviceBuffer(xn * 2);
    FERRY_CUDA(cudaMemset(t.w8.get(), 0x30, t.w8.bytes()));
    FERRY_CUDA(cudaMemset(t.x8.get(), 0x30, t.x8.bytes()));
    const std::vector<float> ones(8, 1.0f);
    t.descales = upload(ones);
    const double us8 = have8 ? g.median_us([&] { g.fp8(f8, t, rows, depth, y.as<float>()); }) : 0.0;
    const double us1 =
        g.median_us([&] { g.gemm(rows, depth, t.wh.get(), depth, t.xh.get(), depth, 1.0f, 0.0f, y.as<float>()); });
    const double flop = 2.0 * rows * depth * kTokens;
    std::printf("[ timing ] split product %zu x %zu, %d rows: three products %.1f us (%.0f TFLOPS counted), depth-2K "
                "form %.1f us (%.0f), e4m3 corrections %.1f (%.0f); the main product alone %.1f\n",
                rows, depth, kTokens, us3, flop / us3 / 1e6, us2, flop / us2 / 1e6, us8, have8 ? flop / us8 / 1e6 : 0.0,
                us1);
  }
}

// LayerRunner::mm_staged's two forms end to end over its staging layouts (the e4m3 one on sm89+): the weights
// through dequantize_to_half (rows hi | lo) or dequantize_to_e4m3_split (rows of fp16 hi then e4m3 values and lo
// parts, 4K bytes apart), the input through float_to_half (and half_split_to_e4m3), the corrections on cuBLAS or
// cublasLt, the main product; a sample of outputs against f64 sums, as above. At a KDA projection's depth and at
// the fixtures' (64, 512): why mm_staged keeps the fp16 form below kE4m3MinDepth.
TEST(SplitGemm, BothFormsInMmsStagingLayouts) {
  if (!testing::have_device() || !e4m3_split_ready()) GTEST_SKIP() << "no sm89+ device or code";
  upload_quant_tables();
  SplitGemm g;
  blas::lt::Fp8Gemm f8;
  struct Case {
    model::GgmlType type;
    size_t M, K;
    int n;
  };
  for (const Case& c : {Case{model::GgmlType::Q4_K, 4096, 4096, 2048}, Case{model::GgmlType::Q8_0, 384, 64, 70},
                        Case{model::GgmlType::Q8_0, 256, 512, 203}}) {
    const size_t M = c.M, K = c.K, n = static_cast<size_t>(c.n);
    std::mt19937 rng(89 + static_cast<int>(K));
    const std::vector<uint8_t> blocks = c.type == model::GgmlType::Q4_K ? testing::random_q4k_blocks(M, K)
                                                                        : testing::random_rows(c.type, M, K, rng);
    const std::vector<float> w = testing::dequant(c.type, blocks, M * K);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(n * K);
    for (float& v : x) v = nd(rng);
    const DeviceBuffer d_blocks = upload(blocks), d_x = upload(x);
    DevMatrix m;
    m.type = c.type;
    m.data = d_blocks.as<uint8_t>();
    m.rows = static_cast<uint32_t>(M);
    m.cols = static_cast<uint32_t>(K);
    m.row_bytes = *model::ggml_bytes(c.type, K);
    DeviceBuffer ws(M * 2 * K * 2), xs(n * 2 * K * 2), x8(n * 2 * K), words(64), y16(n * M * 4), y8(n * M * 4);
    uint32_t* wd = words.as<uint32_t>();
    uint16_t* xh = xs.as<uint16_t>();
    uint16_t* wh = ws.as<uint16_t>();
    float_to_half(d_x.as<float>(), K, n, K, xh + K, g.stream(), xh, 2 * K);
    dequantize_to_half(m, 0, M, wh, g.stream(), wh + K, 2 * K);
    g.gemm(M, K, wh, 2 * K, xh + K, 2 * K, 1.0f, 0.0f, y16.as<float>(), c.n);
    g.gemm(M, 2 * K, wh, 2 * K, xh, 2 * K, 1.0f / kHalfLoScale, 1.0f, y16.as<float>(), c.n);
    ASSERT_TRUE(dequantize_to_e4m3_split(m, 0, M, wh, 2 * K, wd + 1, reinterpret_cast<float*>(wd), false, g.stream()));
    half_split_to_e4m3(xh, 2 * K, n, K, x8.get(), wd + 5, reinterpret_cast<float*>(wd + 4), g.stream());
    ASSERT_TRUE(f8.run(static_cast<int>(M), c.n, static_cast<int>(2 * K), 1.0f / kHalfLoScale, ws.as<uint8_t>() + 2 * K,
                       static_cast<int>(4 * K), reinterpret_cast<const float*>(wd), x8.get(), static_cast<int>(2 * K),
                       reinterpret_cast<const float*>(wd + 4), 0.0f, y8.as<float>(), static_cast<int>(M), g.workspace(),
                       Workspace::kCublasWorkspace, g.stream()));
    g.gemm(M, K, wh, 2 * K, xh + K, 2 * K, 1.0f, 1.0f, y8.as<float>(), c.n);
    FERRY_CUDA(cudaStreamSynchronize(g.stream()));
    std::vector<float> h16(n * M), h8(n * M);
    FERRY_CUDA(cudaMemcpy(h16.data(), y16.get(), y16.bytes(), cudaMemcpyDeviceToHost));
    FERRY_CUDA(cudaMemcpy(h8.data(), y8.get(), y8.bytes(), cudaMemcpyDeviceToHost));
    double rel16 = 0.0, rel8 = 0.0, rms16 = 0.0, rms8 = 0.0;
    std::uniform_int_distribution<size_t> pick_row(0, M - 1), pick_tok(0, n - 1);
    constexpr int kSamples = 4096;
    for (int s = 0; s < kSamples; ++s) {
      const size_t r = pick_row(rng), t = pick_tok(rng);
      double sum = 0.0, mag = 0.0;
      for (size_t k = 0; k < K; ++k) {
        const double p = double(w[r * K + k]) * x[t * K + k];
        sum += p;
        mag += std::fabs(p);
      }
      const double e16 = std::fabs(h16[t * M + r] - sum) / mag, e8 = std::fabs(h8[t * M + r] - sum) / mag;
      rel16 = std::max(rel16, e16), rel8 = std::max(rel8, e8), rms16 += e16 * e16, rms8 += e8 * e8;
    }
    std::printf("[ split ] mm's layouts, %s %zu x %zu, %d rows: |delta| over sum |Wx| max / rms: fp16 form %.3g / %.3g, "
                "e4m3 form %.3g / %.3g\n",
                std::string(model::ggml_type_traits(c.type).name).c_str(), M, K, c.n, rel16,
                std::sqrt(rms16 / kSamples), rel8, std::sqrt(rms8 / kSamples));
    EXPECT_LT(rel8, 2e-5);  // loose: plain fp16 at depth 4,096 is 2.9e-5 (above)
  }
}

// The per-head products of a DSA layer at 2,048 rows (attn_k_b: 64 heads of 512 x 256; attn_v_b: 64 of 256 x 512)
// in both forms, as mm_grouped's strided-batched GEMMs: time only (the same arithmetic as above, a head at a time).
TEST(SplitGemm, PerHeadProductsInBothForms) {
  if (!testing::have_device()) GTEST_SKIP() << "no CUDA device";
  constexpr size_t kHeads = 64;
  SplitGemm g;
  const float lo = 1.0f / kHalfLoScale;
  for (const auto& [M, K] : {std::pair<size_t, size_t>{512, 256}, {256, 512}}) {
    DeviceBuffer wh(kHeads * M * K * 2), wl(wh.bytes()), w2(2 * wh.bytes()), xh(kTokens * kHeads * K * 2),
        xl(xh.bytes()), x2(2 * xh.bytes()), y(size_t{kTokens} * kHeads * M * 4);
    for (DeviceBuffer* b : {&wh, &wl, &w2, &xh, &xl, &x2}) FERRY_CUDA(cudaMemset(b->get(), 0x3c, b->bytes()));
    const size_t row = kHeads * K;
    const double us3 = g.median_us([&] {
      g.batched(kHeads, M, K, wh.get(), K, xh.get(), row, K, 1.0f, 0.0f, y.as<float>());
      g.batched(kHeads, M, K, wh.get(), K, xl.get(), row, K, lo, 1.0f, y.as<float>());
      g.batched(kHeads, M, K, wl.get(), K, xh.get(), row, K, lo, 1.0f, y.as<float>());
    });
    const uint16_t* x = x2.as<uint16_t>();
    const double us2 = g.median_us([&] {
      g.batched(kHeads, M, K, w2.get(), 2 * K, x + K, 2 * row, 2 * K, 1.0f, 0.0f, y.as<float>());
      g.batched(kHeads, M, 2 * K, w2.get(), 2 * K, x, 2 * row, 2 * K, lo, 1.0f, y.as<float>());
    });
    std::printf("[ timing ] split per-head products %zu heads of %zu x %zu, %d rows: three products %.1f us, "
                "depth-2K form %.1f us\n",
                kHeads, M, K, kTokens, us3, us2);
  }
}

}  // namespace
}  // namespace ferry::gpu
#endif
