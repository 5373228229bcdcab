#pragma once
// The expert-cache policy as plain code (STYLE rule 4): which routed experts each stage's device pool
// holds, and which host slots hold copies. It learns from route counts (decaying, per expert), places
// the experts at start (warm: from counts saved by an earlier run; cold: spread evenly over the
// layers), and between steps proposes swaps — the most routed expert outside a pool takes the slot of
// the least routed one inside, only when it is routed more by a margin (so that pools do not thrash),
// a few per step (so that uploads never crowd out a step). An evicted expert keeps being read from its
// host copy: one that has none gets a free host slot, taken if need be from the least recently pooled
// shadow copy. No threads, no devices: the expert-cache actor owns one and tests drive it directly.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "config/expected.hpp"
#include "model/expert_tier.hpp"

namespace ferry::model {

struct ExpertPolicyOptions {
  double decay = 0.98;        // each report multiplies the past counts by this (~50 steps of memory)
  double margin = 0.25;       // a candidate must be routed this much more than the expert it evicts
  double min_score = 2.0;     // ... and at least this much (a one-off route moves nothing)
  uint32_t moves_per_report = 4;  // per stage
};

// Where every expert is at start, per stage.
struct ExpertPlacement {
  std::vector<std::vector<ExpertId>> pooled;  // per stage: the experts in its pool, slot order
  std::vector<int64_t> host_slot;             // per expert (index layer * experts + e): its host copy, -1 none
};

class ExpertPolicy {
 public:
  // `stage_layers`: the MoE layers of each pooled stage; `pool_slots`: each one's pool; `host_slots`:
  // the store's slots, at least every expert no pool holds plus one. `n_layers` bounds layer ids.
  ExpertPolicy(uint32_t n_layers, uint32_t experts, std::vector<std::vector<uint32_t>> stage_layers,
               std::vector<uint32_t> pool_slots, uint32_t host_slots, ExpertPolicyOptions options = {});

  // Counts of an earlier run (save_counts), for the first placement and the first decisions.
  Status load_counts(const std::filesystem::path& file);
  Status save_counts(const std::filesystem::path& file) const;

  // The first placement: each pool the most routed experts of its layers (an even spread when nothing
  // is known), every other expert in a host slot, and the remaining host slots holding copies of the
  // pooled experts least likely to stay (the shadow).
  ExpertPlacement place();

  // The stage's routes since its last report, and the moves it finished.
  void observe(uint32_t stage, const RouteCounts& counts);
  void finished(uint32_t stage, const std::vector<ExpertMove>& moves);
  // Swaps worth making now for the stage (none while its earlier ones are unfinished).
  std::vector<ExpertMove> propose(uint32_t stage);

  double score(ExpertId id) const { return score_[index(id)]; }
  bool pooled(ExpertId id) const { return pool_of_[index(id)] >= 0; }
  int64_t host_slot(ExpertId id) const { return host_of_[index(id)]; }
  uint32_t free_host_slots() const { return static_cast<uint32_t>(free_host_.size()); }

 private:
  size_t index(ExpertId id) const { return size_t{id.layer} * experts_ + id.expert; }
  ExpertId id_of(size_t i) const { return {static_cast<uint32_t>(i / experts_), static_cast<uint32_t>(i % experts_)}; }
  std::optional<int64_t> take_host_slot(const std::vector<ExpertMove>& planned);

  uint32_t n_layers_, experts_;
  std::vector<std::vector<uint32_t>> stage_layers_;
  std::vector<uint32_t> pool_slots_;
  uint32_t host_slots_;
  ExpertPolicyOptions opt_;
  std::vector<double> score_;
  std::vector<int32_t> pool_of_;   // per expert: its stage's pool, -1 none
  std::vector<int64_t> host_of_;   // per expert: its host slot, -1 none
  std::vector<uint64_t> pooled_at_;  // per expert: when it last entered a pool (shadow copies go oldest first)
  std::vector<int64_t> free_host_;
  std::vector<uint32_t> moving_;   // per stage: moves out, not finished
  uint64_t clock_ = 0;
};

}  // namespace ferry::model
