#include "actors/memory_plan.hpp"

namespace ferry::actors {

MemoryPlan describe_memory(const model::Pipeline& pipeline, const PlannerLimits& limits,
                           std::vector<MemoryTier> tiers) {
  MemoryPlan plan;
  plan.tiers = std::move(tiers);
  plan.slots = limits.slots;
  plan.ctx = limits.ctx;
  const auto& stages = pipeline.stages();
  for (size_t i = 0; i < stages.size(); ++i) {
    const model::Stage& stage = *stages[i];
    const model::SlotStateLayout& layout = stage.state_layout();
    StageMemory m;
    m.index = static_cast<uint32_t>(i);
    m.layers = model::describe_layers(stage.layers());
    m.backend = stage.describe();
    m.slot_fixed_bytes = layout.image_floats(0, 0, false) * sizeof(float);
    m.slot_bytes_at_ctx = layout.image_floats(limits.ctx, limits.ctx, true) * sizeof(float);
    m.slot_bytes_per_token = limits.ctx > 0 ? (m.slot_bytes_at_ctx - m.slot_fixed_bytes) / limits.ctx : 0;
    m.slots_bytes_at_ctx = m.slot_bytes_at_ctx * limits.slots;
    plan.stages.push_back(std::move(m));
  }
  plan.note =
      "per-slot state from each stage's layout, as f32 images (what a checkpoint of the slot holds); the tiers "
      "are the expert pools and the host expert store of the memory plan (none when every expert is resident); "
      "KV tiers are not planned yet (issue 12)";
  return plan;
}

}  // namespace ferry::actors
