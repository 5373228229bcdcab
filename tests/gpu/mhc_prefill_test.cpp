// The prefill mHC site in one launch (gpu/mhc_prefill.cu) against mhc_post's bits for the streams and
// the CPU's mixer (model/cpu/mhc.cpp, logits in f64) for x, post and comb, at GLM's shape (H = 4, D =
// 4,096) with tiles of 16 rows full and partly filled, and at a width whose units do not fill the
// cluster; against the path it replaces (mhc_post, the SGEMM mixer product, the one-block mhc_pre) by
// the largest difference (printed); and its time beside that path's (printed, not asserted).
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gpu/cuda_blas.hpp"
#include "gpu/cuda_check.hpp"
#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "gpu/mhc_prefill.hpp"
#include "gpu/workspace.hpp"
#include "model/cpu/mhc.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/gpu/graph_timing.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::have_device;

constexpr uint32_t kH = 4, kMix = (2 + kH) * kH;

std::vector<float> down(const DeviceBuffer& d, size_t n) {
  std::vector<float> h(n);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(h.data(), d.get(), n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}
void up(DeviceBuffer& d, const std::vector<float>& h) {
  ASSERT_EQ(cudaMemcpy(d.get(), h.data(), h.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
}

// A site's inputs (random streams, mixer, sublayer output and the site before's coefficients) on the
// device, and the buffers it writes.
struct Site {
  uint32_t rows, D;
  std::vector<float> streams, fn, base, scale, norm_w, y, post_in, comb_in;
  DeviceBuffer d_streams, d_fn, d_base, d_scale, d_norm, d_y, d_x, d_post, d_comb, d_mix;
  DevMatrix fn_m;

  Site(uint32_t rows_, uint32_t D_, std::mt19937& rng)
      : rows(rows_), D(D_), streams(size_t{rows_} * kH * D_), fn(size_t{kMix} * kH * D_), base(kMix), scale(3),
        norm_w(D_), y(size_t{rows_} * D_), post_in(size_t{rows_} * kH), comb_in(size_t{rows_} * kH * kH),
        d_streams(streams.size() * 4), d_fn(fn.size() * 4), d_base(kMix * 4), d_scale(12), d_norm(size_t{D_} * 4),
        d_y(y.size() * 4), d_x(size_t{rows_} * D_ * 4), d_post(post_in.size() * 4), d_comb(comb_in.size() * 4),
        d_mix(size_t{rows_} * kMix * 4) {
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::uniform_real_distribution<float> u(0.5f, 1.5f), c(0.05f, 0.5f);
    for (float& v : streams) v = n(rng);
    // fn ~ N(0, 1/(H D)): logits of order 1, the softmax and the sigmoids away from saturation.
    const float fs = 1.0f / std::sqrt(static_cast<float>(kH * D));
    for (float& v : fn) v = n(rng) * fs;
    for (float& v : base) v = n(rng);
    scale = {0.6f, 0.8f, 1.7f};
    for (float& v : norm_w) v = u(rng);
    for (float& v : y) v = n(rng);
    for (float& v : post_in) v = 4.0f * c(rng);
    for (float& v : comb_in) v = c(rng);
    up(d_fn, fn);
    up(d_base, base);
    up(d_scale, scale);
    up(d_norm, norm_w);
    up(d_y, y);
    fn_m.type = model::GgmlType::F32;
    fn_m.data = d_fn.as<uint8_t>();
    fn_m.rows = kMix;
    fn_m.cols = kH * D;
    fn_m.row_bytes = size_t{fn_m.cols} * 4;
    reset();
  }
  // The streams and the post's coefficients as the layer runner has them before the site; outputs
  // poisoned (NaN).
  void reset() {
    up(d_streams, streams);
    up(d_post, post_in);
    up(d_comb, comb_in);
    ASSERT_EQ(cudaMemset(d_x.get(), 0xff, size_t{rows} * D * 4), cudaSuccess);
  }
  MhcArgs args() {
    MhcArgs a;
    a.streams = d_streams.as<float>();
    a.mix = d_mix.as<float>();
    a.base = d_base.as<float>();
    a.scale = d_scale.as<float>();
    a.norm_w = d_norm.as<float>();
    a.rows = rows;
    a.H = kH;
    a.D = D;
    a.iters = 20;
    a.x = d_x.as<float>();
    a.post = d_post.as<float>();
    a.comb = d_comb.as<float>();
    return a;
  }
  MhcPostPre fused(bool with_post) {
    MhcPostPre p;
    p.pre = args();
    p.pre.mix = nullptr;
    p.fn = &fn_m;
    p.streams = d_streams.as<float>();
    p.y = with_post ? d_y.as<float>() : nullptr;
    p.post_in = d_post.as<float>();
    p.comb_in = d_comb.as<float>();
    return p;
  }

  struct Out {
    std::vector<float> streams, x, post, comb;
  };
  Out read() {
    return {down(d_streams, streams.size()), down(d_x, size_t{rows} * D), down(d_post, post_in.size()),
            down(d_comb, comb_in.size())};
  }

  // The CPU's mixer on streams R: logits in f64, 1/rms in f64, model::mhc_coefficients, the collapse
  // and its RMSNorm in f64.
  Out cpu(const std::vector<float>& R_all) const {
    Out o{R_all, std::vector<float>(size_t{rows} * D), std::vector<float>(size_t{rows} * kH),
          std::vector<float>(size_t{rows} * kH * kH)};
    model::MhcConfig c;
    c.streams = kH;
    const size_t HD = size_t{kH} * D;
    for (uint32_t r = 0; r < rows; ++r) {
      const float* R = &R_all[r * HD];
      double ss = 0;
      for (size_t i = 0; i < HD; ++i) ss += double(R[i]) * R[i];
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / double(HD) + 1e-5));
      float m[kMix], pre[kH];
      for (uint32_t i = 0; i < kMix; ++i) {
        double s = 0;
        for (size_t k = 0; k < HD; ++k) s += double(fn[i * HD + k]) * R[k];
        m[i] = static_cast<float>(s) * inv;
      }
      model::mhc_coefficients(c, m, base.data(), scale.data(), pre, &o.post[r * kH], &o.comb[r * kH * kH]);
      std::vector<double> u(D);
      double su = 0;
      for (uint32_t d = 0; d < D; ++d) {
        for (uint32_t h = 0; h < kH; ++h) u[d] += double(pre[h]) * R[h * D + d];
        su += u[d] * u[d];
      }
      const double inv_u = 1.0 / std::sqrt(su / D + 1e-5);
      for (uint32_t d = 0; d < D; ++d) o.x[size_t{r} * D + d] = static_cast<float>(u[d] * inv_u * norm_w[d]);
    }
    return o;
  }
};

class Blas {
 public:
  Blas() : ws_(Workspace::kCublasWorkspace) {
    FERRY_CUBLAS(blas::api().create(&h_));
    FERRY_CUBLAS(blas::api().set_workspace(h_, ws_.get(), ws_.bytes()));
  }
  ~Blas() { blas::api().destroy(h_); }
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  // The layer runner's separate steps before: mhc_post, fn @ streams on SGEMM, the one-block pre.
  void post(Site& s, cudaStream_t st) {
    mhc_post(s.d_streams.as<float>(), s.d_y.as<float>(), s.d_post.as<float>(), s.d_comb.as<float>(), s.rows, kH,
             s.D, st);
  }
  void product(Site& s, cudaStream_t st) {
    const float one = 1.0f, zero = 0.0f;
    const int K = static_cast<int>(kH * s.D);
    FERRY_CUBLAS(blas::api().set_stream(h_, st));
    FERRY_CUBLAS(blas::api().sgemm(h_, blas::op_t, blas::op_n, kMix, static_cast<int>(s.rows), K, &one,
                                   s.d_fn.as<float>(), K, s.d_streams.as<float>(), K, &zero, s.d_mix.as<float>(),
                                   kMix));
  }
  void separate(Site& s, bool with_post, cudaStream_t st) {
    if (with_post) post(s, st);
    product(s, st);
    mhc_pre_one_block(s.args(), st);
  }

 private:
  DeviceBuffer ws_;
  blas::Handle h_ = nullptr;
};

double max_rel(const std::vector<float>& got, const std::vector<float>& want) {
  double m = 0;
  for (size_t i = 0; i < got.size(); ++i) m = std::max(m, std::abs(double(got[i]) - want[i]) / (1.0 + std::abs(want[i])));
  return m;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * (1.0 + std::abs(want[i]))) << what << " [" << i << "] of " << got.size();
  }
}

void check_site(uint32_t rows, uint32_t D, bool with_post, std::mt19937& rng) {
  Site s(rows, D, rng);
  SCOPED_TRACE("rows " + std::to_string(rows) + " D " + std::to_string(D) + (with_post ? " after a post" : ""));
  Blas blas;
  blas.separate(s, with_post, nullptr);
  const Site::Out before = s.read();
  s.reset();
  if (!mhc_site_prefill(s.fused(with_post), nullptr)) GTEST_SKIP() << "the kernels were not built for sm90+";
  const Site::Out got = s.read();
  ASSERT_EQ(std::memcmp(got.streams.data(), before.streams.data(), got.streams.size() * 4), 0)
      << "the streams are not mhc_post's";
  const Site::Out ref = s.cpu(before.streams);
  expect_close(got.post, ref.post, 1e-5, "post vs cpu");
  expect_close(got.comb, ref.comb, 1e-5, "comb vs cpu");
  expect_close(got.x, ref.x, 1e-4, "x vs cpu");
  std::printf("[ mhc ] rows %u D %u%s: max |d|/(1+|ref|) against the CPU x %.2e post %.2e comb %.2e; the SGEMM path "
              "x %.2e post %.2e comb %.2e\n",
              rows, D, with_post ? " post" : "", max_rel(got.x, ref.x), max_rel(got.post, ref.post),
              max_rel(got.comb, ref.comb), max_rel(before.x, ref.x), max_rel(before.post, ref.post),
              max_rel(before.comb, ref.comb));
  s.reset();
  ASSERT_TRUE(mhc_site_prefill(s.fused(with_post), nullptr));
  const Site::Out again = s.read();
  EXPECT_EQ(std::memcmp(again.x.data(), got.x.data(), got.x.size() * 4), 0) << "not deterministic";
  EXPECT_EQ(std::memcmp(again.comb.data(), got.comb.data(), got.comb.size() * 4), 0) << "not deterministic";
}

TEST(MhcPrefill, SiteMatchesMhcPostAndTheCpu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(15);
  check_site(2048, 4096, true, rng);  // a chunk's site: full tiles
  check_site(37, 4096, true, rng);    // the last tile 5 rows
  check_site(300, 4096, false, rng);  // the first site of a chunk: no post
}

TEST(MhcPrefill, WidthsThatDoNotFillTheCluster) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(23);
  check_site(20, 1040, true, rng);  // 65 units of 16 columns: the last ranks hold none
  check_site(17, 64, false, rng);   // 4 units: one warp of 4 blocks busy
}

TEST(MhcPrefill, OtherShapesAreLeftToTheSeparateSteps) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(5);
  Site s(3, 64, rng);
  MhcPostPre p = s.fused(true);
  p.pre.H = 2;
  EXPECT_FALSE(mhc_site_prefill(p, nullptr));
  p = s.fused(true);
  p.pre.D = 72;  // not a multiple of 16
  EXPECT_FALSE(mhc_site_prefill(p, nullptr));
  DevMatrix half = s.fn_m;
  half.type = model::GgmlType::F16;
  half.row_bytes = size_t{half.cols} * 2;
  p = s.fused(true);
  p.fn = &half;
  EXPECT_FALSE(mhc_site_prefill(p, nullptr));
  const MoeCombineIn combine{s.d_y.as<float>(), s.d_post.as<float>(), nullptr, 1};
  p = s.fused(true);
  p.combine = &combine;
  EXPECT_FALSE(mhc_site_prefill(p, nullptr));
}

// Microseconds of `body` on a stream: the median of 15 event-timed calls after a warm-up.
double median_us(const std::function<void(cudaStream_t)>& body) {
  Stream st;
  body(st.get());
  Event e0, e1;
  std::vector<float> t;
  for (int i = 0; i < 15; ++i) {
    e0.record(st.get());
    body(st.get());
    e1.record(st.get());
    st.synchronize();
    t.push_back(e1.since(e0) * 1000.0f);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// A chunk's site (2,048 rows after a post) and smaller ones: the separate steps, each step, and the
// one launch; GB/s counts the bytes each must move (the streams read and written, y read, x written).
TEST(MhcPrefill, TimingLine) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(1);
  const double bw = ferry::testing::copy_gbs();
  for (uint32_t rows : {2048u, 256u}) {
    Site s(rows, 4096, rng);
    Blas blas;
    if (!mhc_site_prefill(s.fused(true), nullptr)) GTEST_SKIP() << "no sm90 kernel";
    const double bytes = double(rows) * 4096 * 4 * (2 * kH + 2);
    const auto line = [&](const char* what, double us) {
      std::printf("[ timing ] mhc site rows %u D 4096: %-34s %8.1f us  %6.0f GB/s (%.0f%% of copy %.0f)\n", rows, what,
                  us, bytes / us / 1e3, 100.0 * bytes / us / 1e3 / bw, bw);
    };
    line("separate: post+sgemm+pre", median_us([&](cudaStream_t st) { blas.separate(s, true, st); }));
    line("  mhc_post", median_us([&](cudaStream_t st) { blas.post(s, st); }));
    line("  sgemm 24 x 16384", median_us([&](cudaStream_t st) { blas.product(s, st); }));
    line("  mhc_pre one block", median_us([&](cudaStream_t st) { mhc_pre_one_block(s.args(), st); }));
    if (rows <= 256) {
      line("decode cluster (mhc_post_pre)", median_us([&](cudaStream_t st) { mhc_post_pre(s.fused(true), st); }));
    }
    line("one launch", median_us([&](cudaStream_t st) { mhc_site_prefill(s.fused(true), st); }));
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
}

}  // namespace
}  // namespace ferry::gpu
#endif
