#pragma once
// The admin's "memory plan" answer: what the engine knows of its memory. Today that is each stage's
// layers, device and per-slot state (from its state layout) at the configured slots and context.
// This is the hook for the memory planner (issues 11 and 12): it owns weights, expert pools, the host
// expert store and the KV tiers, and fills MemoryPlan::tiers; describe_memory stays the one place
// that assembles the answer.
#include "actors/messages.hpp"
#include "actors/step_planner.hpp"
#include "model/pipeline.hpp"

namespace ferry::actors {

MemoryPlan describe_memory(const model::Pipeline& pipeline, const PlannerLimits& limits);

}  // namespace ferry::actors
