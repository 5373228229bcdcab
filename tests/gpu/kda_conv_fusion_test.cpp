// KDA's short convolution for decode rows as one launch (kda_conv_decode) against the prefill form
// (kda_conv_rows: convolution and q/k norms by groups of rows, then the state update): the same bits
// in the activated q/k/v and in the slots' new convolution state, over segments of one to three rows
// and of prefill length (groups of rows that straddle segments), positions that read the old state and
// positions past it, head dims of one lane a channel and of several. Outputs are poisoned (NaN)
// before each run.
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/gpu/graph_timing.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::have_device;

template <class V>
DeviceBuffer to_device(const std::vector<V>& v) {
  DeviceBuffer b(v.size() * sizeof(V));
  EXPECT_EQ(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(V), cudaMemcpyHostToDevice), cudaSuccess);
  return b;
}
std::vector<float> to_host(const DeviceBuffer& b) {
  std::vector<float> v(b.bytes() / 4);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(v.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// Segments (slot, first position, rows).
struct Seg {
  int32_t slot, start, len;
};

void check_segments(const std::vector<Seg>& segs) {
  constexpr uint32_t kSlots = 3, kHeads = 2, kK = 4;
  std::vector<int32_t> row_slot, row_pos, row_first, seg_slot, seg_start, seg_len, seg_first;
  for (const Seg& s : segs) {
    seg_slot.push_back(s.slot);
    seg_start.push_back(s.start);
    seg_len.push_back(s.len);
    seg_first.push_back(static_cast<int32_t>(row_slot.size()));
    for (int32_t i = 0; i < s.len; ++i) {
      row_slot.push_back(s.slot);
      row_pos.push_back(s.start + i);
      row_first.push_back(seg_first.back());
    }
  }
  const uint32_t rows = static_cast<uint32_t>(row_slot.size());
  const DeviceBuffer d_row_slot = to_device(row_slot), d_row_pos = to_device(row_pos),
                     d_row_first = to_device(row_first), d_seg_slot = to_device(seg_slot),
                     d_seg_start = to_device(seg_start), d_seg_len = to_device(seg_len),
                     d_seg_first = to_device(seg_first);
  for (uint32_t head_dim : {16u, 128u}) {
    const uint32_t C3 = 3 * kHeads * head_dim;
    std::mt19937 rng(head_dim);
    std::normal_distribution<float> n(0.0f, 1.0f);
    auto random = [&](size_t count) {
      std::vector<float> v(count);
      for (float& x : v) x = n(rng);
      return v;
    };
    const std::vector<float> raw = random(size_t{rows} * C3), w = random(size_t{C3} * kK),
                             state = random(size_t{kSlots} * C3 * (kK - 1));
    const DeviceBuffer d_raw = to_device(raw), d_w = to_device(w);
    std::vector<float> qkv[2], st[2];
    for (int fused = 0; fused < 2; ++fused) {
      DeviceBuffer d_qkv(size_t{rows} * C3 * 4);
      ASSERT_EQ(cudaMemset(d_qkv.get(), 0xff, d_qkv.bytes()), cudaSuccess);
      DeviceBuffer d_state = to_device(state);
      KdaArgs a;
      a.row = {d_row_slot.as<int32_t>(), d_row_pos.as<int32_t>(), d_row_first.as<int32_t>()};
      a.seg = {d_seg_slot.as<int32_t>(), d_seg_start.as<int32_t>(), d_seg_len.as<int32_t>(),
               d_seg_first.as<int32_t>()};
      a.rows = rows;
      a.segments = static_cast<uint32_t>(segs.size());
      a.heads = kHeads;
      a.head_dim = head_dim;
      a.kernel = kK;
      a.qkv = d_qkv.as<float>();
      a.qkv_raw = d_raw.as<float>();
      a.conv_w = d_w.as<float>();
      a.conv_state = d_state.as<float>();
      if (fused == 1) {
        kda_conv_decode(a, nullptr);
      } else {
        kda_conv_rows(a, nullptr);
      }
      qkv[fused] = to_host(d_qkv);
      st[fused] = to_host(d_state);
    }
    ASSERT_EQ(qkv[0].size(), qkv[1].size());
    EXPECT_EQ(std::memcmp(qkv[0].data(), qkv[1].data(), qkv[0].size() * 4), 0) << "q/k/v, head dim " << head_dim;
    EXPECT_EQ(std::memcmp(st[0].data(), st[1].data(), st[0].size() * 4), 0) << "conv state, head dim " << head_dim;
    EXPECT_NE(std::memcmp(st[0].data(), state.data(), state.size() * 4), 0) << "the state was not updated";
    for (float v : qkv[1]) ASSERT_EQ(v, v) << "a row left unwritten (NaN), head dim " << head_dim;
  }
}

TEST(KdaConvFusion, OneLaunchGivesThePrefillFormsBits) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  // The state read by every row, by some rows, and by none.
  check_segments({{2, 5, 1}, {0, 1, 3}, {1, 7, 2}});
}

TEST(KdaConvFusion, PrefillSegmentsGiveTheOneLaunchBits) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  // A chunk's segments: 140 rows, groups of 8 rows across segment starts (37, 137), a first segment
  // at position 0 (no state read).
  check_segments({{0, 0, 37}, {2, 5, 100}, {1, 2, 3}});
}

// A prefill chunk's convolution at the 12-layer GLM shape (2,048 rows of one segment, 64 heads of 128 for each
// of q, k and v, 4 taps): kda_conv_rows' replay time against the bytes it must move (the raw rows read, the
// activated rows written) at the copy bandwidth. Printed, not asserted.
TEST(KdaConvFusion, TimingLine) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  constexpr uint32_t kRows = 2048, kHeads = 64, kDim = 128, kK = 4, C3 = 3 * kHeads * kDim;
  const std::vector<int32_t> slot(kRows, 0), first(kRows, 0), seg_slot{0}, seg_start{0},
      seg_len{static_cast<int32_t>(kRows)}, seg_first{0};
  std::vector<int32_t> pos(kRows);
  for (uint32_t i = 0; i < kRows; ++i) pos[i] = static_cast<int32_t>(i);
  const DeviceBuffer d_slot = to_device(slot), d_pos = to_device(pos), d_first = to_device(first),
                     d_seg_slot = to_device(seg_slot), d_seg_start = to_device(seg_start),
                     d_seg_len = to_device(seg_len), d_seg_first = to_device(seg_first);
  DeviceBuffer raw(size_t{kRows} * C3 * 4), qkv(size_t{kRows} * C3 * 4), w(size_t{C3} * kK * 4),
      state(size_t{C3} * (kK - 1) * 4);
  ASSERT_EQ(cudaMemset(raw.get(), 0x3c, raw.bytes()), cudaSuccess);
  ASSERT_EQ(cudaMemset(w.get(), 0x3c, w.bytes()), cudaSuccess);
  ASSERT_EQ(cudaMemset(state.get(), 0, state.bytes()), cudaSuccess);
  KdaArgs a;
  a.row = {d_slot.as<int32_t>(), d_pos.as<int32_t>(), d_first.as<int32_t>()};
  a.seg = {d_seg_slot.as<int32_t>(), d_seg_start.as<int32_t>(), d_seg_len.as<int32_t>(), d_seg_first.as<int32_t>()};
  a.rows = kRows;
  a.segments = 1;
  a.heads = kHeads;
  a.head_dim = kDim;
  a.kernel = kK;
  a.qkv = qkv.as<float>();
  a.qkv_raw = raw.as<float>();
  a.conv_w = w.as<float>();
  a.conv_state = state.as<float>();
  const double copy = ferry::testing::copy_gbs();
  const double us = ferry::testing::graph_replay_us([&](cudaStream_t s) { kda_conv_rows(a, s); }, 20, false);
  const double bytes = 2.0 * kRows * C3 * 4;
  std::printf("[ timing ] kda_conv_rows %u rows x %u channels, %u taps: %.1f us, %.0f GB/s, %.0f%% of copy (%.0f GB/s)\n",
              kRows, C3, kK, us, bytes / us / 1e3, 100.0 * bytes / us / 1e3 / copy, copy);
}

}  // namespace
}  // namespace ferry::gpu
#endif
