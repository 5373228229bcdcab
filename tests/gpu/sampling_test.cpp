// The device sampler (gpu::sample_rows, many blocks a row, and gpu::sample_rows_by_block, one) against
// model::sample_token on the same logits rows: every row kind of tests/model/sampling_cases.hpp
// (random, peaked, flat, ties, -inf, NaN, +-0, +inf) at vocabularies of 97 to 154880 ids, a grid of
// (temperature, top-k, top-p, min-p) with seeds and positions, greedy rows among them, and many seeds
// at serve's settings on the GLM vocabulary, and rows built to take each way of the many-block path
// (a list, a band, all blocks, the bucket walk of rows of ties); the tokens must be identical. Also prints both paths' times for a
// decode step's 3 and 8 rows of the GLM vocabulary at common settings, and each way's, with the phase
// marks of the many-block launch's first block (row 0's).
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
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

enum class Path { grid, by_block };

// Logits rows on the device and a runner for batches of SampleRows over them.
class DeviceRows {
 public:
  DeviceRows(const std::vector<std::vector<float>>& rows, uint32_t vocab)
      : vocab_(vocab), logits_(rows.size() * vocab * sizeof(float)), scratch_(sample_scratch_bytes()) {
    for (size_t r = 0; r < rows.size(); ++r) {
      EXPECT_EQ(cudaMemcpy(logits_.as<float>() + r * vocab, rows[r].data(), vocab * sizeof(float), cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    EXPECT_EQ(cudaMemset(scratch_.get(), 0, scratch_.bytes()), cudaSuccess);
  }
  std::vector<int32_t> sample(const std::vector<SampleRow>& batch, Path path = Path::grid) {
    DeviceBuffer rows(batch.size() * sizeof(SampleRow)), out(batch.size() * sizeof(int32_t));
    EXPECT_EQ(cudaMemcpy(rows.get(), batch.data(), rows.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemset(out.get(), 0xff, out.bytes()), cudaSuccess);
    launch(rows.as<SampleRow>(), static_cast<uint32_t>(batch.size()), out.as<int32_t>(), path, nullptr);
    std::vector<int32_t> tokens(batch.size());
    EXPECT_EQ(cudaMemcpy(tokens.data(), out.get(), out.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    return tokens;
  }
  // Milliseconds per launch of `batch`, the median of `reps` after a warm-up.
  float time(const std::vector<SampleRow>& batch, int reps, Path path) {
    DeviceBuffer rows(batch.size() * sizeof(SampleRow)), out(batch.size() * sizeof(int32_t));
    EXPECT_EQ(cudaMemcpy(rows.get(), batch.data(), rows.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
    Stream st;
    Event e0, e1;
    std::vector<float> ms;
    for (int i = 0; i <= reps; ++i) {
      e0.record(st.get());
      launch(rows.as<SampleRow>(), static_cast<uint32_t>(batch.size()), out.as<int32_t>(), path, st.get());
      e1.record(st.get());
      st.synchronize();
      if (i > 0) ms.push_back(e1.since(e0));
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }
  // The last many-block launch's phase marks, as one line: microseconds from each mark to the next at
  // the device's clock rate, and from the first to the last.
  std::string phases() const {
    const SamplePhases p = sample_phases(scratch_.get());
    int khz = 0, dev = 0;
    EXPECT_EQ(cudaGetDevice(&dev), cudaSuccess);
    EXPECT_EQ(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev), cudaSuccess);
    std::string line = "  marks (us):";
    char buf[32];
    for (size_t i = 1; i < p.clocks.size() && khz > 0; ++i) {
      std::snprintf(buf, sizeof buf, " %.2f", static_cast<double>(p.clocks[i] - p.clocks[i - 1]) * 1e3 / khz);
      line += buf;
    }
    const double span = p.clocks.size() > 1 ? static_cast<double>(p.clocks.back() - p.clocks.front()) : 0.0;
    std::snprintf(buf, sizeof buf, " | span %.2f us", khz > 0 ? span * 1e3 / khz : 0.0);
    return line + buf;
  }

 private:
  void launch(const SampleRow* rows, uint32_t n, int32_t* out, Path path, cudaStream_t stream) {
    if (path == Path::grid) {
      sample_rows(logits_.as<float>(), vocab_, rows, n, out, scratch_.get(), stream);
    } else {
      sample_rows_by_block(logits_.as<float>(), vocab_, rows, n, out, stream);
    }
  }

  uint32_t vocab_;
  DeviceBuffer logits_, scratch_;
};

void expect_cpu_tokens(uint32_t vocab, bool many, Path path = Path::grid) {
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
    const std::vector<int32_t> got = dev.sample(batch, path);
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
  std::printf("vocab %u, %s: %zu tokens identical (%zu drawn, the rest greedy)\n", vocab,
              path == Path::grid ? "many blocks a row" : "one block a row", compared, sampled);
}

TEST(DeviceSampler, DrawsTheCpuTokensOnSmallVocabularies) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  expect_cpu_tokens(97, true);
  expect_cpu_tokens(1000, true);
  expect_cpu_tokens(5000, true);  // two blocks a row; top-k 5000 cuts above the one-block path's list
  expect_cpu_tokens(20000, false);
}

TEST(DeviceSampler, OneBlockPathDrawsTheCpuTokens) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  expect_cpu_tokens(97, true, Path::by_block);
  expect_cpu_tokens(5000, true, Path::by_block);
}

TEST(DeviceSampler, DrawsTheCpuTokensOnTheGlmVocabulary) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  expect_cpu_tokens(154880, false);
}

// Serve's settings and their neighbours, 16 seeds each at two positions, on rows shaped like a model's.
TEST(DeviceSampler, ManySeedsOnTheGlmVocabularyMatchTheCpu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const uint32_t vocab = 154880;
  const auto cases = model::testing::sampling_rows(vocab, 17);
  std::vector<std::vector<float>> rows;
  for (const auto& c : cases) {
    if (c.first == "random" || c.first == "peaked" || c.first == "zipf" || c.first == "ties") rows.push_back(c.second);
  }
  DeviceRows dev(rows, vocab);
  std::vector<SamplingParams> params;
  for (float t : {0.4f, 0.7f, 1.0f}) {
    for (int cut = 0; cut < 4; ++cut) {
      SamplingParams p;
      p.temperature = t;
      p.top_p = cut == 2 ? 1.0f : cut == 1 ? 0.9f : 0.95f;
      p.top_k = cut == 1 ? 40 : 0;
      p.min_p = cut >= 2 ? 0.05f : 0.0f;
      for (uint64_t s = 0; s < 16; ++s) {
        p.seed = 0x243f6a8885a308d3ull * (s + 1) + static_cast<uint64_t>(cut);
        params.push_back(p);
      }
    }
  }
  std::vector<SampleRow> batch;
  for (size_t r = 0; r < rows.size(); ++r) {
    for (const SamplingParams& p : params) {
      for (uint32_t pos : {7u, 123457u}) batch.push_back(device_row(static_cast<int32_t>(r), p, pos));
    }
  }
  const std::vector<int32_t> got = dev.sample(batch);
  for (size_t j = 0; j < batch.size(); ++j) {
    const SamplingParams& p = params[(j / 2) % params.size()];
    const auto r = static_cast<size_t>(batch[j].logit_row);
    ASSERT_EQ(got[j], model::sample_token(rows[r], p, batch[j].position))
        << "row " << r << " T " << p.temperature << " top_k " << p.top_k << " top_p " << p.top_p << " min_p "
        << p.min_p << " seed " << p.seed << " position " << batch[j].position;
  }
  std::printf("vocab %u: %zu drawn tokens identical\n", vocab, batch.size());
}

// Rows that take each way of the many-block sampler on the GLM vocabulary: few keys near the top (the
// list gathered during the value histogram), a cut deeper than that list but over few keys (the list
// gathered after it), a nucleus of most of the vocabulary (flat, wide: every block to the end), ties
// across value buckets, a tie at the top, 128 / 129 distinct keys within T / 8 of the top (one
// value bucket of a list: its keys ordered by counting, one more by radix passes), and top-k goals met
// exactly at the end of a group of buckets.
std::vector<std::pair<std::string, std::vector<float>>> path_rows(uint32_t vocab) {
  std::mt19937 rng(29);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::pair<std::string, std::vector<float>>> rows;
  auto add = [&](std::string name, auto make) {
    std::vector<float> r(vocab);
    for (uint32_t i = 0; i < vocab; ++i) r[i] = make(i);
    rows.emplace_back(std::move(name), std::move(r));
  };
  add("few near the top", [&](uint32_t i) { return i % 509 == 7 ? 5.0f + normal(rng) : normal(rng) - 30.0f; });
  // 3,872 ids: half near 0, half near -20, the rest -inf; top-k 3000 and top-p 0.99999 cut in the deep half.
  add("deep few", [&](uint32_t i) {
    if (i % 40 != 0) return -INFINITY;
    return i < vocab / 2 ? normal(rng) : -20.0f + 0.1f * normal(rng);
  });
  add("flat", [&](uint32_t) { return 0.5f; });
  add("wide", [&](uint32_t) { return 0.3f * normal(rng); });
  add("ties", [&](uint32_t) { return std::round(2.0f * normal(rng)) / 2.0f; });
  add("top tie", [&](uint32_t i) { return i == 1234 || i == 99999 ? 6.0f : normal(rng); });
  for (uint32_t n : {128u, 129u}) {
    add(std::to_string(n) + " in the top bucket", [&, n](uint32_t i) {
      return i % 1201 == 3 && i / 1201 < n ? 5.0f - 1e-4f * static_cast<float>(i / 1201) : normal(rng) - 30.0f;
    });
  }
  // Distinct values in two groups with empty value buckets between: 40 ids near 5, 2,960 near 3, so
  // that top-k 40 and 3000 reach their goal exactly at a group's last bucket.
  add("groups of 40 and 2960", [&](uint32_t i) {
    if (i % 50 == 1 && i / 50 < 40) return 5.0f - 1e-4f * static_cast<float>(i / 50);
    if (i % 50 == 2 && i / 50 < 2960) return 3.0f - 1e-4f * static_cast<float>(i / 50);
    return normal(rng) - 30.0f;
  });
  return rows;
}

TEST(DeviceSampler, EveryWayOfTheManyBlockPathDrawsTheCpuTokens) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const uint32_t vocab = 154880;
  const auto cases = path_rows(vocab);
  std::vector<std::vector<float>> rows;
  for (const auto& c : cases) rows.push_back(c.second);
  DeviceRows dev(rows, vocab);
  struct Cut {
    uint32_t top_k;
    float top_p, min_p;
  };
  const Cut cuts[] = {{0, 0.95f, 0.0f},  {1, 1.0f, 0.0f},   {3000, 1.0f, 0.0f}, {3000, 0.95f, 0.0f},
                      {0, 1.0f, 0.05f},  {0, 0.9f, 0.05f},  {0, 0.99999f, 0.0f}, {0, 1.0f, 0.0f},
                      {40, 0.95f, 0.1f}, {0, 1.0f, 0.999f}};
  std::vector<SamplingParams> params;
  for (float t : {0.4f, 1.0f}) {
    for (const Cut& c : cuts) {
      for (uint64_t s = 0; s < 4; ++s) {
        SamplingParams p;
        p.temperature = t;
        p.top_k = c.top_k;
        p.top_p = c.top_p;
        p.min_p = c.min_p;
        p.seed = 0x9e3779b97f4a7c15ull * (s + 1) + c.top_k;
        params.push_back(p);
      }
    }
  }
  size_t compared = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    std::vector<SampleRow> batch;
    for (const SamplingParams& p : params) {
      for (uint32_t pos : {5u, 77777u}) batch.push_back(device_row(static_cast<int32_t>(r), p, pos));
    }
    // Three rows a launch (all of a decode step's on the H200), then each row on its own.
    const std::vector<int32_t> got = dev.sample(batch);
    for (size_t j = 0; j < batch.size(); ++j) {
      const SamplingParams& p = params[j / 2];
      const int32_t want = model::sample_token(rows[r], p, batch[j].position);
      const int32_t alone = j % 7 == 0 ? dev.sample({batch[j]})[0] : want;
      ASSERT_EQ(got[j], want) << cases[r].first << " T " << p.temperature << " top_k " << p.top_k << " top_p "
                              << p.top_p << " min_p " << p.min_p << " seed " << p.seed << " position "
                              << batch[j].position;
      ASSERT_EQ(alone, want) << cases[r].first << " T " << p.temperature << " top_k " << p.top_k << ", one row";
      ++compared;
    }
  }
  std::printf("vocab %u, every way of the many-block path: %zu drawn tokens identical\n", vocab, compared);
  // The time of each way, 3 rows of one kind a launch, at T 0.4 / top-p 0.95 unless said.
  struct Timed {
    const char* name;
    int32_t row;
    uint32_t top_k;
  };
  for (const Timed& t : {Timed{"list during the histogram (few near the top)", 0, 0},
                         Timed{"list after it (deep few, top-k 3000)", 1, 3000},
                         Timed{"all blocks to the end (wide)", 3, 0},
                         Timed{"list, 128 keys in one bucket (counted)", 6, 0},
                         Timed{"list, 129 keys in one bucket (radix passes)", 7, 0}}) {
    SamplingParams p;
    p.temperature = 0.4f;
    p.top_p = 0.95f;
    p.top_k = t.top_k;
    const std::vector<SampleRow> batch(3, device_row(t.row, p, 100));
    std::printf("3 rows of %u, %-46s %8.1f us\n", vocab, t.name, 1000.0f * dev.time(batch, 20, Path::grid));
    std::printf("%s\n", dev.phases().c_str());
  }
}

// Rows of ties on the GLM vocabulary, which take the bucket walk (model/cpu/sampling_buckets.hpp; its
// CPU test shows the walk holding on rows and cuts of these kinds): one value over half the ids (every block), a
// run of one value cut exactly at its end, one before and one past it, min-p with ties.
TEST(DeviceSampler, TiesTakeTheBucketWalkAndDrawTheCpuTokens) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const uint32_t vocab = 154880;
  std::mt19937 rng(43);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> rows(3, std::vector<float>(vocab));
  const char* names[] = {"ties", "one value over half", "two values"};
  for (uint32_t i = 0; i < vocab; ++i) {
    rows[0][i] = std::round(2.0f * normal(rng)) / 2.0f;
    rows[1][i] = i % 2 == 0 ? 1.0f : -8.0f - std::floor(4.0f * std::abs(normal(rng)));
    rows[2][i] = i % 3 == 0 ? 2.0f : i % 3 == 1 ? 1.5f : -INFINITY;
  }
  DeviceRows dev(rows, vocab);
  const uint32_t run = (vocab + 2) / 3;  // the ids of the top value of "two values"
  struct Cut {
    uint32_t top_k;
    float top_p, min_p;
  };
  const Cut cuts[] = {{0, 0.95f, 0.0f}, {40, 1.0f, 0.0f},     {run, 1.0f, 0.0f},  {run - 1, 1.0f, 0.0f},
                      {run + 1, 0.7f, 0.0f}, {0, 1.0f, 0.7f}, {0, 0.9f, 0.05f}, {2 * run, 0.95f, 0.1f}};
  size_t compared = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    std::vector<SampleRow> batch;
    std::vector<SamplingParams> params;
    for (float t : {0.4f, 1.0f}) {
      for (const Cut& c : cuts) {
        for (uint64_t s = 0; s < 2; ++s) {
          SamplingParams p;
          p.temperature = t;
          p.top_k = c.top_k;
          p.top_p = c.top_p;
          p.min_p = c.min_p;
          p.seed = 0x2545f4914f6cdd1dull * (s + 1) + c.top_k;
          params.push_back(p);
          for (uint32_t pos : {9u, 65537u}) batch.push_back(device_row(static_cast<int32_t>(r), p, pos));
        }
      }
    }
    const std::vector<int32_t> got = dev.sample(batch);
    for (size_t j = 0; j < batch.size(); ++j) {
      const SamplingParams& p = params[j / 2];
      ASSERT_EQ(got[j], model::sample_token(rows[r], p, batch[j].position))
          << names[r] << " T " << p.temperature << " top_k " << p.top_k << " top_p " << p.top_p << " min_p "
          << p.min_p << " seed " << p.seed << " position " << batch[j].position;
      ++compared;
    }
  }
  std::printf("vocab %u, rows of ties (the bucket walk): %zu drawn tokens identical\n", vocab, compared);
  struct Timed {
    const char* name;
    int32_t row;
    float temperature;
    uint32_t top_k;
  };
  for (const Timed& t : {Timed{"ties, T 1, top-p 0.95", 0, 1.0f, 0}, Timed{"ties, T 0.4, top-p 0.95", 0, 0.4f, 0},
                         Timed{"two values, T 1, top-k at the run's end", 2, 1.0f, run}}) {
    SamplingParams p;
    p.temperature = t.temperature;
    p.top_p = t.top_k == 0 ? 0.95f : 1.0f;
    p.top_k = t.top_k;
    const std::vector<SampleRow> batch(3, device_row(t.row, p, 100));
    std::printf("3 rows of %u, bucket walk: %-40s %8.1f us\n", vocab, t.name, 1000.0f * dev.time(batch, 20, Path::grid));
    std::printf("%s\n", dev.phases().c_str());
  }
}

TEST(DeviceSampler, GlmRowsMatchTheCpuAndReportTheirTime) {
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
  SamplingParams greedy, serve_default, warm, full, top_k;
  serve_default.temperature = full.temperature = top_k.temperature = 1.0f;
  serve_default.top_p = warm.top_p = 0.95f;
  warm.temperature = 0.4f;
  top_k.top_k = 40;
  for (const Setting& s : {Setting{"greedy", greedy}, Setting{"T 1, top-p 0.95 (serve default)", serve_default},
                           Setting{"T 0.4, top-p 0.95", warm}, Setting{"T 1, whole vocabulary", full},
                           Setting{"T 1, top-k 40", top_k}}) {
    for (int32_t n : {3, 8}) {
      std::vector<SampleRow> batch;
      for (int32_t j = 0; j < n; ++j) batch.push_back(device_row(j % static_cast<int32_t>(rows.size()), s.p, 100 + j));
      for (Path path : {Path::grid, Path::by_block}) {
        const std::vector<int32_t> got = dev.sample(batch, path);
        for (size_t j = 0; j < batch.size(); ++j) {
          EXPECT_EQ(got[j], model::sample_token(rows[static_cast<size_t>(batch[j].logit_row)], s.p, batch[j].position))
              << s.name;
        }
        std::printf("%d rows of %u, %-16s %-34s %8.1f us\n", n, vocab,
                    path == Path::grid ? "many blocks:" : "one block a row:", s.name,
                    1000.0f * dev.time(batch, 20, path));
        if (path == Path::grid && n == 3) std::printf("%s\n", dev.phases().c_str());
      }
    }
  }
}

}  // namespace
}  // namespace ferry::gpu
#endif
