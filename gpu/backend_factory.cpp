#include "gpu/backend_factory.hpp"

#include <algorithm>
#include <fstream>

#include "gpu/device_info.hpp"
#include "model/cpu/cpu_stage.hpp"
#include "model/glm5/glm5_tensors.hpp"
#include "model/glm5/glm5_weights.hpp"
#include "gpu/stage_sizes.hpp"
#if FERRY_HAVE_CUDA
#include "gpu/cuda_stage.hpp"
#include "gpu/expert_source.hpp"
#endif

namespace ferry::gpu {
namespace {

using TensorBytes = std::function<uint64_t(const model::Glm5TensorSpec&)>;

// The context a slot gets: what was asked for, at most the model's trained context.
uint32_t context_for(const BackendOptions& o, uint32_t trained_context) {
  return o.max_context != 0 ? std::min(o.max_context, trained_context) : trained_context;
}

Expected<std::vector<model::LayerRange>> ranges_for(const BackendOptions& o, const model::Glm5Hparams& hp,
                                                    const TensorBytes& tensor_bytes) {
  auto ranges = config::stage_ranges(o.split, hp.n_layers, layer_weight_bytes(hp, tensor_bytes));
  if (!ranges) return ranges.error();
  if (auto e = model::check_stage_ranges(hp, ranges.value())) return *e;
  return ranges;
}

// The largest step a GPU stage plans for: the verify sets widen it only when the model can draft.
uint32_t step_rows_for(const BackendOptions& o, const model::Glm5Hparams& hp) {
  return o.max_step_rows + (o.mtp && hp.n_nextn_layers > 0 ? o.verify_rows : 0);
}

PlanInput plan_input(const model::Glm5Hparams& hp, const TensorBytes& tensor_bytes, const BackendOptions& o,
                     const std::vector<model::LayerRange>& ranges, std::vector<uint64_t> device_memory,
                     uint64_t host_available) {
  PlanInput in;
  in.hparams = hp;
  in.tensor_bytes = tensor_bytes;
  in.ranges = ranges;
  for (size_t i = 0; i < ranges.size(); ++i) in.stage_devices.push_back(config::stage_device(o.split, i, ranges.size()));
  in.device_memory = std::move(device_memory);
  in.host_available = host_available;
  in.budgets = o.memory;
  in.slots = o.max_slots;
  in.context = context_for(o, hp.context_length);
  in.step_rows = step_rows_for(o, hp);
  in.mtp = o.mtp;
  in.kv_type = o.kv_type.value_or(default_kv_type("cuda"));
  in.checkpoint_bytes = o.checkpoint_bytes;
  in.kv_resident = o.kv_resident;
  in.kv_host_budget = o.kv_host_budget;
  return in;
}

#if FERRY_HAVE_CUDA
// Where a model's bytes come from: its file or its seed.
struct Source {
  const model::Glm5Weights* weights = nullptr;
  const SyntheticModel* synthetic = nullptr;
  const model::Glm5Hparams& hparams() const { return weights != nullptr ? weights->hparams() : synthetic->hparams; }
  std::unique_ptr<ExpertSource> experts() const {
    return weights != nullptr ? file_experts(*weights) : synthetic_experts(*synthetic);
  }
};

// The expert policy's first placement, and the host store filled with it (on the device of each
// expert's stage: synthetic experts are made there).
Expected<std::shared_ptr<HostExpertStore>> fill_host_store(const Source& src, const MemoryPlan& plan,
                                                           const model::ExpertPlacement& placement) {
  const model::Glm5Hparams& hp = src.hparams();
  try {
    auto store = std::make_shared<HostExpertStore>(plan.host.store_slots, plan.expert_slot_bytes);
    for (const StagePlan& s : plan.stages) {
      if (s.resident) continue;
      FERRY_CUDA(cudaSetDevice(s.device));
      const auto experts = src.experts();  // its scratch and the stream on this device
      Stream stream;
      for (uint32_t l = s.layers.first; l < s.layers.end; ++l) {
        if (model::glm5_ffn_kind(hp, l) != model::FfnKind::moe) continue;
        for (uint32_t e = 0; e < hp.n_experts; ++e) {
          const int64_t h = placement.host_slot[size_t{l} * hp.n_experts + e];
          if (h >= 0) experts->write(l, e, store->slot(static_cast<uint32_t>(h)), false, stream.get());
        }
      }
    }
    return store;
  } catch (const CudaError& e) {
    return Error(e.code(), std::string("the host expert store: ") + e.what());
  }
}

Expected<OpenedModel> cuda_pipeline(const BackendOptions& o, const Source& src, const TensorBytes& tensor_bytes,
                                    const std::vector<model::LayerRange>& ranges) {
  const model::Glm5Hparams& hp = src.hparams();
  std::string why;
  std::vector<uint64_t> device_memory;
  for (const DeviceInfo& d : list_devices(&why)) device_memory.push_back(d.free_bytes);
  OpenedModel opened;
  opened.plan = plan_memory(plan_input(hp, tensor_bytes, o, ranges, device_memory, host_available_memory()));
  if (!opened.plan.problems.empty()) {
    std::string all = "the memory plan does not fit:";
    for (const std::string& p : opened.plan.problems) all += "\n  " + p;
    return Error(ErrorCode::out_of_memory, all + "\n" + format_plan(opened.plan));
  }
  std::vector<std::vector<uint32_t>> pooled_layers;
  std::vector<uint32_t> pool_slots;
  std::vector<int> policy_stage(ranges.size(), -1);
  for (size_t i = 0; i < opened.plan.stages.size(); ++i) {
    const StagePlan& s = opened.plan.stages[i];
    if (s.resident) continue;
    policy_stage[i] = static_cast<int>(pooled_layers.size());
    auto& layers = pooled_layers.emplace_back();
    for (uint32_t l = s.layers.first; l < s.layers.end; ++l) {
      if (model::glm5_ffn_kind(hp, l) == model::FfnKind::moe) layers.push_back(l);
    }
    pool_slots.push_back(s.pool_slots);
  }
  model::ExpertPlacement placement;
  std::shared_ptr<HostExpertStore> store;
  if (opened.plan.tiered()) {
    opened.experts = std::make_shared<model::ExpertPolicy>(hp.n_layers, hp.n_experts, pooled_layers, pool_slots,
                                                           opened.plan.host.store_slots);
    const std::string& stats = o.memory.expert_stats;
    if (!stats.empty() && std::ifstream(stats).good()) {
      if (auto e = opened.experts->load_counts(stats)) return e->prefixed("--expert-stats: ");
    }
    placement = opened.experts->place();
    auto filled = fill_host_store(src, opened.plan, placement);
    if (!filled) return filled.error();
    store = std::move(filled.value());
  }
  std::vector<std::shared_ptr<model::Stage>> stages;
  for (size_t i = 0; i < ranges.size(); ++i) {
    CudaStageOptions c;
    c.device = config::stage_device(o.split, i, ranges.size());
    c.max_slots = o.max_slots;
    c.max_context = context_for(o, hp.context_length);
    c.kv.latent = o.kv_type.value_or(default_kv_type("cuda"));
    c.kv_resident = opened.plan.kv_resident;
    c.max_step_rows = step_rows_for(o, hp);
    c.graphs = o.graphs;
    c.mtp = o.mtp;
    if (policy_stage[i] >= 0) {
      StageExpertsPlan p;
      p.pooled = placement.pooled[static_cast<size_t>(policy_stage[i])];
      p.host_slot = placement.host_slot;
      p.staging_bytes = opened.plan.stages[i].staging_bytes;
      p.miss_path = o.memory.miss_path;
      c.tiers = StageExpertTiers{store, std::move(p)};
    }
    auto s = src.weights != nullptr ? CudaStage::from_weights(*src.weights, ranges[i], c)
                                    : CudaStage::synthetic(*src.synthetic, ranges[i], c);
    if (!s) return s.error();
    stages.push_back(std::move(s.value()));
  }
  auto pipeline = model::Pipeline::make(std::move(stages));
  if (!pipeline) return pipeline.error();
  opened.pipeline = std::move(pipeline.value());
  opened.expert_stage = std::move(policy_stage);
  return opened;
}
#endif

}  // namespace

void OpenedModel::rebalance() {
  if (!experts) return;
  for (size_t i = 0; i < expert_stage.size(); ++i) {
    model::ExpertTier* tier = pipeline->stages()[i]->experts();
    if (expert_stage[i] < 0 || tier == nullptr) continue;
    const auto s = static_cast<uint32_t>(expert_stage[i]);
    experts->finished(s, tier->take_finished_moves());
    experts->observe(s, tier->take_route_counts());
    tier->start_moves(experts->propose(s));
  }
}

config::KvType default_kv_type(const std::string& resolved_kind) {
  return resolved_kind == "cuda" ? config::KvType::int8 : config::KvType::f32;
}

Status parse_kv_type_option(const std::string& text, BackendOptions& options) {
  if (text == "auto") {
    options.kv_type.reset();
    return std::nullopt;
  }
  auto t = config::parse_kv_type(text);
  if (!t) return t.error().prefixed("--kv-type: ");
  options.kv_type = t.value();
  return std::nullopt;
}

Expected<std::string> resolve_backend_kind(const std::string& kind) {
  if (kind == "cpu") return std::string("cpu");
  if (kind != "cuda" && kind != "auto") return Error("backend '" + kind + "' is not one of auto, cpu, cuda");
  std::string why;  // list_devices says why there is none, also in a build without CUDA
  const bool usable = !list_devices(&why).empty();
  if (usable) return std::string("cuda");
  if (kind == "auto") return std::string("cpu");
  return Error(ErrorCode::unsupported, "backend cuda: " + why);
}

std::vector<uint64_t> layer_weight_bytes(const model::Glm5Hparams& hp, const TensorBytes& tensor_bytes) {
  std::vector<uint64_t> bytes(hp.n_layers, 0);
  for (uint32_t l = 0; l < hp.n_layers; ++l) {
    for (const model::Glm5TensorSpec& s : model::glm5_layer_tensors(hp, l)) bytes[l] += tensor_bytes(s);
  }
  return bytes;
}

uint64_t host_available_memory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  uint64_t kib = 0;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

MemoryPlan plan_for(const model::Glm5Hparams& hp, const TensorBytes& tensor_bytes, const BackendOptions& o,
                    const std::vector<uint64_t>& device_memory, uint64_t host_available,
                    std::vector<std::string>& errors) {
  auto ranges = ranges_for(o, hp, tensor_bytes);
  if (!ranges) {
    errors.push_back(ranges.error().message);
    return {};
  }
  return plan_memory(plan_input(hp, tensor_bytes, o, ranges.value(), device_memory, host_available));
}

Expected<OpenedModel> open_pipeline(const std::filesystem::path& path, const BackendOptions& o) {
  auto kind = resolve_backend_kind(o.kind);
  if (!kind) return kind.error();
  auto loaded = model::Glm5Weights::load(path);
  if (!loaded) return loaded.error().prefixed(path.string() + ": ");
  std::shared_ptr<const model::Glm5Weights> weights = std::move(loaded.value());
  const model::Glm5Hparams& hp = weights->hparams();
  const TensorBytes tensor_bytes = [&](const model::Glm5TensorSpec& s) -> uint64_t {
    const model::GgufTensorInfo* info = weights->file().find_tensor(s.name);
    return info != nullptr ? info->data.size() : 0;
  };
  auto ranges = ranges_for(o, hp, tensor_bytes);
  if (!ranges) return ranges.error();
  if (kind.value() == "cpu") {
    model::CpuStageOptions co;
    co.max_slots = o.max_slots;
    co.max_context = context_for(o, hp.context_length);
    co.kv.latent = o.kv_type.value_or(default_kv_type("cpu"));
    co.mtp = o.mtp;
    auto pipeline = model::Pipeline::make(model::make_cpu_stages(weights, ranges.value(), o.threads, co));
    if (!pipeline) return pipeline.error();
    OpenedModel opened;
    opened.pipeline = std::move(pipeline.value());
    opened.expert_stage.assign(ranges->size(), -1);
    return opened;
  }
#if FERRY_HAVE_CUDA
  auto opened = cuda_pipeline(o, Source{weights.get(), nullptr}, tensor_bytes, ranges.value());
  if (!opened) return opened.error().prefixed(path.string() + ": CUDA backend: ");
  // The stages copied what they need: the file's mapping goes with `weights`.
  return opened;
#else
  return Error(ErrorCode::unsupported, "ferry was built without CUDA");
#endif
}

Expected<OpenedModel> open_synthetic_pipeline(const model::Glm5Hparams& hp, model::GgmlType type, uint64_t seed,
                                              const BackendOptions& o, const model::Glm5TypeRules& rules) {
#if FERRY_HAVE_CUDA
  auto kind = resolve_backend_kind(o.kind == "auto" ? "cuda" : o.kind);
  if (!kind) return kind.error();
  if (kind.value() != "cuda") return Error(ErrorCode::unsupported, "synthetic weights need the CUDA backend");
  const TensorBytes tensor_bytes = [type, &rules](const model::Glm5TensorSpec& s) -> uint64_t {
    return *model::ggml_bytes(synthetic_tensor_type(s, type, rules), s.n_elements());
  };
  auto ranges = ranges_for(o, hp, tensor_bytes);
  if (!ranges) return ranges.error();
  const SyntheticModel m{hp, type, seed, o.route_skew, rules};
  auto opened = cuda_pipeline(o, Source{nullptr, &m}, tensor_bytes, ranges.value());
  if (!opened) return opened.error().prefixed("synthetic weights on the CUDA backend: ");
  return opened;
#else
  (void)hp;
  (void)type;
  (void)seed;
  (void)o;
  (void)rules;
  return Error(ErrorCode::unsupported, "synthetic weights need the CUDA backend, and ferry was built without CUDA");
#endif
}

}  // namespace ferry::gpu
