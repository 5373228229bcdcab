#pragma once
// The scheduler's side of the prefix cache, a plain class the StepPlanner owns (STYLE rule 4): it keeps
// the kv::PrefixCache index, decides where a prefill stops for a checkpoint, and puts the checkpoint
// drops, saves, spills and restores into the steps, which every stage then carries out on its own
// images (kv::CheckpointStore). A save runs on the stages before the rows of the step that carries it,
// so it captures a slot's state after the steps before; it is queued when the step that made that
// state has landed, and goes out with the next plan. A checkpoint becomes matchable when the step
// carrying its save lands, and is dropped everywhere when that step fails.
//
// Rows: a checkpoint saves only the slot's fixed state; its rows stay the slot's own while the slot
// only appends (invariant: every unspilled checkpoint of a slot is a prefix of what the slot holds).
// Before the planner gives a slot to another sequence (a reset, or a restore that brings other rows)
// the slot's unspilled checkpoints are spilled: its rows copied to host once, shared by them. A slot
// cut back to an earlier checkpoint of its own (the same prompt again, a turn that diverges inside the
// last answer) drops its checkpoints past the cut instead: copying them out would cost the hit what it
// saves. Restoring a checkpoint into the slot that holds its rows moves only the fixed state.
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
  // Restores `m` into `slot` with the next plan (spilling what must be first); the checkpoint is held
  // until that step lands.
  void restore(uint32_t slot, const kv::CheckpointMatch& m);
  // The slot is about to hold another sequence from position 0: its checkpoints' rows are spilled.
  void replace_rows(uint32_t slot);
  // Where a prefill of an n-token prompt now at `at` stops, taking at most `chunk` tokens: at the next
  // checkpoint boundary (a multiple of `every`, or n - 1) when one comes first.
  uint32_t chunk_end(uint32_t at, uint32_t n, uint32_t chunk) const;
  // Whether `tokens` prompt tokens of an n-token prompt is a checkpoint boundary.
  bool boundary(uint32_t tokens, uint32_t n) const;
  // The state of `slot` after `tokens` is to be kept: saved with the next plan.
  void want(uint32_t slot, std::vector<int32_t> tokens);
  // The slot's state is unknown (a failed step): its queued saves and unspilled checkpoints are lost.
  void lost_rows(uint32_t slot);
  // A released slot: its checkpoints are freed too.
  void release_slot(uint32_t slot);

  // Puts the queued drops, saves and restores into `plan`, remembering them for landed().
  void fill(StepPlan& plan);
  // The step carrying them landed (ok: every stage ran it; `unsaved`: saves some stage could not make).
  void landed(uint64_t step, bool ok, std::span<const uint64_t> unsaved = {});

  const kv::PrefixCache& cache() const { return cache_; }

 private:
  struct Carried {
    std::vector<kv::CheckpointId> saves, restores, spills;
  };
  // The slot keeps its rows [0, keep): its unspilled checkpoints past that are spilled or dropped.
  struct RowChange {
    uint32_t slot = 0;
    uint32_t keep = 0;
    bool spill = false;
  };
  void forget_queued(uint32_t slot);
  void erase(kv::CheckpointId id, StepPlan* plan);
  void apply(const RowChange& change, StepPlan& plan, Carried& carried);

  CheckpointLimits limits_;
  kv::PrefixCache cache_;
  std::map<kv::CheckpointId, uint32_t> unspilled_;  // checkpoint -> the slot whose rows it relies on
  std::vector<std::pair<uint32_t, std::vector<int32_t>>> queued_saves_;
  std::vector<RowChange> queued_changes_;
  std::vector<CheckpointOp> queued_restores_;
  std::vector<kv::CheckpointId> queued_drops_;
  std::map<uint64_t, Carried> carried_;  // by step
};

}  // namespace ferry::actors
