// The device sampler (gpu::sample_rows) against model::sample_token on the same logits rows: every
// row kind of tests/model/sampling_cases.hpp (random, peaked, flat, ties, -inf, NaN, +-0, +inf) at
// vocabularies of 97 to 154880 ids, a grid of (temperature, top-k, top-p, min-p) with seeds and
// positions, greedy rows among them; the tokens must be identical. Also prints the kernel's time
// for a decode step's 8 rows of the GLM vocabulary at common settings.
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "model/cpu/sampler.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/model/sampling_cases.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::have_device;
using model::SamplingParams;

SampleRow device_row(int32_t logit_row, const SamplingParams& p, uint32_t position) {
  SampleRow r;
  r.logit_row = logit_row;
  r.temperature = p.temperature;
  r.top_p = p.top_p;
  r.min_p = p.min_p;
  r.top_k = p.top_k;
  r.position = position;
  r.seed = p.seed;
  return r;
}

// Logits rows on the device and a runner for batches of SampleRows over them.
class DeviceRows {
 public:
  DeviceRows(const std::vector<std::vector<float>>& rows, uint32_t vocab)
      : vocab_(vocab), logits_(rows.size() * vocab * sizeof(float)) {
    for (size_t r = 0; r < rows.size(); ++r) {
      EXPECT_EQ(cudaMemcpy(logits_.as<float>() + r * vocab, rows[r].data(), vocab * sizeof(float), cudaMemcpyHostToDevice),
                cudaSuccess);
    }
  }
  std::vector<int32_t> sample(const std::vector<SampleRow>& batch) {
    DeviceBuffer rows(batch.size() * sizeof(SampleRow)), out(batch.size() * sizeof(int32_t));
    EXPECT_EQ(cudaMemcpy(rows.get(), batch.data(), rows.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemset(out.get(), 0xff, out.bytes()), cudaSuccess);
    sample_rows(logits_.as<float>(), vocab_, rows.as<SampleRow>(), static_cast<uint32_t>(batch.size()), out.as<int32_t>(),
                nullptr);
    std::vector<int32_t> tokens(batch.size());
    EXPECT_EQ(cudaMemcpy(tokens.data(), out.get(), out.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    return tokens;
  }
  // Milliseconds per launch of `batch`, the median of `reps` after a warm-up.
  float time(const std::vector<SampleRow>& batch, int reps) {
    DeviceBuffer rows(batch.size() * sizeof(SampleRow)), out(batch.size() * sizeof(int32_t));
    EXPECT_EQ(cudaMemcpy(rows.get(), batch.data(), rows.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
    Stream st;
    Event e0, e1;
    std::vector<float> ms;
    for (int i = 0; i <= reps; ++i) {
      e0.record(st.get());
      sample_rows(logits_.as<float>(), vocab_, rows.as<SampleRow>(), static_cast<uint32_t>(batch.size()),
                  out.as<int32_t>(), st.get());
      e1.record(st.get());
      st.synchronize();
      if (i > 0) ms.push_back(e1.since(e0));
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }

 private:
  uint32_t vocab_;
  DeviceBuffer logits_;
};

void expect_cpu_tokens(uint32_t vocab, bool many) {
  const auto cases = model::testing::sampling_rows(vocab, vocab + 1);
  std::vector<std::vector<float>> rows;
  for (const auto& c : cases) rows.push_back(c.second);
  DeviceRows dev(rows, vocab);
  const std::vector<SamplingParams> params = model::testing::sampling_params(vocab, many);
  size_t compared = 0, sampled = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    std::vector<SampleRow> batch;
    for (const SamplingParams& p : params) {
      for (uint32_t pos : {3u, 40961u}) batch.push_back(device_row(static_cast<int32_t>(r), p, pos));
    }
    const std::vector<int32_t> got = dev.sample(batch);
    for (size_t j = 0; j < batch.size(); ++j) {
      const SamplingParams& p = params[j / 2];
      const int32_t want = model::sample_token(rows[r], p, batch[j].position);
      ASSERT_EQ(got[j], want) << cases[r].first << " vocab " << vocab << " T " << p.temperature << " top_k " << p.top_k
                              << " top_p " << p.top_p << " min_p " << p.min_p << " seed " << p.seed << " position "
                              << batch[j].position;
      ++compared;
      sampled += p.temperature > 0.0f;
    }
  }
  std::printf("vocab %u: %zu tokens identical (%zu drawn, the rest greedy)\n", vocab, compared, sampled);
}

TEST(DeviceSampler, DrawsTheCpuTokensOnSmallVocabularies) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  expect_cpu_tokens(97, true);
  expect_cpu_tokens(1000, true);
  expect_cpu_tokens(5000, true);  // top-k 5000: cuts above the shared-memory list
}

TEST(DeviceSampler, DrawsTheCpuTokensOnTheGlmVocabulary) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  expect_cpu_tokens(154880, false);
}

TEST(DeviceSampler, EightGlmRowsMatchTheCpuAndReportTheirTime) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const uint32_t vocab = 154880;
  const auto cases = model::testing::sampling_rows(vocab, 9);
  std::vector<std::vector<float>> rows;
  for (const auto& c : cases) {
    if (c.first == "random" || c.first == "peaked" || c.first == "zipf" || c.first == "ties") rows.push_back(c.second);
  }
  DeviceRows dev(rows, vocab);
  struct Setting {
    const char* name;
    SamplingParams p;
  };
  SamplingParams greedy, serve_default, full, top_k;
  serve_default.temperature = full.temperature = top_k.temperature = 1.0f;
  serve_default.top_p = 0.95f;
  top_k.top_k = 40;
  for (const Setting& s : {Setting{"greedy", greedy}, Setting{"T 1, top-p 0.95 (serve default)", serve_default},
                           Setting{"T 1, whole vocabulary", full}, Setting{"T 1, top-k 40", top_k}}) {
    std::vector<SampleRow> batch;
    for (int32_t j = 0; j < 8; ++j) batch.push_back(device_row(j % static_cast<int32_t>(rows.size()), s.p, 100 + j));
    const std::vector<int32_t> got = dev.sample(batch);
    for (size_t j = 0; j < batch.size(); ++j) {
      EXPECT_EQ(got[j], model::sample_token(rows[static_cast<size_t>(batch[j].logit_row)], s.p, batch[j].position)) << s.name;
    }
    std::printf("sample_rows, 8 rows of %u: %-34s %8.1f us\n", vocab, s.name, 1000.0f * dev.time(batch, 20));
  }
}

}  // namespace
}  // namespace ferry::gpu
#endif
