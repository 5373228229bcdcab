#pragma once
// The scheduler's side of the prefix cache, a plain class the StepPlanner owns (STYLE rule 4): it keeps
// the kv::PrefixCache index, decides where a prefill stops for a checkpoint, and puts the checkpoint
// drops, saves and restores into the steps, which every stage then carries out on its own images
// (kv::CheckpointStore). A save runs on the stages before the rows of the step that carries it, so it
// captures a slot's state after the steps before; it is queued when the step that made that state has
// landed, and goes out with the next plan. A checkpoint becomes matchable when the step carrying its save
// lands, and is dropped everywhere when that step fails.
//
// Checkpoints are taken (for requests that allow reuse) every `every` prompt tokens, one token before
// the prompt's end (the same prompt again then computes only its last token), and at the end of
// generation (the next turn, which appends the answer, resumes there).
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "actors/messages.hpp"
#include "kv/prefix_cache.hpp"

namespace ferry::actors {

struct CheckpointLimits {
  uint64_t budget_bytes = 0;   // 0: no checkpoints (the prefix cache keeps only what slots hold)
  uint32_t every = 4096;       // prompt tokens between checkpoints of a long prefill
  uint32_t block_tokens = 64;  // the hash chain's block; also the shortest prefix worth a checkpoint
  uint64_t fixed_bytes = 0;    // a checkpoint of T tokens, over all stages: fixed_bytes + T * token_bytes
  uint64_t token_bytes = 0;
};

class CheckpointPlanner {
 public:
  explicit CheckpointPlanner(CheckpointLimits limits);

  bool enabled() const { return limits_.budget_bytes > 0; }
  // The longest ready checkpoint that leaves at least one prompt token to compute.
  std::optional<kv::CheckpointMatch> match(std::span<const int32_t> prompt) const;
  // Restores `m` into `slot` with the next plan; the checkpoint is held until that step lands.
  void restore(uint32_t slot, const kv::CheckpointMatch& m);
  // Where a prefill of an n-token prompt now at `at` stops, taking at most `chunk` tokens: at the next
  // checkpoint boundary (a multiple of `every`, or n - 1) when one comes first.
  uint32_t chunk_end(uint32_t at, uint32_t n, uint32_t chunk) const;
  // Whether `tokens` prompt tokens of an n-token prompt is a checkpoint boundary.
  bool boundary(uint32_t tokens, uint32_t n) const;
  // The state of `slot` after `tokens` is to be kept: saved with the next plan.
  void want(uint32_t slot, std::vector<int32_t> tokens);
  // The slot's state is unknown (a failed step) or gone: its queued saves are forgotten.
  void forget_queued(uint32_t slot);
  // A released slot: its checkpoints are freed too.
  void release_slot(uint32_t slot);

  // Puts the queued drops, saves and restores into `plan`, remembering them for landed().
  void fill(StepPlan& plan);
  void landed(uint64_t step, bool ok);

  const kv::PrefixCache& cache() const { return cache_; }

 private:
  struct Carried {
    std::vector<kv::CheckpointId> saves, restores;
  };
  CheckpointLimits limits_;
  kv::PrefixCache cache_;
  std::vector<std::pair<uint32_t, std::vector<int32_t>>> queued_saves_;
  std::vector<CheckpointOp> queued_restores_;
  std::vector<kv::CheckpointId> queued_drops_;
  std::map<uint64_t, Carried> carried_;  // by step
};

}  // namespace ferry::actors
