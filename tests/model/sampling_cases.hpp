#pragma once
// Logit rows and sampling parameters that stress a sampler (the CPU one in tests/model, the device
// one against it in tests/gpu): random, peaked, flat, ties, -inf masks, NaN, +-0, +inf, and cuts
// that fall inside runs of equal logits.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "model/step.hpp"

namespace ferry::model::testing {

inline std::vector<std::pair<std::string, std::vector<float>>> sampling_rows(uint32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<uint32_t> id(0, vocab - 1);
  std::vector<std::pair<std::string, std::vector<float>>> rows;
  auto add = [&](std::string name, auto make) {
    std::vector<float> r(vocab);
    for (uint32_t i = 0; i < vocab; ++i) r[i] = make(i);
    rows.emplace_back(std::move(name), std::move(r));
  };
  add("random", [&](uint32_t) { return 3.0f * normal(rng); });
  add("peaked", [&](uint32_t i) { return normal(rng) + (i % 997 == 5 ? 8.0f : 0.0f) + (i == vocab / 3 ? 15.0f : 0.0f); });
  add("flat", [&](uint32_t) { return 0.5f; });
  add("ties", [&](uint32_t) { return std::round(2.0f * normal(rng)) / 2.0f; });
  add("near-flat", [&](uint32_t i) { return 1.0f + 1e-6f * static_cast<float>(i % 7); });
  add("masked", [&](uint32_t i) { return i % 10 == 3 ? 2.0f * normal(rng) : -INFINITY; });
  add("all-masked", [&](uint32_t) { return -INFINITY; });
  add("zipf", [&](uint32_t i) { return -1.1f * std::log(1.0f + static_cast<float>((i * 2654435761u) % vocab)); });
  {
    std::vector<float> r(vocab);
    for (float& x : r) x = normal(rng);
    for (int k = 0; k < 5; ++k) r[id(rng)] = NAN;
    r[id(rng)] = -0.0f;
    r[id(rng)] = 0.0f;
    r[id(rng)] = 4.0f;
    r[id(rng)] = 4.0f;  // a tie at the top
    rows.emplace_back("nan-zero-top-tie", std::move(r));
  }
  {
    std::vector<float> r(vocab);
    for (float& x : r) x = normal(rng);
    r[id(rng)] = INFINITY;
    r[id(rng)] = INFINITY;
    rows.emplace_back("inf", std::move(r));
  }
  return rows;
}

// Every combination of a grid of temperatures (0 included), top-k, top-p and min-p; `many` takes the
// large grid (1350 combinations), else 24.
inline std::vector<SamplingParams> sampling_params(uint32_t vocab, bool many) {
  std::vector<SamplingParams> out;
  const std::vector<float> temps = many ? std::vector<float>{0.0f, 0.05f, 0.7f, 1.0f, 1.5f, 1e4f} : std::vector<float>{0.0f, 1.0f};
  const std::vector<uint32_t> ks = many ? std::vector<uint32_t>{0, 1, 2, 40, 1000, 5000, vocab - 1, vocab, vocab + 7}
                                        : std::vector<uint32_t>{0, 40, 5000};
  const std::vector<float> ps = many ? std::vector<float>{1.0f, 0.95f, 0.5f, 1e-3f, 0.0f} : std::vector<float>{1.0f, 0.95f};
  const std::vector<float> mins = many ? std::vector<float>{0.0f, 0.05f, 0.5f, 1.0f, 1.5f} : std::vector<float>{0.0f, 0.05f};
  uint64_t seed = 1;
  for (float t : temps) {
    for (uint32_t k : ks) {
      for (float p : ps) {
        for (float m : mins) {
          SamplingParams s;
          s.temperature = t;
          s.top_k = k;
          s.top_p = p;
          s.min_p = m;
          s.seed = seed++ * 0x9e3779b97f4a7c15ull;
          out.push_back(s);
        }
      }
    }
  }
  return out;
}

}  // namespace ferry::model::testing
