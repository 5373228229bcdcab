#include "gpu/memory_plan.hpp"

#include <algorithm>
#include <cstdio>
#include <map>

#include <boost/json.hpp>

#include "config/byte_size.hpp"
#include "gpu/stage_sizes.hpp"

namespace ferry::gpu {
namespace {

using config::format_byte_size;
using T = model::Glm5Tensor;

bool routed(T role) { return role == T::ffn_gate_exps || role == T::ffn_up_exps || role == T::ffn_down_exps; }

uint64_t saturating_sub(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

}  // namespace

uint64_t DevicePlan::free() const { return saturating_sub(memory, dense + experts + state + workspace + margin + mtp); }

bool MemoryPlan::tiered() const {
  return std::any_of(stages.begin(), stages.end(), [](const StagePlan& s) { return !s.resident; });
}

namespace {

// The plan with `kv_resident` rows per DSA layer and slot on the device.
MemoryPlan plan_with(const PlanInput& in, uint32_t kv_resident) {
  const model::Glm5Hparams& hp = in.hparams;
  const config::MemoryConfig& b = in.budgets;
  MemoryPlan plan;
  plan.kv_type = in.kv_type;
  plan.kv_resident = kv_resident;
  plan.context = in.context;
  plan.slots = in.slots;
  plan.mtp_requested = in.mtp;
  plan.mtp_block = hp.n_nextn_layers > 0;
  // Per stage: what it must hold whatever happens to the experts.
  for (size_t i = 0; i < in.ranges.size(); ++i) {
    StagePlan s;
    s.layers = in.ranges[i];
    s.device = in.stage_devices.at(i);
    const bool first = s.layers.first == 0, last = s.layers.end == hp.n_layers;
    for (const model::Glm5TensorSpec& t : model::glm5_global_tensors(hp)) {
      if ((t.role == T::token_embd && first) || (t.role != T::token_embd && last)) s.dense_bytes += in.tensor_bytes(t);
    }
    for (uint32_t l = s.layers.first; l < s.layers.end; ++l) {
      uint64_t experts = 0;
      for (const model::Glm5TensorSpec& t : model::glm5_layer_tensors(hp, l)) {
        (routed(t.role) ? experts : s.dense_bytes) += in.tensor_bytes(t);
      }
      if (experts > 0) {
        ++s.moe_layers;
        s.expert_bytes += experts;
        plan.expert_slot_bytes = std::max(plan.expert_slot_bytes, experts / hp.n_experts);
      }
    }
    plan.experts_total += s.moe_layers * hp.n_experts;
    s.state_bytes = stage_state_bytes(hp, s.layers, in.slots, in.context, in.kv_type, kv_resident, in.step_rows);
    s.kv_bytes = s.state_bytes - stage_state_bytes(hp, s.layers, in.slots, 0, in.kv_type);
    s.host_kv_bytes = kv_host_tier_bytes(hp, s.layers, in.slots, in.context, in.kv_type, kv_resident);
    plan.host.kv_bytes += s.host_kv_bytes;
    plan.kv_table_bytes += kv_window_table_bytes(hp, s.layers, in.slots, in.context, kv_resident);
    s.workspace_bytes = stage_workspace_bytes(hp, s.layers, in.step_rows, in.context);
    s.inbox_bytes = first ? 0 : stage_inbox_bytes(hp, in.step_rows);
    if (in.mtp && plan.mtp_block) {
      if (last) s.mtp = mtp_stage_bytes(hp, in.tensor_bytes, s.layers, in.slots, in.context, in.step_rows, in.kv_type);
      else s.mtp.keep = verify_keep_bytes(hp, s.layers, in.slots);
    }
    plan.stages.push_back(s);
  }

  // Per device: what is left for experts, then resident or a pool of that many slots.
  std::map<int, std::vector<size_t>> on_device;
  for (size_t i = 0; i < plan.stages.size(); ++i) on_device[plan.stages[i].device].push_back(i);
  size_t device_index = 0;
  for (auto& [device, members] : on_device) {
    DevicePlan d;
    d.device = device;
    d.memory = device < static_cast<int>(in.device_memory.size()) ? in.device_memory[static_cast<size_t>(device)] : 0;
    d.margin = b.device_margin;
    uint64_t experts = 0;
    uint32_t moe_layers = 0;
    for (size_t i : members) {
      const StagePlan& s = plan.stages[i];
      d.dense += s.dense_bytes;
      d.state += s.state_bytes;
      d.workspace += s.workspace_bytes + s.inbox_bytes;
      d.mtp += s.mtp.total();
      experts += s.expert_bytes;
      moe_layers += s.moe_layers;
    }
    const uint64_t fixed = d.dense + d.state + d.workspace + d.mtp + d.margin;
    const std::string name = "device " + std::to_string(device);
    if (fixed > d.memory) {
      const std::string mtp = d.mtp == 0 ? "" : ", the MTP block (" + format_byte_size(d.mtp) + ", --mtp)";
      plan.problems.push_back(name + " needs " + format_byte_size(fixed) + " for its dense weights (" +
                              format_byte_size(d.dense) + "), slot state (" + format_byte_size(d.state) +
                              "), workspace (" + format_byte_size(d.workspace) + ")" + mtp + " with the " +
                              format_byte_size(d.margin) + " margin, and has " + format_byte_size(d.memory) +
                              ": lower --ctx or --slots" + (d.mtp == 0 ? "" : ", turn --mtp off") +
                              ", or split the layers over more devices (short by " +
                              format_byte_size(fixed - d.memory) + ")");
    }
    const uint64_t room = saturating_sub(d.memory, fixed);
    const bool capped = !b.expert_pool_caps.empty();
    const uint64_t cap = !capped ? room
                         : b.expert_pool_caps.size() == 1 ? b.expert_pool_caps[0]
                         : device_index < b.expert_pool_caps.size() ? b.expert_pool_caps[device_index]
                                                                    : 0;
    if (capped && b.expert_pool_caps.size() != 1 && device_index >= b.expert_pool_caps.size()) {
      plan.problems.push_back("--expert-pool-cap names " + std::to_string(b.expert_pool_caps.size()) +
                              " devices; the stages use more: give one size per device, or one for all");
    }
    if (capped && cap > room) {
      plan.problems.push_back("--expert-pool-cap " + format_byte_size(cap) + " for " + name + " is larger than the " +
                              format_byte_size(room) + " it has left after its dense weights, state and workspace: "
                              "lower it by " + format_byte_size(cap - room));
    }
    if (cap >= experts || moe_layers == 0) {
      d.experts = experts;
    } else {
      // A pool per stage, in proportion to its MoE layers; each stage's prefill staging buffers come
      // from what the device has beyond the pools.
      uint64_t staging = 0;
      for (size_t i : members) {
        StagePlan& s = plan.stages[i];
        if (s.moe_layers == 0) continue;
        s.resident = false;
        s.staging_bytes = std::min<uint64_t>(b.prefill_staging, 2 * s.expert_bytes / s.moe_layers);
        staging += s.staging_bytes;
      }
      const uint64_t pools = std::min(cap, saturating_sub(room, staging));
      if (capped && cap + staging > room && cap <= room) {
        plan.problems.push_back("--expert-pool-cap " + format_byte_size(cap) + " for " + name + " leaves no room for the " +
                                format_byte_size(staging) + " of prefill staging (--prefill-staging): lower one of them by " +
                                format_byte_size(cap + staging - room));
      }
      for (size_t i : members) {
        StagePlan& s = plan.stages[i];
        if (s.resident) continue;
        const uint64_t slots = pools * s.moe_layers / moe_layers / std::max<uint64_t>(1, plan.expert_slot_bytes);
        s.pool_slots = static_cast<uint32_t>(std::min<uint64_t>(slots, uint64_t{s.moe_layers} * hp.n_experts));
        d.experts += s.pool_slots * plan.expert_slot_bytes + s.staging_bytes;
      }
    }
    plan.devices.push_back(d);
    ++device_index;
  }

  // The host: every expert no pool holds, plus the shadow, and the prefix cache's checkpoints; within
  // the budgets and above the floor.
  HostPlan& h = plan.host;
  h.available = in.host_available;
  h.floor = b.ram_floor;
  h.checkpoint_bytes = in.checkpoint_bytes;
  h.kv_budget = in.kv_host_budget;
  if (h.kv_budget && h.kv_bytes > *h.kv_budget) {
    plan.problems.push_back("the host KV tier needs " + format_byte_size(h.kv_bytes) + " for " +
                            std::to_string(in.slots) + " slots of " + std::to_string(in.context) + " tokens in " +
                            std::string(config::kv_type_name(in.kv_type)) + ", more than --kv-host-budget " +
                            format_byte_size(*h.kv_budget) + ": raise it to at least that, or lower --ctx or --slots");
  }
  if (plan.tiered()) {
    uint64_t beyond = 0, pooled = 0;
    for (const StagePlan& s : plan.stages) {
      if (s.resident) continue;
      beyond += uint64_t{s.moe_layers} * hp.n_experts - s.pool_slots;
      pooled += s.pool_slots;
    }
    const uint64_t slot = plan.expert_slot_bytes;
    // Shadow copies are of pooled experts; one slot more is where the first eviction goes.
    const uint64_t shadow_slots = std::clamp<uint64_t>(b.expert_shadow / slot, 1, pooled + 1);
    h.store_bytes = beyond * slot;
    h.shadow_bytes = shadow_slots * slot;
    h.store_slots = static_cast<uint32_t>(beyond + shadow_slots);
    if (b.host_expert_budget && h.store_bytes > *b.host_expert_budget) {
      plan.problems.push_back("the experts the device pools do not hold need " + format_byte_size(h.store_bytes) +
                              " of host memory, more than --host-expert-budget " +
                              format_byte_size(*b.host_expert_budget) + ": raise it by " +
                              format_byte_size(h.store_bytes - *b.host_expert_budget) +
                              ", or give the pools more (--expert-pool-cap)");
    }
  }
  const uint64_t used = h.store_bytes + h.shadow_bytes + h.checkpoint_bytes + h.kv_bytes;
  if (used > 0 && used + h.floor > h.available) {
    std::string what = "the prefix cache's --checkpoint-budget (" + format_byte_size(h.checkpoint_bytes) + ")";
    if (h.kv_bytes > 0) what = "the host KV tier (" + format_byte_size(h.kv_bytes) + ") and " + what;
    std::string lower = h.kv_bytes > 0 ? "lower --ctx, --slots, --checkpoint-budget or --ram-floor"
                                       : "lower --checkpoint-budget or --ram-floor";
    if (plan.tiered()) {
      what = "the host expert store (" + format_byte_size(h.store_bytes) + "), its shadow (" +
             format_byte_size(h.shadow_bytes) + ") and " + what;
      lower = "lower --expert-shadow, --checkpoint-budget or --ram-floor, or give the pools more,";
    }
    plan.problems.push_back(what + (plan.tiered() || h.kv_bytes > 0 ? " leave" : " leaves") + " less than --ram-floor " + format_byte_size(h.floor) + " of the " +
                            format_byte_size(h.available) + " of RAM available: " + lower + " by " +
                            format_byte_size(used + h.floor - h.available));
  }
  return plan;
}

// Device bytes the plan gives a device's DSA rows beyond the windowed plan's, and what stops them.
std::string short_of(const MemoryPlan& all, const MemoryPlan& windowed) {
  for (size_t i = 0; i < all.devices.size() && i < windowed.devices.size(); ++i) {
    const DevicePlan &a = all.devices[i], &w = windowed.devices[i];
    if (a.experts == w.experts && a.dense + a.state + a.workspace + a.mtp + a.margin <= a.memory) continue;
    const bool pooled = std::any_of(windowed.stages.begin(), windowed.stages.end(),
                                    [&](const StagePlan& s) { return s.device == w.device && !s.resident; });
    return "every slot's DSA rows at --ctx " + std::to_string(all.context) + " need " +
           format_byte_size(a.state - w.state) + " more on device " + std::to_string(a.device) + ", which has " +
           format_byte_size(w.free()) + " free after the weights, " +
           (pooled ? "the expert pool" : "the experts") + " and the rest";
  }
  return all.problems.empty() ? std::string() : "with every row on the device: " + all.problems.front();
}

}  // namespace

MemoryPlan plan_memory(const PlanInput& in) {
  if (in.kv_resident) {
    MemoryPlan p = plan_with(in, *in.kv_resident);
    p.kv_resident_given = true;
    p.kv_resident_why = "given";
    return p;
  }
  MemoryPlan windowed = plan_with(in, kDefaultKvResident);
  if (in.context <= kDefaultKvResident) {
    windowed.kv_resident = 0;  // the same plan: the window holds the whole context
    windowed.kv_resident_why = "chosen by the plan: --ctx " + std::to_string(in.context) + " is within the window";
    return windowed;
  }
  MemoryPlan all = plan_with(in, 0);
  const std::string why_not = short_of(all, windowed);
  if (!why_not.empty()) {
    windowed.kv_resident_why = "chosen by the plan: " + why_not;
    return windowed;
  }
  uint64_t kv = 0;
  for (const StagePlan& s : all.stages) kv += s.kv_bytes;
  all.kv_resident_why = "chosen by the plan: every slot's DSA rows at --ctx " + std::to_string(in.context) + " (" +
                        format_byte_size(kv) + ") fit on the devices beside the weights, the experts and the rest";
  return all;
}

std::string kv_resident_line(const MemoryPlan& p) {
  return "--kv-resident " + std::to_string(p.kv_resident) + (p.kv_resident == 0 ? " (every row on the device, " : " (") +
         p.kv_resident_why + ")";
}

std::string format_plan(const MemoryPlan& p) {
  std::string out;
  char line[1024];
  auto gib = [](uint64_t b) { return static_cast<double>(b) / 1073741824.0; };
  const bool mtp = p.mtp_requested && p.mtp_block;  // an MTP column only then: without it the table is as before
  out += mtp ? "| device | memory | dense | experts | state | workspace | MTP | margin | free |\n"
               "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
             : "| device | memory | dense | experts | state | workspace | margin | free |\n"
               "| --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (const DevicePlan& d : p.devices) {
    char mtp_cell[32] = "";
    if (mtp) std::snprintf(mtp_cell, sizeof mtp_cell, " %.2f GiB |", gib(d.mtp));
    std::snprintf(line, sizeof line, "| %d | %.2f GiB | %.2f GiB | %.2f GiB | %.2f GiB | %.2f GiB |%s %.2f GiB | %.2f GiB |\n",
                  d.device, gib(d.memory), gib(d.dense), gib(d.experts), gib(d.state), gib(d.workspace), mtp_cell,
                  gib(d.margin), gib(d.free()));
    out += line;
  }
  out += "\n| stage | layers | device | experts | pool slots | staging | device KV |\n| --- | --- | --- | --- | --- | --- | --- |\n";
  for (size_t i = 0; i < p.stages.size(); ++i) {
    const StagePlan& s = p.stages[i];
    std::snprintf(line, sizeof line, "| %zu | %s | %d | %s | %s | %.2f GiB | %.2f GiB |\n", i,
                  model::describe_layers(s.layers).c_str(), s.device, s.resident ? "all on the device" : "pooled",
                  s.resident ? "-" : std::to_string(s.pool_slots).c_str(), gib(s.staging_bytes), gib(s.kv_bytes));
    out += line;
  }
  if (p.host.kv_bytes > 0) {
    std::snprintf(line, sizeof line,
                  "\nKV: latent rows %s; %u rows per DSA layer and slot resident on the device (--kv-resident, %s), "
                  "every slot's %u in the host KV tier: %.2f GiB pinned (%s); the indexer's pool keys stay on the device, "
                  "its per-token keys and gates in a ring of a step's rows, and the window's position tables (4 B a token "
                  "and DSA layer): %.2f GiB of state\n",
                  std::string(config::kv_type_name(p.kv_type)).c_str(), p.kv_resident, p.kv_resident_why.c_str(),
                  p.context, gib(p.host.kv_bytes),
                  p.host.kv_budget ? ("--kv-host-budget " + format_byte_size(*p.host.kv_budget)).c_str()
                                   : "no --kv-host-budget: counted against the RAM floor",
                  gib(p.kv_table_bytes));
  } else {
    std::snprintf(line, sizeof line,
                  "\nKV: latent rows %s, every slot's whole context on the device (in state; --kv-resident %u, %s)\n",
                  std::string(config::kv_type_name(p.kv_type)).c_str(), p.kv_resident, p.kv_resident_why.c_str());
  }
  out += line;
  std::snprintf(line, sizeof line,
                "expert: %.2f MiB (largest gate + up + down), %u routed experts in all\n"
                "host: expert store %.2f GiB (%u slots with the shadow of %.2f GiB), checkpoints %.2f GiB, "
                "host KV %.2f GiB, RAM available %.2f GiB, floor %.2f GiB\n",
                static_cast<double>(p.expert_slot_bytes) / 1048576.0,
                p.experts_total, gib(p.host.store_bytes),
                p.host.store_slots, gib(p.host.shadow_bytes), gib(p.host.checkpoint_bytes), gib(p.host.kv_bytes), gib(p.host.available),
                gib(p.host.floor));
  out += line;
  if (mtp) {
    for (size_t i = 0; i < p.stages.size(); ++i) {
      const MtpBytes& m = p.stages[i].mtp;
      if (m.weights > 0) {
        std::snprintf(line, sizeof line,
                      "MTP block (stage %zu, device %d): weights %.2f GiB (its routed experts all resident), "
                      "state %.2f GiB, keep %.2f GiB, workspace %.2f GiB: %.2f GiB in all\n",
                      i, p.stages[i].device, gib(m.weights), gib(m.state), gib(m.keep), gib(m.workspace), gib(m.total()));
      } else {
        std::snprintf(line, sizeof line, "MTP verify keep (stage %zu, device %d): %.2f GiB\n", i, p.stages[i].device,
                      gib(m.keep));
      }
      out += line;
    }
  } else if (p.mtp_requested) {
    out += "MTP: the model has no MTP block: --mtp has no effect\n";
  }
  for (const std::string& problem : p.problems) out += "problem: " + problem + "\n";
  return out;
}

std::string plan_json(const MemoryPlan& p) {
  namespace bj = boost::json;
  bj::array devices, stages, problems;
  for (const DevicePlan& d : p.devices) {
    devices.push_back(bj::object{{"device", d.device}, {"memory", d.memory}, {"dense", d.dense}, {"experts", d.experts},
                                 {"state", d.state}, {"workspace", d.workspace}, {"margin", d.margin},
                                 {"mtp", d.mtp}, {"free", d.free()}});
  }
  for (const StagePlan& s : p.stages) {
    stages.push_back(bj::object{{"first_layer", s.layers.first}, {"end_layer", s.layers.end}, {"device", s.device},
                                {"resident", s.resident}, {"pool_slots", s.pool_slots},
                                {"staging_bytes", s.staging_bytes}, {"expert_bytes", s.expert_bytes},
                                {"dense_bytes", s.dense_bytes}, {"state_bytes", s.state_bytes}, {"device_kv_bytes", s.kv_bytes}, {"host_kv_bytes", s.host_kv_bytes},
                                {"workspace_bytes", s.workspace_bytes + s.inbox_bytes},
                                {"mtp", bj::object{{"weights", s.mtp.weights}, {"state", s.mtp.state},
                                                   {"keep", s.mtp.keep}, {"workspace", s.mtp.workspace},
                                                   {"total", s.mtp.total()}}}});
  }
  for (const std::string& problem : p.problems) problems.push_back(bj::string(problem));
  const bj::object host{{"available", p.host.available}, {"store_bytes", p.host.store_bytes},
                        {"shadow_bytes", p.host.shadow_bytes}, {"store_slots", p.host.store_slots},
                        {"checkpoint_bytes", p.host.checkpoint_bytes}, {"kv_bytes", p.host.kv_bytes},
                        {"kv_budget", p.host.kv_budget ? bj::value(*p.host.kv_budget) : bj::value(nullptr)},
                        {"floor", p.host.floor}};
  return bj::serialize(bj::object{{"kv_type", config::kv_type_name(p.kv_type)}, {"kv_resident", p.kv_resident}, {"kv_resident_given", p.kv_resident_given}, {"kv_resident_why", p.kv_resident_why}, {"kv_table_bytes", p.kv_table_bytes}, {"expert_slot_bytes", p.expert_slot_bytes}, {"experts_total", p.experts_total},
                                  {"mtp", bj::object{{"requested", p.mtp_requested}, {"block", p.mtp_block}}},
                                  {"devices", std::move(devices)}, {"stages", std::move(stages)},
                                  {"host", host}, {"problems", std::move(problems)}});
}

}  // namespace ferry::gpu
