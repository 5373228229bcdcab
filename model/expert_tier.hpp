#pragma once
// Where a stage's routed experts live when its device cannot hold them all: a pool of expert slots on
// the device and the host expert store (pinned RAM every device can read). The stage reads the
// residency it has and handles a miss itself inside a step (it reads the expert from host memory, or
// uploads it for a prefill chunk); what to move between the tiers is decided between steps by the
// expert-cache actor's policy, from the route counts the stages report. These are the words both
// sides use; a stage without tiers (every expert resident, or the CPU) has no ExpertTier.
#include <cstdint>
#include <string>
#include <vector>

namespace ferry::model {

// Routes per expert of each of a stage's MoE layers since the last report: counts[i * experts + e]
// for the stage's i-th MoE layer.
struct RouteCounts {
  std::vector<uint32_t> layers;  // the MoE layers, in order
  uint32_t experts = 0;
  std::vector<uint32_t> counts;
};

// An expert of the model: its block index and its number in that block.
struct ExpertId {
  uint32_t layer = 0;
  uint32_t expert = 0;
  bool operator==(const ExpertId&) const = default;
};

// One swap in a stage's pool: `promote` takes the pool slot of `evict` (any two MoE layers of the
// stage: slots are all the size of the largest expert). The promoted expert is uploaded from its host
// copy at `promote_host`, which stays (a shadow) until the store takes the slot back; the evicted one
// is read from its host copy at `evict_host` from then on, which the stage first writes there when
// `copy_evicted` (the expert had no host copy).
struct ExpertMove {
  ExpertId promote;
  uint32_t promote_host = 0;
  ExpertId evict;
  uint32_t evict_host = 0;
  bool copy_evicted = false;
};

struct ExpertTierCounters {
  uint64_t routes = 0;             // (row, expert) pairs routed
  uint64_t hits = 0;               // of them, to an expert in the pool
  uint64_t misses_mapped = 0;      // to an expert read from host memory by the kernels
  uint64_t misses_uploaded = 0;    // to an expert uploaded for a prefill chunk
  uint64_t bytes_mapped = 0;       // read over PCIe by the kernels (an estimate: bytes of the missed experts)
  uint64_t bytes_uploaded = 0;     // copied to the device for prefill chunks
  uint64_t promotions = 0;
  uint64_t evictions = 0;
  uint32_t pool_slots = 0;
  uint32_t pool_used = 0;        // slots holding an expert (a swap empties one between its two halves)
  uint32_t swaps_in_flight = 0;  // started, their table updates not all run yet
  bool operator==(const ExpertTierCounters&) const = default;
};

class ExpertTier {
 public:
  virtual ~ExpertTier() = default;
  // Takes the counts since the last call and the moves finished since then.
  virtual RouteCounts take_route_counts() = 0;
  // Moves whose table updates have run on the device: nothing reads the old places any more.
  virtual std::vector<ExpertMove> take_finished_moves() = 0;
  // Starts moves; they finish over the next steps without stalling them.
  virtual void start_moves(const std::vector<ExpertMove>& moves) = 0;
  virtual ExpertTierCounters counters() const = 0;
  // The experts in the pool now, per MoE layer of the stage (for the policy's first picture).
  virtual std::vector<std::vector<uint32_t>> pooled() const = 0;
};

}  // namespace ferry::model
