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
  // Speculative decoding (model/speculative.hpp). The last `verify` tokens are drafts: the last stage
  // draws from each of the last verify + 1 rows (as `sampling` says, each at its own position) and
  // accepts drafts while each equals the draw before it; the rows after the first rejected draft are
  // not kept, and the slot's next rows start at this set's `start` again (every stage keeps the state
  // it had there until then). For a draft that is one token (the MTP's argmax) this is the standard
  // speculative-sampling rule: accepted with probability p(draft), else a draw from p without the
  // draft, renormalised; and the tokens are those plain decoding draws with the same seed.
  uint32_t verify = 0;
  // Tokens for the MTP block to draft after the drawn one (last stage; needs sample and a model with
  // an MTP block on a stage that runs it).
  uint32_t draft = 0;
  bool operator==(const SlotRows&) const = default;
};

struct SlotResult {
  uint32_t slot = 0;
  int32_t sampled = -1;       // the token drawn from the last row, when asked
  std::vector<float> logits;  // rows x vocab (logits_all) or vocab (last row), when asked for
  uint32_t accepted = 0;        // of the row set's `verify` drafts; `sampled` follows the last accepted
  std::vector<int32_t> drafts;  // the MTP block's guesses of the tokens after `sampled`
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
// the tokens the slot holds (or, after a verify row set, that set's start: `restart`, per slot, empty
// or kNoRestart for none), positions inside the context, no more rows than a step takes, token ids
// inside the vocabulary, drafts to verify only behind a real token of a set that draws. The error
// (code invalid_plan) names the slot and the numbers.
inline constexpr uint32_t kNoRestart = ~0u;
Status validate_rows(std::span<const SlotRows> rows, std::span<const uint32_t> held, const RowLimits& limits,
                     std::span<const uint32_t> restart = {});
// The rows of the step in all.
uint32_t total_rows(std::span<const SlotRows> rows);

}  // namespace ferry::model
