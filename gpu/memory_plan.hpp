#pragma once
// The memory plan of a run, made before anything large is allocated: per device, the stages' dense
// weights, their slots' state, their workspace and inbox, with --mtp the MTP block and verify keeps
// (gpu/mtp_sizes.hpp), the margin kept free, and what is left for
// routed experts (a pool per stage, or every expert when they fit: no pool at all); on the host, the
// expert store (the experts no pool holds), its shadow (copies of pooled experts) and the prefix
// cache's checkpoint budget, against the free RAM and the floor that must stay free. A configuration that cannot fit gets one line per problem,
// naming the budget to change and by how much. Works without the devices (`ferry plan
// --device-memory ...`), so a machine can be planned before it is booted.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "config/kv_type.hpp"
#include "config/serve_config.hpp"
#include "gpu/mtp_sizes.hpp"
#include "model/glm5/glm5_hparams.hpp"
#include "model/glm5/glm5_tensors.hpp"
#include "model/stage.hpp"

namespace ferry::gpu {

struct PlanInput {
  model::Glm5Hparams hparams;
  std::function<uint64_t(const model::Glm5TensorSpec&)> tensor_bytes;  // as stored (file or synthetic type)
  std::vector<model::LayerRange> ranges;  // the stages
  std::vector<int> stage_devices;          // device of each stage
  std::vector<uint64_t> device_memory;     // usable bytes of devices 0, 1, ... (free before loading)
  uint64_t host_available = 0;             // RAM the kernel can give (MemAvailable)
  config::MemoryConfig budgets;
  uint32_t slots = 1, context = 1, step_rows = 1;
  config::KvType kv_type = config::KvType::int8;  // the DSA latent rows on the device
  uint64_t checkpoint_bytes = 0;           // host RAM the prefix cache may take (--checkpoint-budget)
  // Device latent rows per DSA layer and slot (0: the whole context); unset: the plan chooses, every
  // row when they fit (plan_memory), else kDefaultKvResident.
  std::optional<uint32_t> kv_resident;
  std::optional<uint64_t> kv_host_budget;  // --kv-host-budget (unset: the tier's need, within the RAM floor)
  bool mtp = false;                        // --mtp on: the MTP block on the last stage, a verify keep on each
};

// The window of latent rows kept on the device when not every slot's whole context fits there.
constexpr uint32_t kDefaultKvResident = 32768;

struct StagePlan {
  model::LayerRange layers;
  int device = 0;
  uint64_t dense_bytes = 0;    // every weight but the routed experts
  uint64_t expert_bytes = 0;   // all routed experts of its layers
  uint32_t moe_layers = 0;
  uint64_t state_bytes = 0, workspace_bytes = 0, inbox_bytes = 0;
  uint64_t kv_bytes = 0;       // of state_bytes, the DSA rows of every slot (latents, indexer rows, pool keys)
  uint64_t host_kv_bytes = 0;  // the pinned host KV tier: every slot's latent rows, when past the window
  bool resident = true;        // every expert on the device, stacked as in the file
  uint32_t pool_slots = 0;     // when not resident: expert slots in the device pool
  uint64_t staging_bytes = 0;  // when not resident: the prefill upload buffers
  MtpBytes mtp;                // with --mtp and an MTP block: the keep on each stage, the rest on the last
};

struct DevicePlan {
  int device = 0;
  uint64_t memory = 0, dense = 0, experts = 0, state = 0, workspace = 0, margin = 0;
  uint64_t mtp = 0;  // its stages' MtpBytes, in all
  uint64_t free() const;
};

struct HostPlan {
  uint64_t available = 0;
  uint32_t store_slots = 0;    // host slots: every expert no pool holds, plus the shadow
  uint64_t store_bytes = 0;    // of which the experts no pool holds
  uint64_t shadow_bytes = 0;
  uint64_t checkpoint_bytes = 0;  // the prefix cache's budget
  uint64_t kv_bytes = 0;          // the stages' host KV tiers
  std::optional<uint64_t> kv_budget;  // --kv-host-budget
  uint64_t floor = 0;
};

struct MemoryPlan {
  config::KvType kv_type = config::KvType::int8;
  uint32_t kv_resident = 0;        // 0 or >= context: every latent row on the device
  bool kv_resident_given = false;  // --kv-resident N; else the plan chose it
  std::string kv_resident_why;     // why this many (a phrase for the plan's KV line and the start log)
  uint32_t context = 0, slots = 0;
  uint64_t kv_table_bytes = 0;     // of the stages' state: the resident window's planner tables
  uint64_t expert_slot_bytes = 0;  // the largest expert (gate + up + down) of the model
  uint32_t experts_total = 0;      // routed experts of the model
  bool mtp_requested = false;      // --mtp on
  bool mtp_block = false;          // the model has an MTP block (else --mtp has no effect here)
  std::vector<StagePlan> stages;
  std::vector<DevicePlan> devices;
  HostPlan host;
  std::vector<std::string> problems;  // empty: the plan fits

  bool tiered() const;  // some stage keeps its experts in a pool
};

// Without --kv-resident: every slot's DSA rows at --ctx on the device when, with them there, every
// device still holds what the windowed plan gives it (weights, the same experts or pool, the rest)
// and nothing else is short; else the window of kDefaultKvResident rows.
MemoryPlan plan_memory(const PlanInput& input);
// "--kv-resident N (why)": which was chosen and why, for a start log.
std::string kv_resident_line(const MemoryPlan& plan);
// A table for people, and JSON for scripts.
std::string format_plan(const MemoryPlan& plan);
std::string plan_json(const MemoryPlan& plan);

}  // namespace ferry::gpu
