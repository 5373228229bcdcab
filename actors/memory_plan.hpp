#pragma once
// The admin's "memory plan" answer: what the engine knows of its memory: each stage's layers, device
// and per-slot state (from its state layout) at the configured slots and context, and the tiers the
// memory planner made (gpu/memory_plan.hpp: the expert pools and the host expert store; the KV tiers
// of issue 12 join them). describe_memory stays the one place that assembles the answer.
#include "actors/messages.hpp"
#include "actors/step_planner.hpp"
#include "model/pipeline.hpp"

namespace ferry::actors {

MemoryPlan describe_memory(const model::Pipeline& pipeline, const PlannerLimits& limits,
                           std::vector<MemoryTier> tiers = {});

}  // namespace ferry::actors
