// The chunked KDA recurrence of long prefill segments on the device (gpu/kda_chunked.hpp) against the
// CPU's chunked form in double (model/cpu/kda.hpp, kda_chunked) and against the device's recurrent
// kernel (gpu/kda.cu), on random inputs whose decays span the gate's range: per head, f is offset by
// -8 .. +8, so some heads decay by ~e^-5 a token (e^-320 over a chunk, the range the split must
// survive) and others barely. At the 12-layer model's widths (64 heads of 128) over one 2,048-row
// segment, and a step of several slots at 4 heads: a decode row, two long segments ending in partial
// chunks, and a segment too short for the chunked form, whose rows (and the decode row) must keep the
// recurrent kernel's bits. Prints the max |delta| and one layer's chunk timed both ways (not asserted).
//
// Tolerance: the products take fp16 hi/lo operands (~22 bits) and f32 sums; N, M and the forward
// substitution are f32. Over 2,048 tokens the recurrent kernel's own f32 rounding is ~1e-5 of the
// CPU's double (|o| and |S| ~ 0.1-3); 2e-4 fails a misplaced row, column, chunk or decay (errors
// ~1e-2 and up) and stays far inside the fixtures' eval-ref tolerance (5e-3).
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/kda_chunked.hpp"
#include "gpu/kernels.hpp"
#include "gpu/pdl.hpp"
#include "model/cpu/kda.hpp"
#include "tests/gpu/gpu_test_support.hpp"

namespace ferry::gpu {
namespace {

constexpr float kLowerBound = -5.0f;
constexpr uint32_t kDk = 128;
constexpr double kTol = 2e-4;

using Segment = std::array<int32_t, 4>;  // slot, start, len, first_row

struct Inputs {
  uint32_t heads = 0, rows = 0, slots = 0;
  std::vector<float> qkv, f, beta, dt_bias, a, state;  // state [slots][heads][dk][dk]
  size_t C() const { return size_t{heads} * kDk; }
};

Inputs make_inputs(uint32_t heads, uint32_t rows, uint32_t slots, std::mt19937& rng) {
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::uniform_real_distribution<float> rate(0.5f, 2.0f);
  Inputs in;
  in.heads = heads, in.rows = rows, in.slots = slots;
  const size_t C = in.C();
  in.qkv.resize(size_t{rows} * 3 * C);
  for (float& x : in.qkv) x = n01(rng);
  for (uint32_t r = 0; r < rows; ++r) {
    for (uint32_t hk = 0; hk < 2 * heads; ++hk) {
      float* x = in.qkv.data() + size_t{r} * 3 * C + size_t{hk} * kDk;
      double ss = 0;
      for (uint32_t i = 0; i < kDk; ++i) ss += double(x[i]) * x[i];
      const float s = static_cast<float>(1.0 / std::sqrt(ss + 1e-6)) * (hk < heads ? 1.0f / std::sqrt(float(kDk)) : 1.0f);
      for (uint32_t i = 0; i < kDk; ++i) x[i] *= s;
    }
  }
  constexpr float kOffsets[] = {8.0f, -8.0f, 2.0f, 0.0f, -2.0f};
  in.f.resize(size_t{rows} * C);
  for (size_t i = 0; i < in.f.size(); ++i) in.f[i] = n01(rng) + kOffsets[(i % C) / kDk % 5];
  in.beta.resize(size_t{rows} * heads);
  for (float& x : in.beta) x = n01(rng);
  in.dt_bias.resize(C);
  for (float& x : in.dt_bias) x = 0.3f * n01(rng);
  in.a.resize(heads);
  for (float& x : in.a) x = -rate(rng);
  in.state.resize(size_t{slots} * heads * kDk * kDk);
  for (float& x : in.state) x = 0.1f * n01(rng);
  return in;
}

// The CPU's chunked form (double) of every segment, heads on threads: outputs [rows][C], states.
void cpu_chunked(const Inputs& in, const std::vector<Segment>& segs, std::vector<float>& state, std::vector<float>& out) {
  const size_t C = in.C();
  out.assign(size_t{in.rows} * C, 0.0f);
  auto head = [&](uint32_t h) {
    for (const Segment& sg : segs) {
      const size_t len = static_cast<size_t>(sg[2]), r0 = static_cast<size_t>(sg[3]);
      std::vector<float> q(len * kDk), k(q.size()), v(q.size()), g(q.size()), beta(len), o(q.size());
      for (size_t t = 0; t < len; ++t) {
        const size_t row = r0 + t;
        for (uint32_t i = 0; i < kDk; ++i) {
          q[t * kDk + i] = in.qkv[row * 3 * C + h * kDk + i];
          k[t * kDk + i] = in.qkv[row * 3 * C + C + h * kDk + i];
          v[t * kDk + i] = in.qkv[row * 3 * C + 2 * C + h * kDk + i];
          const float gpre = in.f[row * C + h * kDk + i] + in.dt_bias[h * kDk + i];
          g[t * kDk + i] = kLowerBound / (1.0f + std::exp(in.a[h] * gpre));  // rate = -a
        }
        beta[t] = 1.0f / (1.0f + std::exp(-in.beta[row * in.heads + h]));
      }
      float* s = state.data() + (static_cast<size_t>(sg[0]) * in.heads + h) * kDk * kDk;
      model::kda_chunked(len, kDk, kDk, q.data(), k.data(), v.data(), g.data(), beta.data(), s, o.data(), 64);
      for (size_t t = 0; t < len; ++t) std::memcpy(&out[(r0 + t) * C + h * kDk], &o[t * kDk], kDk * sizeof(float));
    }
  };
  const uint32_t workers = std::max(1u, std::min(in.heads, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (uint32_t w = 0; w < workers; ++w) {
    pool.emplace_back([&, w] {
      for (uint32_t h = w; h < in.heads; h += workers) head(h);
    });
  }
  for (std::thread& t : pool) t.join();
}

template <class T>
void upload(DeviceBuffer& b, const std::vector<T>& v) {
  ASSERT_EQ(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
}

template <class T>
std::vector<T> download(const DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), b.get(), n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// A step on the device. The chunked form overwrites qkv, so every run starts from the host's inputs.
struct DeviceStep {
  const Inputs& in;
  DeviceBuffer qkv, qkv_raw, f, beta, dt_bias, a, state, out, seg;
  uint32_t max_seg_rows = 0, segments = 0;
  DeviceStep(const Inputs& i, const std::vector<Segment>& segs)
      : in(i), qkv(i.qkv.size() * sizeof(float)), qkv_raw(i.qkv.size() * sizeof(float)), f(i.f.size() * sizeof(float)),
        beta(i.beta.size() * sizeof(float)), dt_bias(i.dt_bias.size() * sizeof(float)), a(i.a.size() * sizeof(float)),
        state(i.state.size() * sizeof(float)), out(size_t{i.rows} * i.C() * sizeof(float)),
        seg(4 * segs.size() * sizeof(int32_t)) {
    upload(f, in.f);
    upload(beta, in.beta);
    upload(dt_bias, in.dt_bias);
    upload(a, in.a);
    std::vector<int32_t> cols(4 * segs.size());
    for (size_t s = 0; s < segs.size(); ++s) {
      for (int c = 0; c < 4; ++c) cols[c * segs.size() + s] = segs[s][c];
      max_seg_rows = std::max(max_seg_rows, static_cast<uint32_t>(segs[s][2]));
    }
    upload(seg, cols);
    segments = static_cast<uint32_t>(segs.size());
  }
  KdaArgs args() const {
    KdaArgs k;
    const int32_t* sg = seg.as<int32_t>();
    k.seg = {sg, sg + segments, sg + 2 * segments, sg + 3 * segments};
    k.rows = in.rows;
    k.segments = segments;
    k.heads = in.heads;
    k.head_dim = kDk;
    k.qkv = qkv.as<float>();
    k.qkv_raw = qkv_raw.as<float>();
    k.f = f.as<float>();
    k.dt_bias = dt_bias.as<float>();
    k.a = a.as<float>();
    k.lower_bound = kLowerBound;
    k.beta = beta.as<float>();
    k.state = state.as<float>();
    k.out = out.as<float>();
    return k;
  }
  // Inputs and states from the host, outputs poisoned (NaN).
  void reset() {
    upload(qkv, in.qkv);
    upload(state, in.state);
    ASSERT_EQ(cudaMemset(out.get(), 0xff, out.bytes()), cudaSuccess);
  }
  // The layer runner's dispatch (chunked where it applies, the recurrent kernel for the rest), or
  // the recurrent kernel alone; returns whether the chunked form ran.
  bool run(bool chunked) {
    KdaArgs k = args();
    k.skip_chunked = chunked && kda_chunked(k, max_seg_rows, nullptr);
    kda_recurrent(k, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return k.skip_chunked;
  }
  std::vector<float> outputs() const { return download<float>(out, size_t{in.rows} * in.C()); }
  std::vector<float> states() const { return download<float>(state, in.state.size()); }
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

bool chunked_kernels_ready() {
  return testing::have_device() && sm80_code_ready();
}

TEST(KdaChunkedTest, GivesTheCpuChunkedFormAndTheRecurrentKernelOverA2048RowChunk) {
  if (!chunked_kernels_ready()) GTEST_SKIP() << "no CUDA device with sm80+ code";
  constexpr uint32_t kRows = 2048;
  std::mt19937 rng(23);
  const Inputs in = make_inputs(64, kRows, 2, rng);
  const std::vector<Segment> segs = {{1, 0, int32_t{kRows}, 0}};
  std::vector<float> ref_state = in.state, ref_out;
  cpu_chunked(in, segs, ref_state, ref_out);

  DeviceStep d(in, segs);
  d.reset();
  ASSERT_TRUE(d.run(true));
  const std::vector<float> out = d.outputs(), state = d.states();
  d.reset();
  ASSERT_FALSE(d.run(false));
  const std::vector<float> rec_out = d.outputs(), rec_state = d.states();

  const double dout = max_delta(ref_out, out), dstate = max_delta(ref_state, state);
  const double rout = max_delta(ref_out, rec_out), rstate = max_delta(ref_state, rec_state);
  const double xout = max_delta(rec_out, out), xstate = max_delta(rec_state, state);
  std::printf("  2048 rows x 64 heads: max|delta| vs the CPU's double: chunked out %.3g state %.3g, recurrent out "
              "%.3g state %.3g; chunked vs recurrent out %.3g state %.3g\n",
              dout, dstate, rout, rstate, xout, xstate);
  EXPECT_LE(dout, kTol);
  EXPECT_LE(dstate, kTol);
  EXPECT_LE(xout, kTol);
  EXPECT_LE(xstate, kTol);
  // The other slot's state is untouched.
  const size_t per_slot = size_t{64} * kDk * kDk;
  EXPECT_EQ(0, std::memcmp(state.data(), in.state.data(), per_slot * sizeof(float)));
}

TEST(KdaChunkedTest, TakesTheLongSegmentsOfAMixedStepAndLeavesTheOthersTheRecurrentBits) {
  if (!chunked_kernels_ready()) GTEST_SKIP() << "no CUDA device with sm80+ code";
  // A decode row (slot 0), 200 rows (slot 1: three chunks and 8 rows), 100 rows (slot 2: below the
  // threshold), 130 rows (slot 3: two chunks and 2 rows).
  const std::vector<Segment> segs = {{0, 7, 1, 0}, {1, 0, 200, 1}, {2, 0, 100, 201}, {3, 0, 130, 301}};
  static_assert(kKdaChunkedMinRows > 100 && kKdaChunkedMinRows <= 130, "segment 2 recurrent, 1 and 3 chunked");
  std::mt19937 rng(29);
  const Inputs in = make_inputs(4, 431, 4, rng);
  std::vector<float> ref_state = in.state, ref_out;
  cpu_chunked(in, segs, ref_state, ref_out);

  DeviceStep d(in, segs);
  d.reset();
  ASSERT_TRUE(d.run(true));
  const std::vector<float> out = d.outputs(), state = d.states();
  d.reset();
  d.run(false);
  const std::vector<float> rec_out = d.outputs(), rec_state = d.states();
  const double dout = max_delta(ref_out, out), dstate = max_delta(ref_state, state);
  std::printf("  mixed step, 4 heads: max|delta| vs the CPU's double: out %.3g state %.3g\n", dout, dstate);
  EXPECT_LE(dout, kTol);
  EXPECT_LE(dstate, kTol);
  const size_t C = in.C(), per_slot = size_t{4} * kDk * kDk;
  EXPECT_EQ(0, std::memcmp(out.data(), rec_out.data(), C * sizeof(float))) << "the decode row";
  EXPECT_EQ(0, std::memcmp(out.data() + 201 * C, rec_out.data() + 201 * C, 100 * C * sizeof(float)))
      << "the short segment's rows";
  EXPECT_EQ(0, std::memcmp(state.data(), rec_state.data(), per_slot * sizeof(float))) << "slot 0";
  EXPECT_EQ(0, std::memcmp(state.data() + 2 * per_slot, rec_state.data() + 2 * per_slot, per_slot * sizeof(float)))
      << "slot 2";
}

// One KDA layer's recurrence over a prefill chunk at the model's widths, the recurrent kernel and
// the chunked form (both of its launches), at 128, 512 and 2,048 rows: the mean of 5 launches after
// a warm-up, each from fresh inputs (printed, not asserted).
TEST(KdaChunkedTiming, PrintsAPrefillChunkBothWays) {
  if (!chunked_kernels_ready()) GTEST_SKIP() << "no CUDA device with sm80+ code";
  std::mt19937 rng(5);
  const Inputs in = make_inputs(64, 2048, 2, rng);
  for (const uint32_t rows : {128u, 512u, 2048u}) {
    const std::vector<Segment> segs = {{1, 0, static_cast<int32_t>(rows), 0}};
    DeviceStep d(in, segs);
    float ms[2] = {};
    for (const bool chunked : {false, true}) {
      constexpr int kReps = 5;
      for (int rep = 0; rep <= kReps; ++rep) {
        d.reset();
        KdaArgs k = d.args();
        Event start, stop;
        start.record(nullptr);
        k.skip_chunked = chunked && kda_chunked(k, rows, nullptr);
        if (!k.skip_chunked) kda_recurrent(k, nullptr);
        stop.record(nullptr);
        ASSERT_EQ(cudaEventSynchronize(stop.get()), cudaSuccess);
        if (rep > 0) ms[chunked] += stop.since(start) / kReps;
      }
      const std::vector<float> out = d.outputs();
      EXPECT_TRUE(std::all_of(out.begin(), out.begin() + size_t{rows} * in.C(), [](float x) { return std::isfinite(x); }));
    }
    std::printf("  KDA recurrence, %u rows x 64 heads x 128: recurrent %.3f ms, chunked %.3f ms a launch\n", rows, ms[0],
                ms[1]);
  }
}

}  // namespace
}  // namespace ferry::gpu
#endif
