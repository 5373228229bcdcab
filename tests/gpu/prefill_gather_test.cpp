// The prefill gather past the resident window (gpu/prefill_gather.hpp) against sparse_mla over the
// same rows all resident: 2 slots of 64 positions, 20 rows (12 of slot 0, 8 of slot 1) selecting up
// to 8 distinct positions each (some none), some positions held by the window's frames (their host
// tier rows are garbage, so reading the tier for them shows), f32 and int8 rows, the attention split
// over blocks. A staging of 128 rows takes the union (62 rows) at once; 48 splits the rows into
// groups; 8 (one row's selection) into groups of about one row. The same output bit for bit each time.
#if FERRY_HAVE_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gpu/cuda_check.hpp"
#include "gpu/cuda_memory.hpp"
#include "gpu/prefill_gather.hpp"
#include "gpu/workspace.hpp"
#include "tests/gpu/gpu_test_support.hpp"

namespace ferry::gpu {
namespace {

constexpr uint32_t kSlots = 2, kContext = 64, kFrames = 16, kStride = 8, kRows = 20, kHeads = 4, kRank = 16;

template <typename T>
DeviceBuffer upload(const std::vector<T>& v) {
  DeviceBuffer b(std::max<size_t>(v.size() * sizeof(T), 16));
  FERRY_CUDA(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return b;
}

std::vector<float> download(const DeviceBuffer& b, size_t n) {
  std::vector<float> v(n);
  FERRY_CUDA(cudaMemcpy(v.data(), b.get(), n * sizeof(float), cudaMemcpyDeviceToHost));
  return v;
}

class PrefillGatherTest : public ::testing::TestWithParam<config::KvType> {
 protected:
  void SetUp() override {
    if (!testing::have_device()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(PrefillGatherTest, GroupsOfAnyStagingSizeGiveTheAllResidentAttention) {
  const config::KvType type = GetParam();
  const bool int8 = type == config::KvType::int8;
  const uint64_t row_bytes = int8 ? kRank : kRank * sizeof(float);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  // All resident: [slots][context] rows.
  std::vector<uint8_t> rows(uint64_t{kSlots} * kContext * row_bytes);
  std::vector<float> scales(uint64_t{kSlots} * kContext);
  for (uint64_t i = 0; i < rows.size(); i += int8 ? 1 : sizeof(float)) {
    if (int8) {
      rows[i] = static_cast<uint8_t>(rng() & 0xff);
    } else {
      const float f = u(rng);
      std::memcpy(&rows[i], &f, sizeof f);
    }
  }
  for (float& s : scales) s = 0.01f + 0.02f * (u(rng) + 1.0f);
  // The window holds 10 positions of each slot at shuffled frames; the host tier (two layers' rows
  // per slot, this one second) holds every other position, garbage where the window holds it.
  std::vector<int32_t> pos_frame(uint64_t{kSlots} * kContext, -1);
  std::vector<uint8_t> window(uint64_t{kSlots} * kFrames * row_bytes, 0);
  std::vector<float> window_scales(uint64_t{kSlots} * kFrames, 0.0f);
  const uint32_t tier_slot_rows = 2 * kContext, tier_row0 = kContext;
  std::vector<uint8_t> tier(uint64_t{kSlots} * tier_slot_rows * row_bytes, 0x7f);
  std::vector<float> tier_scales(uint64_t{kSlots} * tier_slot_rows, 1e6f);
  for (uint32_t s = 0; s < kSlots; ++s) {
    std::vector<uint32_t> pos(kContext), frames(kFrames);
    std::iota(pos.begin(), pos.end(), 0u);
    std::iota(frames.begin(), frames.end(), 0u);
    std::shuffle(pos.begin(), pos.end(), rng);
    std::shuffle(frames.begin(), frames.end(), rng);
    for (uint32_t p = 0; p < kContext; ++p) {
      const uint64_t from = uint64_t{s} * kContext + p;
      const bool held = std::find(pos.begin(), pos.begin() + 10, p) != pos.begin() + 10;
      if (held) {
        const uint32_t f = frames[std::find(pos.begin(), pos.end(), p) - pos.begin()];
        pos_frame[from] = static_cast<int32_t>(f);
        std::memcpy(&window[(uint64_t{s} * kFrames + f) * row_bytes], &rows[from * row_bytes], row_bytes);
        window_scales[uint64_t{s} * kFrames + f] = scales[from];
      } else {
        const uint64_t to = uint64_t{s} * tier_slot_rows + tier_row0 + p;
        std::memcpy(&tier[to * row_bytes], &rows[from * row_bytes], row_bytes);
        tier_scales[to] = scales[from];
      }
    }
  }
  // The rows' selections: distinct positions of their slot, 0 to kStride of them.
  std::vector<int32_t> row_slot(kRows), counts(kRows), tokens(uint64_t{kRows} * kStride, 0);
  std::vector<float> q(uint64_t{kRows} * kHeads * kRank);
  for (float& x : q) x = u(rng);
  for (uint32_t r = 0; r < kRows; ++r) {
    row_slot[r] = r < 12 ? 0 : 1;
    counts[r] = r == 3 ? 0 : 1 + static_cast<int32_t>(rng() % kStride);
    std::set<int32_t> seen;
    for (int32_t i = 0; i < counts[r];) {
      const auto p = static_cast<int32_t>(rng() % kContext);
      if (seen.insert(p).second) tokens[uint64_t{r} * kStride + i++] = p;
    }
  }
  DeviceBuffer d_rows = upload(rows), d_scales = upload(scales), d_pos_frame = upload(pos_frame);
  DeviceBuffer d_window = upload(window), d_window_scales = upload(window_scales), d_tier = upload(tier);
  DeviceBuffer d_tier_scales = upload(tier_scales), d_slot = upload(row_slot), d_counts = upload(counts);
  DeviceBuffer d_tokens = upload(tokens), d_q = upload(q);
  const size_t out_floats = size_t{kRows} * kHeads * kRank;
  DeviceBuffer d_want(out_floats * sizeof(float)), d_got(out_floats * sizeof(float));
  DeviceBuffer d_partial(size_t{kMlaPartialRows} * kHeads * (kRank + 2) * sizeof(float));

  SparseMlaArgs a;
  a.row.slot = d_slot.as<int32_t>();
  a.rows = kRows;
  a.heads = kHeads;
  a.rank = kRank;
  a.ctx = kContext;
  a.max_tokens = kStride;
  a.scale = 0.25f;
  a.q_lat = d_q.as<float>();
  a.latents = d_rows.get();
  a.latent_scales = int8 ? d_scales.as<float>() : nullptr;
  a.latent_type = type;
  a.tokens = d_tokens.as<int32_t>();
  a.counts = d_counts.as<int32_t>();
  a.out = d_want.as<float>();
  a.partial = d_partial.as<float>();
  a.partial_rows = kMlaPartialRows;
  sparse_mla(a, nullptr);
  FERRY_CUDA(cudaDeviceSynchronize());
  const std::vector<float> want = download(d_want, out_floats);

  PrefillGather::Source src;
  src.window.pos_frame = d_pos_frame.as<int32_t>();
  src.window.frames = kFrames;
  src.window.context = kContext;
  src.window_rows = d_window.as<uint8_t>();
  src.window_scales = int8 ? d_window_scales.as<float>() : nullptr;
  src.tier = d_tier.as<uint8_t>();
  src.tier_scales = int8 ? d_tier_scales.as<float>() : nullptr;
  src.tier_slot_rows = tier_slot_rows;
  src.tier_row0 = tier_row0;
  std::set<std::pair<int32_t, int32_t>> distinct;
  for (uint32_t r = 0; r < kRows; ++r) {
    for (int32_t i = 0; i < counts[r]; ++i) distinct.insert({row_slot[r], tokens[uint64_t{r} * kStride + i]});
  }
  for (uint32_t capacity : {128u, 48u, 8u}) {
    PrefillGather gather(kSlots, kContext, capacity, kRows, kStride, row_bytes, int8);
    for (int pass = 0; pass < 2; ++pass) {  // a second attend finds every claim released
      FERRY_CUDA(cudaMemset(d_got.get(), 0xff, d_got.bytes()));
      SparseMlaArgs g = a;
      g.out = d_got.as<float>();
      gather.attend(g, src, nullptr);
      FERRY_CUDA(cudaDeviceSynchronize());
      const std::vector<float> got = download(d_got, out_floats);
      size_t differ = 0;
      for (size_t i = 0; i < out_floats; ++i) differ += std::memcmp(&want[i], &got[i], sizeof(float)) != 0;
      EXPECT_EQ(differ, 0u) << "staging " << capacity << " pass " << pass;
    }
    const PrefillGather::Counts c = gather.counts();
    EXPECT_EQ(c.errors, 0u);
    if (capacity >= distinct.size()) {
      EXPECT_EQ(c.groups, 2u) << "one group an attend";
      EXPECT_EQ(c.rows, 2 * distinct.size());  // each (slot, position) copied once an attend
    } else {
      EXPECT_GT(c.groups, 2u) << "staging " << capacity;
      EXPECT_GT(c.retries, 0u);
      EXPECT_GE(c.rows, 2 * distinct.size());
    }
    uint64_t from_tier = 0;
    for (const auto& [s, p] : distinct) {
      from_tier += pos_frame[static_cast<uint64_t>(s) * kContext + static_cast<uint64_t>(p)] < 0;
    }
    if (capacity >= distinct.size()) {
      EXPECT_EQ(c.tier_rows, 2 * from_tier);
    }
    EXPECT_GT(c.tier_rows, 0u);
    EXPECT_LT(c.tier_rows, c.rows);  // some from the window's frames
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, PrefillGatherTest, ::testing::Values(config::KvType::f32, config::KvType::int8),
                         [](const auto& info) { return std::string(config::kv_type_name(info.param)); });

}  // namespace
}  // namespace ferry::gpu
#endif
