// KDA's recurrence and gated RMSNorm in one launch for decode rows (kda_recurrent_gated_norm,
// gpu/kda_fusion.hpp) against the two launches it replaces (kda_recurrent, gated_rms_norm): the same
// bits in the recurrence's output, the normed output and the slots' new states, over three segments
// of one to four rows (eight rows: more than a cluster's warps at head dim 32) and one lone row, at
// head dims 128 (a cluster of 4 blocks a head), 64 (2) and 32 (1). Outputs are poisoned (NaN) first.
// Head dims below a warp take the two launches (the call returns false), checked too. With the
// convolution in the same launch (kda_conv_recurrent_gated_norm) against kda_conv's decode launch then the
// two: also the convolved q/k/v and the conv states, over segments whose taps reach into the state.
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/kda_fusion.hpp"
#include "gpu/kernels.hpp"
#include "tests/gpu/gpu_test_support.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::have_device;

template <class V>
DeviceBuffer up(const std::vector<V>& v) {
  DeviceBuffer b(v.size() * sizeof(V));
  EXPECT_EQ(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(V), cudaMemcpyHostToDevice), cudaSuccess);
  return b;
}
std::vector<float> down(const DeviceBuffer& b) {
  std::vector<float> v(b.bytes() / 4);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(v.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}
void expect_bits(const std::vector<float>& plain, const std::vector<float>& fused, const std::string& what) {
  ASSERT_EQ(plain.size(), fused.size()) << what;
  for (size_t i = 0; i < plain.size(); ++i) {
    uint32_t a = 0, b = 0;
    std::memcpy(&a, &plain[i], 4);
    std::memcpy(&b, &fused[i], 4);
    if (a != b) {
      ADD_FAILURE() << what << ": first difference at " << i << " of " << plain.size() << ": " << plain[i]
                    << " unfused, " << fused[i] << " fused";
      return;
    }
  }
}

struct Seg {
  int32_t slot, start, len;
};

struct Result {
  std::vector<float> o, z, state, qkv, conv_state;
  bool fused_launch = false;
};

constexpr uint32_t kTaps = 4;  // GLM's conv kernel

// conv: the rows' q/k/v are raw products, convolved first (by kda_conv, or in the fused launch).
Result run(const std::vector<Seg>& segs, uint32_t heads, uint32_t dk, bool fused, bool conv = false) {
  constexpr uint32_t kSlots = 3;
  std::vector<int32_t> row_slot, row_pos, row_first, seg_slot, seg_start, seg_len, seg_first;
  for (const Seg& s : segs) {
    seg_slot.push_back(s.slot), seg_start.push_back(s.start), seg_len.push_back(s.len);
    seg_first.push_back(static_cast<int32_t>(row_slot.size()));
    for (int32_t i = 0; i < s.len; ++i) {
      row_slot.push_back(s.slot), row_pos.push_back(s.start + i), row_first.push_back(seg_first.back());
    }
  }
  const uint32_t rows = static_cast<uint32_t>(row_slot.size()), C = heads * dk;
  std::mt19937 rng(dk * 7 + rows);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.5f, 2.0f);
  auto randn = [&](size_t count, float scale) {
    std::vector<float> v(count);
    for (float& x : v) x = n(rng) * scale;
    return v;
  };
  // q and k of about unit norm a head (as after their L2 norms), v, the gates and the states random.
  const float unit = 1.0f / std::sqrt(static_cast<float>(dk));
  std::vector<float> qkv = randn(size_t{rows} * 3 * C, unit);
  for (size_t i = 0; i < qkv.size(); ++i) {
    if (i % (3 * C) >= 2 * C) qkv[i] *= std::sqrt(static_cast<float>(dk));
  }
  const std::vector<float> f = randn(size_t{rows} * C, 1.0f), beta = randn(size_t{rows} * heads, 1.0f),
                           dt = randn(C, 0.5f), state = randn(size_t{kSlots} * heads * dk * dk, 0.1f),
                           gate = randn(size_t{rows} * C, 1.0f), w = randn(dk, 1.0f);
  std::vector<float> ssm_a(heads);
  for (float& x : ssm_a) x = -u(rng);
  const DeviceBuffer d_rs = up(row_slot), d_rp = up(row_pos), d_rf = up(row_first), d_ss = up(seg_slot),
                     d_st = up(seg_start), d_sl = up(seg_len), d_sf = up(seg_first), d_qkv = up(qkv), d_f = up(f),
                     d_beta = up(beta), d_dt = up(dt), d_a = up(ssm_a), d_gate = up(gate), d_w = up(w);
  const std::vector<float> conv_w = randn(size_t{3} * C * kTaps, 0.5f),
                           conv_state = randn(size_t{kSlots} * 3 * C * (kTaps - 1), 1.0f);
  const DeviceBuffer d_conv_w = up(conv_w);
  DeviceBuffer d_conv_state = up(conv_state), d_raw = up(qkv);
  DeviceBuffer d_state = up(state), d_o(size_t{rows} * C * 4), d_z(size_t{rows} * C * 4);
  if (conv) {
    EXPECT_EQ(cudaMemset(d_qkv.get(), 0xff, d_qkv.bytes()), cudaSuccess);
  }
  EXPECT_EQ(cudaMemset(d_o.get(), 0xff, d_o.bytes()), cudaSuccess);
  EXPECT_EQ(cudaMemset(d_z.get(), 0xff, d_z.bytes()), cudaSuccess);
  KdaArgs a;
  a.row = {d_rs.as<int32_t>(), d_rp.as<int32_t>(), d_rf.as<int32_t>()};
  a.seg = {d_ss.as<int32_t>(), d_st.as<int32_t>(), d_sl.as<int32_t>(), d_sf.as<int32_t>()};
  a.rows = rows;
  a.segments = static_cast<uint32_t>(segs.size());
  a.heads = heads;
  a.head_dim = dk;
  a.qkv = d_qkv.as<float>();
  a.f = d_f.as<float>();
  a.dt_bias = d_dt.as<float>();
  a.a = d_a.as<float>();
  a.beta = d_beta.as<float>();
  a.state = d_state.as<float>();
  a.out = d_o.as<float>();
  a.kernel = kTaps;
  a.qkv_raw = d_raw.as<float>();
  a.conv_w = d_conv_w.as<float>();
  a.conv_state = d_conv_state.as<float>();
  const GatedNorm g{d_gate.as<float>(), d_w.as<float>(), 1e-5f, d_z.as<float>()};
  Result r;
  if (fused && conv) {
    r.fused_launch = kda_conv_fuses(a) && kda_conv_recurrent_gated_norm(a, g, nullptr);
  } else if (fused) {
    r.fused_launch = kda_recurrent_gated_norm(a, g, nullptr);
  }
  if (!r.fused_launch) {
    if (conv) kda_conv(a, nullptr);
    kda_recurrent(a, nullptr);
    gated_rms_norm(a.out, g.gate, g.w, rows, heads, dk, g.eps, g.out, nullptr);
  }
  r.o = down(d_o), r.z = down(d_z), r.state = down(d_state), r.qkv = down(d_qkv), r.conv_state = down(d_conv_state);
  return r;
}

TEST(KdaNormFusion, OneLaunchGivesTheRecurrenceAndNormBits) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const std::vector<std::vector<Seg>> steps = {{{2, 5, 1}, {0, 1, 3}, {1, 7, 4}}, {{1, 9, 1}}};
  bool any_fused = false;
  for (const uint32_t dk : {128u, 64u, 32u}) {
    for (const std::vector<Seg>& segs : steps) {
      const std::string what = "head dim " + std::to_string(dk) + ", " + std::to_string(segs.size()) + " segments";
      const Result plain = run(segs, 3, dk, false), fused = run(segs, 3, dk, true);
      any_fused = any_fused || fused.fused_launch;
      expect_bits(plain.o, fused.o, what + ": recurrence output");
      expect_bits(plain.z, fused.z, what + ": gated norm");
      expect_bits(plain.state, fused.state, what + ": states");
      for (float v : fused.z) ASSERT_EQ(v, v) << what << ": a normed value left unwritten (NaN)";
    }
  }
  if (!any_fused) GTEST_SKIP() << "the kernels were not built for sm90+ or the device has no clusters";
}

TEST(KdaNormFusion, ConvolutionInTheLaunchGivesTheThreeLaunchesBits) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  // Rows near a slot's start (taps in the state), segments longer than the taps, a lone row.
  const std::vector<std::vector<Seg>> steps = {{{2, 1, 1}, {0, 0, 4}, {1, 7, 3}}, {{1, 9, 1}}, {{0, 2, 8}}};
  bool any_fused = false;
  for (const uint32_t dk : {128u, 64u, 32u}) {
    for (const std::vector<Seg>& segs : steps) {
      const std::string what = "head dim " + std::to_string(dk) + ", " + std::to_string(segs.size()) + " segments";
      const Result plain = run(segs, 3, dk, false, true), fused = run(segs, 3, dk, true, true);
      any_fused = any_fused || fused.fused_launch;
      expect_bits(plain.qkv, fused.qkv, what + ": convolved q/k/v");
      expect_bits(plain.conv_state, fused.conv_state, what + ": conv states");
      expect_bits(plain.o, fused.o, what + ": recurrence output");
      expect_bits(plain.z, fused.z, what + ": gated norm");
      expect_bits(plain.state, fused.state, what + ": states");
      for (float v : fused.z) ASSERT_EQ(v, v) << what << ": a normed value left unwritten (NaN)";
    }
  }
  if (!any_fused) GTEST_SKIP() << "the kernels were not built for sm90+ or the device has no clusters";
}

TEST(KdaNormFusion, HeadsNarrowerThanAWarpTakeTheTwoLaunches) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const Result r = run({{0, 3, 2}}, 2, 16, true);
  EXPECT_FALSE(r.fused_launch);
  for (float v : r.z) ASSERT_EQ(v, v) << "a normed value left unwritten (NaN)";
}

}  // namespace
}  // namespace ferry::gpu
#endif
