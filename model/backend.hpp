#pragma once
// The stage (backend) interface: what the engine asks of whatever computes the model. The CPU
// reference (model/) and the CUDA backend (gpu/) implement it; the actors drive it. It speaks token
// ids and per-slot sequence state only.
#include <cstdint>
#include <string>
#include <vector>

#include "model/glm5/glm5_hparams.hpp"

namespace ferry::model {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax, ties to the lowest id)
  uint32_t top_k = 0;        // 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;         // with the row's position, fixes the draw: same seed, same tokens
};

// One slot's rows in a step: `tokens` continue that slot's sequence at position `start` (the
// number of tokens the slot already holds). A prefill chunk is many rows; a decode step is one.
struct SlotRows {
  uint32_t slot = 0;
  uint32_t start = 0;
  std::vector<int32_t> tokens;
  bool logits_all = false;  // return logits of every row (evaluation); else of the last row only
  bool sample = true;       // sample a token from the last row's logits
  SamplingParams sampling;
};

struct SlotResult {
  uint32_t slot = 0;
  int32_t sampled = -1;       // the token drawn from the last row, when asked
  std::vector<float> logits;  // rows x vocab (logits_all) or vocab (last row), when asked for
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const Glm5Hparams& hparams() const = 0;
  virtual uint32_t max_slots() const = 0;
  virtual uint32_t max_context() const = 0;
  // Forget a slot's sequence state (its next rows start at position 0).
  virtual void reset_slot(uint32_t slot) = 0;
  // Run one step: every slot's rows through the whole model. Results in the order of `rows`.
  // Throws std::runtime_error only for a backend failure (device error), never for bad ids: the
  // caller validates ids against the vocabulary and positions against max_context first.
  virtual std::vector<SlotResult> step(const std::vector<SlotRows>& rows) = 0;
  virtual std::string describe() const = 0;  // "cpu, 16 threads" / "cuda:0 NVIDIA H200"
};

}  // namespace ferry::model
