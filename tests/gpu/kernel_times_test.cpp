// Kernel records of steps (gpu/kernel_times.hpp, `ferry bench --kernel-times`): the summary's sums on
// hand-made records, and a replayed one-row decode step of the random Q4_K 5-layer model recorded
// by CUPTI: every kernel node of its graph once, with the graph's names. Structure only, no speed.
#if FERRY_HAVE_CUDA
#include "gpu/kernel_times.hpp"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gpu/cuda_stage.hpp"
#include "model/glm5/glm5_weights.hpp"
#include "model/pipeline.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/model/random_model.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::have_device;
using model::SlotRows;

const KernelTimeRow* row(const KernelTimes& t, const std::string& name) {
  for (const KernelTimeRow& r : t.rows) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

TEST(KernelTimes, OwnAndIdleAddUpToTheSpan) {
  // us on two streams: a [0, 10] and b [12, 20] on 1, c [5, 25] beside them on 2, a again [30, 31]
  // on 1; one kernel outside the window.
  const uint64_t u = 1000;
  const std::vector<KernelRecord> rec{{"a", 0, 10 * u, 1, 7},     {"c", 5 * u, 25 * u, 2, 7},
                                      {"b", 12 * u, 20 * u, 1, 7}, {"a", 30 * u, 31 * u, 1, 7},
                                      {"late", 200 * u, 201 * u, 1, 0}};
  const KernelTimes t = summarize_kernel_times(rec, {{0, 100 * u}});
  EXPECT_EQ(t.steps, 1u);
  EXPECT_DOUBLE_EQ(t.kernels, 4);
  EXPECT_DOUBLE_EQ(t.graph_kernels, 4);
  EXPECT_DOUBLE_EQ(t.streams, 2);
  EXPECT_DOUBLE_EQ(t.span_us, 31);
  EXPECT_DOUBLE_EQ(t.host_us, 100);
  EXPECT_DOUBLE_EQ(t.busy_us, 10 + 20 + 8 + 1);
  EXPECT_DOUBLE_EQ(t.gap_us, 2 + 10);  // b after a, the second a after b
  EXPECT_DOUBLE_EQ(t.idle_us, 5);      // the second a after c
  double own = 0;
  for (const KernelTimeRow& r : t.rows) own += r.own_us;
  EXPECT_DOUBLE_EQ(own + t.idle_us, t.span_us);
  ASSERT_NE(row(t, "a"), nullptr);
  EXPECT_DOUBLE_EQ(row(t, "a")->count, 2);
  EXPECT_DOUBLE_EQ(row(t, "a")->own_us, 11);
  EXPECT_DOUBLE_EQ(row(t, "b")->own_us, 0);  // ends inside c
  EXPECT_DOUBLE_EQ(row(t, "c")->own_us, 15);
  EXPECT_EQ(row(t, "late"), nullptr);
  EXPECT_EQ(t.rows.front().name, "a");  // the largest share of the span, idle before it included (16 us), first
  const std::string line = format_kernel_timeline(rec, {0, 100 * u});
  EXPECT_NE(line.find("12.000,8.000,2.000,1,\"b\""), std::string::npos) << line;
}

TEST(KernelTimes, ReplayedDecodeStepRecordsEveryGraphKernel) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  if (auto e = start_kernel_records()) GTEST_SKIP() << e->message;
  model::Glm5Hparams hp = ferry::testing::tiny_gpu_shape(256);
  hp.kda_head_dim = 32;
  ASSERT_TRUE(hp.validate().empty());
  const std::string path = testing::temp_model_path("kernel_times_q4_k");
  ASSERT_TRUE(testing::write_random_model(hp, model::GgmlType::Q4_K, path, 31));
  auto w = model::Glm5Weights::load(path);
  ASSERT_TRUE(w) << w.error().message;
  CudaStageOptions o;
  o.max_slots = 1;
  o.max_context = 256;
  o.max_step_rows = 32;
  auto s = CudaStage::from_weights(*w.value(), {0, hp.n_layers}, o);
  ASSERT_TRUE(s) << s.error().message;
  CudaStage* cs = s.value().get();
  std::vector<std::shared_ptr<model::Stage>> stages{std::move(s.value())};
  auto p = model::Pipeline::make(std::move(stages));
  ASSERT_TRUE(p) << p.error().message;
  std::filesystem::remove(path);
  std::vector<int32_t> prompt(20);
  std::mt19937 rng(7);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % hp.vocab_size);
  auto r = p.value()->step({SlotRows{0, 0, prompt, false, true, {}}});
  ASSERT_TRUE(r) << r.error().message;
  int32_t next = r.value()[0].sampled;
  uint32_t pos = static_cast<uint32_t>(prompt.size());
  auto decode = [&] {
    r = p.value()->step({SlotRows{0, pos++, {next}, false, true, {}}});
    ASSERT_TRUE(r) << r.error().message;
    next = r.value()[0].sampled;
  };
  for (int i = 0; i < 2; ++i) decode();  // eager, captured (and replayed)
  ASSERT_EQ(cs->decode_graphs(), 1u);
  take_kernel_records();
  std::vector<StepWindow> steps;
  for (int i = 0; i < 3; ++i) {
    steps.push_back({kernel_clock_ns(), 0});
    decode();
    steps.back().end = kernel_clock_ns();
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<KernelRecord> rec = take_kernel_records();
  stop_kernel_records();

  std::map<std::string, int> graph;
  int memsets = 0;
  for (const std::string& k : cs->decode_graph_kernels(1, 1, 1)) {
    if (k.rfind("(mem", 0) == 0) {
      ++memsets;
    } else {
      ++graph[k];
    }
  }
  ASSERT_FALSE(graph.empty());
  int graph_kernels = 0;
  for (const auto& [name, n] : graph) graph_kernels += n;
  for (const StepWindow& st : steps) {
    std::map<std::string, int> seen;
    int extra = 0;
    for (const KernelRecord& k : rec) {
      if (k.start < st.begin || k.end > st.end || k.graph == 0) continue;
      EXPECT_LE(k.start, k.end);
      if (graph.count(k.name) != 0) {
        ++seen[k.name];
      } else {
        ++extra;  // a memset node the driver runs as a kernel
      }
    }
    EXPECT_EQ(seen, graph);
    EXPECT_LE(extra, memsets);
  }
  const KernelTimes t = summarize_kernel_times(rec, steps);
  EXPECT_EQ(t.steps, 3u);
  EXPECT_GE(t.graph_kernels, graph_kernels);
  double own = 0, count = 0;
  for (const KernelTimeRow& x : t.rows) own += x.own_us, count += x.count;
  EXPECT_DOUBLE_EQ(count, t.kernels);
  EXPECT_NEAR(own + t.idle_us, t.span_us, 1e-6 * t.span_us + 1e-9);
  EXPECT_LE(t.span_us, t.host_us);
  std::cout << format_kernel_times(t, "one-row decode step of the 5-layer model");
}

}  // namespace
}  // namespace ferry::gpu
#endif
