#pragma once
// `ferry bench --slots N`: N requests decoding at once through the server's own engine (the scheduler
// and one actor per stage, pipelined as `ferry serve` runs them), each prefilled to the same depth
// first. Reports each slot's decode rate and the aggregate over the window in which all of them
// decode (the first user's "C3 over the same overlap window").
#include <cstdint>
#include <memory>
#include <vector>

#include "config/expected.hpp"
#include "config/stage_split.hpp"
#include "gpu/backend_factory.hpp"

namespace ferry::cli {

struct SlotsBench {
  uint32_t slots = 3;
  uint32_t depth = 0;         // prompt tokens of each request (at least 1)
  uint32_t warmup = 16;       // decode tokens of each request before its window
  uint32_t tokens = 128;      // decode tokens in each request's window
  uint32_t prefill_chunk = 4096;
  uint32_t micro_batches = 0;  // 0: one per device in use
  config::StageSplit split;
  uint64_t seed = 1;
};

struct SlotsResult {
  std::vector<double> per_slot_tps;  // each request's window
  double aggregate_tps = 0;          // tokens of all requests inside the overlap window, per second
  double overlap_s = 0;
  uint32_t micro_batches = 0;
};

// Runs the engine on the model's stages (shared with the caller, which must not step them meanwhile).
Expected<SlotsResult> bench_slots(const gpu::OpenedModel& model, const SlotsBench& bench);

}  // namespace ferry::cli
