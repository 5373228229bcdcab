// The device planner (gpu/window_plan.cu, gpu/window_planner.hpp) against kv::ResidentWindow fed the
// same selections: 3 slots, 40 frames each, steps of 1 to 3 rows per slot selecting up to 12 of a
// growing context with locality (hits, misses, both sweeps of the hand), an adopted slot, a cut, and
// a step planned on the host in between (the state moved over and back). Every selected position gets
// the same window row, the fetches are the same, and at the end every frame, bit and hand agree.
#if FERRY_HAVE_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/window_planner.hpp"
#include "kv/resident_window.hpp"
#include "tests/gpu/gpu_test_support.hpp"

namespace ferry::gpu {
namespace {

constexpr uint32_t kSlots = 3, kFrames = 40, kContext = 400, kStride = 12, kMaxRows = 9;

struct Step {
  std::vector<int32_t> slot, first, counts, tokens;  // per row; tokens [rows][kStride]
};

class WindowPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::have_device()) GTEST_SKIP() << "no CUDA device";
    FERRY_CUDA(cudaStreamCreate(&stream_));
    planner_ = std::make_unique<WindowPlanner>(1, kSlots, kFrames, kContext, stream_);
    inputs_ = DeviceBuffer(4 * kMaxRows * kStride * sizeof(int32_t));
    out_ = DeviceBuffer(kMaxRows * kStride * sizeof(int32_t));
    fetches_ = DeviceBuffer((2 * kMaxRows * kStride + 1) * sizeof(uint32_t));
  }
  void TearDown() override {
    planner_.reset();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // A step: `rows[s]` rows for slot s, each selecting distinct positions below len[s].
  Step make_step(std::mt19937& rng, const std::vector<uint32_t>& rows, const std::vector<uint32_t>& len) {
    Step st;
    for (uint32_t s = 0; s < kSlots; ++s) {
      const auto first = static_cast<int32_t>(st.slot.size());
      for (uint32_t r = 0; r < rows[s]; ++r) {
        const uint32_t want = std::min<uint32_t>(1 + rng() % kStride, len[s]);
        std::set<int32_t> picked;
        std::vector<int32_t> sel;
        while (sel.size() < want) {
          const bool recent = rng() % 10 < 7 && len[s] > 30;
          const auto p = static_cast<int32_t>(recent ? len[s] - 30 + rng() % 30 : rng() % len[s]);
          if (picked.insert(p).second) sel.push_back(p);
        }
        sel.resize(kStride, -1);
        st.slot.push_back(static_cast<int32_t>(s));
        st.first.push_back(first);
        st.counts.push_back(static_cast<int32_t>(want));
        st.tokens.insert(st.tokens.end(), sel.begin(), sel.end());
      }
    }
    return st;
  }

  // The host's plan of the step (one group): window rows per row, and the sorted fetches.
  static std::pair<std::vector<int32_t>, std::vector<std::pair<uint32_t, uint32_t>>> host_plan(kv::ResidentWindow& w,
                                                                                              const Step& st) {
    std::vector<kv::ResidentWindow::Query> q;
    for (size_t r = 0; r < st.slot.size(); ++r) {
      q.push_back({static_cast<uint32_t>(st.slot[r]), st.tokens.data() + r * kStride, st.counts[r]});
    }
    std::vector<int32_t> table(st.tokens.size(), -1);
    std::vector<kv::WindowFetch> fetches;
    auto end = w.plan(q, 0, table.data(), kStride, fetches);
    EXPECT_TRUE(end && end.value() == q.size());
    w.end_group();
    std::vector<std::pair<uint32_t, uint32_t>> f;
    for (const kv::WindowFetch& x : fetches) f.emplace_back(x.slot * kContext + x.position, x.row);
    std::sort(f.begin(), f.end());
    return {table, f};
  }

  std::pair<std::vector<int32_t>, std::vector<std::pair<uint32_t, uint32_t>>> device_plan(const Step& st) {
    const auto n = static_cast<uint32_t>(st.slot.size());
    auto* in = inputs_.as<int32_t>();
    int32_t* slot = in;
    int32_t* first = in + kMaxRows;
    int32_t* counts = in + 2 * kMaxRows;
    int32_t* tokens = in + 3 * kMaxRows;
    FERRY_CUDA(cudaMemcpyAsync(slot, st.slot.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    FERRY_CUDA(cudaMemcpyAsync(first, st.first.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    FERRY_CUDA(cudaMemcpyAsync(counts, st.counts.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    FERRY_CUDA(cudaMemcpyAsync(tokens, st.tokens.data(), st.tokens.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                               stream_));
    WindowPlanArgs a;
    a.t = planner_->tables(0);
    a.row_slot = slot;
    a.row_first = first;
    a.rows = n;
    a.tokens = tokens;
    a.counts = counts;
    a.stride = kStride;
    a.rows_out = out_.as<int32_t>();
    a.fetches = fetches_.as<uint32_t>();
    a.fetch_count = fetches_.as<uint32_t>() + 2 * kMaxRows * kStride;
    a.fetch_capacity = kMaxRows * kStride;
    a.tier_slot_rows = kContext;
    a.tier_row0 = 0;
    a.counts_out = planner_->counts();
    plan_window(a, stream_);
    std::vector<int32_t> table(st.tokens.size());
    std::vector<uint32_t> raw(2 * kMaxRows * kStride + 1);
    FERRY_CUDA(cudaMemcpyAsync(table.data(), a.rows_out, table.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
    FERRY_CUDA(cudaMemcpyAsync(raw.data(), a.fetches, raw.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost, stream_));
    FERRY_CUDA(cudaStreamSynchronize(stream_));
    std::vector<std::pair<uint32_t, uint32_t>> f;
    for (uint32_t i = 0; i < std::min(raw.back(), kMaxRows * kStride); ++i) f.emplace_back(raw[2 * i], raw[2 * i + 1]);
    std::sort(f.begin(), f.end());
    return {table, f};
  }

  cudaStream_t stream_ = nullptr;
  std::unique_ptr<WindowPlanner> planner_;
  DeviceBuffer inputs_, out_, fetches_;
};

TEST_F(WindowPlanTest, TheDevicePlansEveryStepAsTheHostWindowDoes) {
  kv::ResidentWindow host(kSlots, kFrames), moved(kSlots, kFrames);
  std::mt19937 rng(5);
  std::vector<uint32_t> len{60, 20, 1};
  uint64_t fetched = 0, evicting_steps = 0;
  const std::vector<uint32_t> all{0, 1, 2};
  for (int step = 0; step < 300; ++step) {
    if (step == 40) {  // slot 2 handed to CLOCK with 25 rows in place
      host.adopt_identity(2, 25);
      planner_->adopt_identity(0, 2, 25, stream_);
      len[2] = 25;
    }
    if (step == 150) {  // slot 0 cut back (a rewritten prefix)
      host.invalidate(0, len[0] / 2);
      planner_->invalidate(0, len[0] / 2, stream_);
      len[0] /= 2;
    }
    std::vector<uint32_t> rows(kSlots);
    for (uint32_t s = 0; s < kSlots; ++s) rows[s] = rng() % 4;  // 0 to 3 rows: 36 pinned at most
    if (rows[0] + rows[1] + rows[2] == 0) rows[step % kSlots] = 1;
    const Step st = make_step(rng, rows, len);
    const auto want = host_plan(host, st);
    if (step == 220) {  // planned on the host from the device's state, then moved back
      planner_->to_host(0, all, moved, stream_);
      const auto got = host_plan(moved, st);
      planner_->from_host(0, all, moved, stream_);
      EXPECT_EQ(got, want) << "host step " << step;
    } else {
      const auto got = device_plan(st);
      for (size_t r = 0; r < st.slot.size(); ++r) {
        for (int32_t i = 0; i < st.counts[r]; ++i) {
          ASSERT_EQ(got.first[r * kStride + i], want.first[r * kStride + i]) << "step " << step << " row " << r << " " << i;
        }
      }
      ASSERT_EQ(got.second, want.second) << "step " << step;
      fetched += got.second.size();
    }
    evicting_steps += host.resident(0) + host.resident(1) + host.resident(2) == kSlots * kFrames;
    for (uint32_t s = 0; s < kSlots; ++s) len[s] = std::min(kContext, len[s] + rows[s]);
  }
  EXPECT_GT(evicting_steps, 100u);  // the windows were full: the hand chose victims
  const WindowCounts d = planner_->read_counts(stream_);
  EXPECT_EQ(d.errors, 0u);
  EXPECT_EQ(d.misses, fetched);
  EXPECT_EQ(d.hits + moved.counters().hits, host.counters().hits);
  EXPECT_EQ(d.misses + moved.counters().misses, host.counters().misses);
  // Every frame, reference bit and hand.
  kv::ResidentWindow last(kSlots, kFrames);
  planner_->to_host(0, all, last, stream_);
  for (uint32_t s = 0; s < kSlots; ++s) {
    std::vector<int32_t> pa(kFrames), pb(kFrames);
    std::vector<uint8_t> ra(kFrames), rb(kFrames);
    host.clock(s).export_slot(pa.data(), ra.data());
    last.clock(s).export_slot(pb.data(), rb.data());
    EXPECT_EQ(pa, pb) << "slot " << s;
    EXPECT_EQ(ra, rb) << "slot " << s;
    EXPECT_EQ(host.clock(s).hand(), last.clock(s).hand()) << "slot " << s;
  }
  const std::vector<uint64_t> resident = planner_->resident(stream_);
  for (uint32_t s = 0; s < kSlots; ++s) EXPECT_EQ(resident[s], host.resident(s)) << "slot " << s;
}

TEST_F(WindowPlanTest, APositionOutOfTheContextIsCountedAsAnError) {
  Step st;
  st.slot = {1};
  st.first = {0};
  st.counts = {2};
  st.tokens.assign(kStride, -1);
  st.tokens[0] = 3;
  st.tokens[1] = static_cast<int32_t>(kContext);
  device_plan(st);
  EXPECT_EQ(planner_->read_counts(stream_).errors, 1u);
  EXPECT_EQ(planner_->resident(stream_)[1], 1u);
}

}  // namespace
}  // namespace ferry::gpu
#endif
