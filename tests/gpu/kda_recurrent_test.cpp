// The KDA recurrence on the device (gpu/kda.cu, kda_recurrent) against the CPU's recurrence
// (model/cpu/kda.hpp) on random inputs at the 12-layer model's widths (64 heads of 128) and at head
// dims 16 and 64: one step of two segments (a 19-row prefill of slot 1 and a decode row of slot 0,
// each from a random state), every output row and the final states; and the 19 rows run as 19
// one-row steps, which must give the prefill's outputs and state to the bit (decode and prefill run
// the same arithmetic). Outputs are poisoned (NaN) before each run. Prints a prefill chunk's launch
// at 2,048 rows (not asserted).
//
// Tolerance: the device adds each column's dot products in P partial sums (P = 4 at head dim 128),
// the CPU in one: f32 rounding of sums of 128 terms, compounded over 19 tokens, is ~1e-6 of the
// values (|o| ~ 0.1-1); 1e-4 fails any misplaced row, column or lane group (errors ~0.1).
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "model/cpu/kda.hpp"
#include "tests/gpu/gpu_test_support.hpp"

namespace ferry::gpu {
namespace {

constexpr float kLowerBound = -5.0f;
constexpr double kTol = 1e-4;

template <class T>
DeviceBuffer upload(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  EXPECT_EQ(cudaMemcpy(b.get(), v.data(), b.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  return b;
}

template <class T>
std::vector<T> download(const DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), b.get(), n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// A step's inputs for `rows` rows of `heads` heads of `dk`, and two slots' states.
struct Inputs {
  uint32_t heads = 0, dk = 0, rows = 0;
  std::vector<float> qkv, f, beta, dt_bias, a, state;  // state [2][heads][dk][dk]
  uint32_t C() const { return heads * dk; }
};

Inputs make_inputs(uint32_t heads, uint32_t dk, uint32_t rows, std::mt19937& rng) {
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::uniform_real_distribution<float> rate(0.5f, 2.0f);
  Inputs in;
  in.heads = heads, in.dk = dk, in.rows = rows;
  const uint32_t C = in.C();
  in.qkv.resize(size_t{rows} * 3 * C);
  for (float& x : in.qkv) x = n01(rng);
  // q and k as the conv leaves them: L2-normalised per head, q scaled by dk^-0.5.
  for (uint32_t r = 0; r < rows; ++r) {
    for (uint32_t hk = 0; hk < 2 * heads; ++hk) {
      float* x = in.qkv.data() + size_t{r} * 3 * C + size_t{hk} * dk;
      double ss = 0;
      for (uint32_t i = 0; i < dk; ++i) ss += double(x[i]) * x[i];
      const float s = static_cast<float>(1.0 / std::sqrt(ss + 1e-6)) * (hk < heads ? 1.0f / std::sqrt(float(dk)) : 1.0f);
      for (uint32_t i = 0; i < dk; ++i) x[i] *= s;
    }
  }
  in.f.resize(size_t{rows} * C);
  for (float& x : in.f) x = n01(rng);
  in.beta.resize(size_t{rows} * heads);
  for (float& x : in.beta) x = n01(rng);
  in.dt_bias.resize(C);
  for (float& x : in.dt_bias) x = 0.3f * n01(rng);
  in.a.resize(heads);
  for (float& x : in.a) x = -rate(rng);
  in.state.resize(size_t{2} * heads * dk * dk);
  for (float& x : in.state) x = 0.1f * n01(rng);
  return in;
}

// The CPU recurrence of rows [r0, r0 + len) from slot `slot`'s state: outputs into out [rows][C],
// the state updated in place.
void cpu_segment(const Inputs& in, uint32_t slot, uint32_t r0, uint32_t len, std::vector<float>& state,
                 std::vector<float>& out) {
  const uint32_t C = in.C(), dk = in.dk;
  for (uint32_t h = 0; h < in.heads; ++h) {
    std::vector<float> q(size_t{len} * dk), k(q.size()), v(q.size()), g(q.size()), beta(len), o(q.size());
    for (uint32_t t = 0; t < len; ++t) {
      const size_t row = r0 + t;
      for (uint32_t i = 0; i < dk; ++i) {
        q[t * dk + i] = in.qkv[row * 3 * C + h * dk + i];
        k[t * dk + i] = in.qkv[row * 3 * C + C + h * dk + i];
        v[t * dk + i] = in.qkv[row * 3 * C + 2 * C + h * dk + i];
        const float gpre = in.f[row * C + h * dk + i] + in.dt_bias[h * dk + i];
        g[t * dk + i] = kLowerBound / (1.0f + std::exp(in.a[h] * gpre));  // rate = -a
      }
      beta[t] = 1.0f / (1.0f + std::exp(-in.beta[row * in.heads + h]));
    }
    float* s = state.data() + (size_t{slot} * in.heads + h) * dk * dk;
    model::kda_recurrent(len, dk, dk, q.data(), k.data(), v.data(), g.data(), beta.data(), s, o.data());
    for (uint32_t t = 0; t < len; ++t) std::memcpy(&out[(r0 + t) * size_t{C} + h * dk], &o[t * dk], dk * sizeof(float));
  }
}

struct DeviceStep {
  DeviceBuffer qkv, f, beta, dt_bias, a, state, out, seg;
  explicit DeviceStep(const Inputs& in)
      : qkv(upload(in.qkv)), f(upload(in.f)), beta(upload(in.beta)), dt_bias(upload(in.dt_bias)), a(upload(in.a)),
        state(upload(in.state)), out(size_t{in.rows} * in.C() * sizeof(float)), seg(4 * 2 * sizeof(int32_t)) {}
  // Segments (slot, start, len, first_row) as one launch; outputs poisoned first.
  void run(const Inputs& in, const std::vector<std::array<int32_t, 4>>& segs) {
    std::vector<int32_t> cols(4 * segs.size());
    for (size_t i = 0; i < segs.size(); ++i) {
      for (int c = 0; c < 4; ++c) cols[c * segs.size() + i] = segs[i][c];
    }
    ASSERT_LE(cols.size() * sizeof(int32_t), seg.bytes());
    ASSERT_EQ(cudaMemcpy(seg.get(), cols.data(), cols.size() * sizeof(int32_t), cudaMemcpyHostToDevice), cudaSuccess);
    KdaArgs k;
    const int32_t* sg = seg.as<int32_t>();
    const size_t n = segs.size();
    k.seg = {sg, sg + n, sg + 2 * n, sg + 3 * n};
    k.segments = static_cast<uint32_t>(n);
    k.heads = in.heads;
    k.head_dim = in.dk;
    k.qkv = qkv.as<float>();
    k.f = f.as<float>();
    k.dt_bias = dt_bias.as<float>();
    k.a = a.as<float>();
    k.lower_bound = kLowerBound;
    k.beta = beta.as<float>();
    k.state = state.as<float>();
    k.out = out.as<float>();
    kda_recurrent(k, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  void poison_out() { ASSERT_EQ(cudaMemset(out.get(), 0xff, out.bytes()), cudaSuccess); }
};

double max_delta(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!std::isfinite(b[i])) return INFINITY;
    m = std::max(m, std::abs(double(a[i]) - b[i]));
  }
  return m;
}

class KdaRecurrentTest : public ::testing::TestWithParam<std::pair<uint32_t, uint32_t>> {};

TEST_P(KdaRecurrentTest, GivesTheCpuRecurrenceAndDecodeGivesThePrefillToTheBit) {
  if (!testing::have_device()) GTEST_SKIP() << "no CUDA device";
  const auto [heads, dk] = GetParam();
  constexpr uint32_t kPrefill = 19;
  std::mt19937 rng(17 + dk);
  const Inputs in = make_inputs(heads, dk, kPrefill + 1, rng);
  const size_t C = in.C();

  // CPU: slot 1 prefills rows [0, 19), slot 0 decodes row 19.
  std::vector<float> ref_state = in.state, ref_out(size_t{in.rows} * C, 0.0f);
  cpu_segment(in, 1, 0, kPrefill, ref_state, ref_out);
  cpu_segment(in, 0, kPrefill, 1, ref_state, ref_out);

  DeviceStep d(in);
  d.poison_out();
  d.run(in, {{1, 0, int32_t{kPrefill}, 0}, {0, 0, 1, int32_t{kPrefill}}});
  const std::vector<float> out = download<float>(d.out, in.rows * C);
  const std::vector<float> state = download<float>(d.state, in.state.size());
  const double dout = max_delta(ref_out, out), dstate = max_delta(ref_state, state);
  EXPECT_LE(dout, kTol) << heads << " heads of " << dk;
  EXPECT_LE(dstate, kTol) << heads << " heads of " << dk;

  // The prefill rows again, one row a launch from the same start state.
  DeviceStep one(in);
  one.poison_out();
  for (uint32_t t = 0; t < kPrefill; ++t) one.run(in, {{1, static_cast<int32_t>(t), 1, static_cast<int32_t>(t)}});
  const std::vector<float> out1 = download<float>(one.out, size_t{kPrefill} * C);
  const std::vector<float> state1 = download<float>(one.state, in.state.size());
  EXPECT_EQ(0, std::memcmp(out1.data(), out.data(), out1.size() * sizeof(float))) << "decode rows differ from prefill";
  const size_t per_slot = size_t{heads} * dk * dk;
  EXPECT_EQ(0, std::memcmp(state1.data() + per_slot, state.data() + per_slot, per_slot * sizeof(float)))
      << "slot 1's state after 19 decode rows differs from the prefill's";
}

// One KDA layer's recurrence over a 2,048-row prefill chunk at the model's widths (64 heads of 128),
// one segment: the time a launch (printed, not asserted), and every output finite.
TEST(KdaRecurrentTiming, PrintsAPrefillChunk) {
  if (!testing::have_device()) GTEST_SKIP() << "no CUDA device";
  constexpr uint32_t kRows = 2048;
  std::mt19937 rng(5);
  const Inputs in = make_inputs(64, 128, kRows, rng);
  DeviceStep d(in);
  const std::vector<std::array<int32_t, 4>> chunk = {{1, 0, int32_t{kRows}, 0}};
  d.run(in, chunk);  // warm-up
  Event start, stop;
  start.record(nullptr);
  constexpr int kReps = 3;
  for (int i = 0; i < kReps; ++i) d.run(in, chunk);
  stop.record(nullptr);
  ASSERT_EQ(cudaEventSynchronize(stop.get()), cudaSuccess);
  std::printf("  KDA recurrence, 2048 rows x 64 heads x 128: %.3f ms a launch\n", stop.since(start) / kReps);
  const std::vector<float> out = download<float>(d.out, size_t{kRows} * in.C());
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float x) { return std::isfinite(x); }));
}

INSTANTIATE_TEST_SUITE_P(HeadDims, KdaRecurrentTest,
                         ::testing::Values(std::pair<uint32_t, uint32_t>{64, 128}, std::pair<uint32_t, uint32_t>{4, 64},
                                           std::pair<uint32_t, uint32_t>{4, 16}),
                         [](const auto& info) {
                           return std::to_string(info.param.first) + "x" + std::to_string(info.param.second);
                         });

}  // namespace
}  // namespace ferry::gpu
#endif
