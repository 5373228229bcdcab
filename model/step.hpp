#pragma once
// What one step asks of the model, in the engine's words: each slot's new rows (token ids continuing
// its sequence) and what to return for them. Every stage of a pipeline sees the same rows; stage 0
// reads their token ids, the others only their slots and positions. The rows are checked once, by
// validate_rows, for every stage on every backend.
#include <cstdint>
#include <span>
#include <vector>

#include "config/expected.hpp"

namespace ferry::model {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax, ties to the lowest id)
  uint32_t top_k = 0;        // 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;         // with the row's position, fixes the draw: same seed, same tokens
  bool operator==(const SamplingParams&) const = default;
};

// One slot's rows in a step: `tokens` continue that slot's sequence at position `start` (the
// number of tokens the slot already holds; 0 starts it over). A prefill chunk is many rows; a
// decode step is one.
struct SlotRows {
  uint32_t slot = 0;
  uint32_t start = 0;
  std::vector<int32_t> tokens;
  bool logits_all = false;  // return logits of every row (evaluation); else of the last row only
  bool sample = true;       // sample a token from the last row's logits
  SamplingParams sampling;
  bool operator==(const SlotRows&) const = default;
};

struct SlotResult {
  uint32_t slot = 0;
  int32_t sampled = -1;       // the token drawn from the last row, when asked
  std::vector<float> logits;  // rows x vocab (logits_all) or vocab (last row), when asked for
};

// Logits a row set returns: every row with logits_all, else the last row when it does not sample.
inline bool returns_logits(const SlotRows& r) { return r.logits_all || !r.sample; }

struct RowLimits {
  uint32_t slots = 0;         // slot ids are below this
  uint32_t context = 0;       // positions are below this
  uint32_t step_rows = 0;     // rows of one step at most
  uint32_t vocab = 0;         // token ids below this (0: not checked, for stages that do not embed)
};

// The rows of one step against the slots' held token counts: a known slot at most once, start 0 or
// the tokens the slot holds, positions inside the context, no more rows than a step takes, token
// ids inside the vocabulary. The error (code invalid_plan) names the slot and the numbers.
Status validate_rows(std::span<const SlotRows> rows, std::span<const uint32_t> held, const RowLimits& limits);
// The rows of the step in all.
uint32_t total_rows(std::span<const SlotRows> rows);

}  // namespace ferry::model
