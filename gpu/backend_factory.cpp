#include "gpu/backend_factory.hpp"

#include <algorithm>

#include "gpu/device_info.hpp"
#include "model/cpu/cpu_stage.hpp"
#include "model/glm5/glm5_tensors.hpp"
#include "model/glm5/glm5_weights.hpp"
#if FERRY_HAVE_CUDA
#include "gpu/cuda_stage.hpp"
#endif

namespace ferry::gpu {
namespace {

using PipelineResult = Expected<std::unique_ptr<model::Pipeline>>;

// The context a slot gets: what was asked for, at most the model's trained context.
uint32_t context_for(const BackendOptions& o, uint32_t trained_context) {
  return o.max_context != 0 ? std::min(o.max_context, trained_context) : trained_context;
}

Expected<std::vector<model::LayerRange>> ranges_for(const BackendOptions& o, const model::Glm5Hparams& hp,
                                                    const std::vector<uint64_t>& layer_bytes) {
  auto ranges = config::stage_ranges(o.split, hp.n_layers, layer_bytes);
  if (!ranges) return ranges.error();
  if (auto e = model::check_stage_ranges(hp, ranges.value())) return *e;
  return ranges;
}

#if FERRY_HAVE_CUDA
CudaStageOptions stage_options(const BackendOptions& o, uint32_t trained_context, size_t stage, size_t stages) {
  CudaStageOptions c;
  c.device = config::stage_device(o.split, stage, stages);
  c.max_slots = o.max_slots;
  c.max_context = context_for(o, trained_context);
  c.max_step_rows = o.max_step_rows;
  c.graphs = o.graphs;
  return c;
}

// CUDA stages for the ranges, made by `make(range, options)`; then connected into a pipeline.
template <class Make>
PipelineResult cuda_pipeline(const BackendOptions& o, const model::Glm5Hparams& hp,
                             const std::vector<model::LayerRange>& ranges, Make make) {
  std::vector<std::shared_ptr<model::Stage>> stages;
  for (size_t i = 0; i < ranges.size(); ++i) {
    Expected<std::unique_ptr<CudaStage>> s = make(ranges[i], stage_options(o, hp.context_length, i, ranges.size()));
    if (!s) return s.error();
    stages.push_back(std::move(s.value()));
  }
  return model::Pipeline::make(std::move(stages));
}
#endif

}  // namespace

Expected<std::string> resolve_backend_kind(const std::string& kind) {
  if (kind == "cpu") return std::string("cpu");
  if (kind != "cuda" && kind != "auto") return Error("backend '" + kind + "' is not one of auto, cpu, cuda");
  std::string why;  // list_devices says why there is none, also in a build without CUDA
  const bool usable = !list_devices(&why).empty();
  if (usable) return std::string("cuda");
  if (kind == "auto") return std::string("cpu");
  return Error(ErrorCode::unsupported, "backend cuda: " + why);
}

std::vector<uint64_t> layer_weight_bytes(const model::Glm5Hparams& hp, model::GgmlType type,
                                         const model::Glm5TypeRules& rules) {
  std::vector<uint64_t> bytes(hp.n_layers, 0);
  for (uint32_t l = 0; l < hp.n_layers; ++l) {
    for (const model::Glm5TensorSpec& s : model::glm5_layer_tensors(hp, l)) {
      const auto b = model::ggml_bytes(rules.requested(s, type), s.n_elements());
      bytes[l] += b ? *b : s.n_elements() * 4;
    }
  }
  return bytes;
}

PipelineResult open_pipeline(const std::filesystem::path& path, const BackendOptions& o) {
  auto kind = resolve_backend_kind(o.kind);
  if (!kind) return kind.error();
  auto loaded = model::Glm5Weights::load(path);
  if (!loaded) return loaded.error().prefixed(path.string() + ": ");
  std::shared_ptr<const model::Glm5Weights> weights = std::move(loaded.value());
  const model::Glm5Hparams& hp = weights->hparams();
  std::vector<uint64_t> layer_bytes(hp.n_layers, 0);
  for (const model::Glm5TensorSpec& s : model::glm5_all_tensors(hp)) {
    if (s.layer < 0 || static_cast<uint32_t>(s.layer) >= hp.n_layers) continue;
    const model::GgufTensorInfo* info = weights->file().find_tensor(s.name);
    if (info != nullptr) layer_bytes[static_cast<size_t>(s.layer)] += info->data.size();
  }
  auto ranges = ranges_for(o, hp, layer_bytes);
  if (!ranges) return ranges.error();
  if (kind.value() == "cpu") {
    model::CpuStageOptions co;
    co.max_slots = o.max_slots;
    co.max_context = context_for(o, hp.context_length);
    return model::Pipeline::make(model::make_cpu_stages(weights, ranges.value(), o.threads, co));
  }
#if FERRY_HAVE_CUDA
  auto pipeline = cuda_pipeline(o, hp, ranges.value(), [&](model::LayerRange r, const CudaStageOptions& so) {
    return CudaStage::from_weights(*weights, r, so);
  });
  if (!pipeline) return Error(pipeline.error().code, path.string() + ": CUDA backend: " + pipeline.error().message);
  return pipeline;
#else
  return Error(ErrorCode::unsupported, "ferry was built without CUDA");
#endif
}

PipelineResult open_synthetic_pipeline(const model::Glm5Hparams& hp, model::GgmlType type, uint64_t seed,
                                       const BackendOptions& o, const model::Glm5TypeRules& rules) {
#if FERRY_HAVE_CUDA
  auto kind = resolve_backend_kind(o.kind == "auto" ? "cuda" : o.kind);
  if (!kind) return kind.error();
  if (kind.value() != "cuda") return Error(ErrorCode::unsupported, "synthetic weights need the CUDA backend");
  auto ranges = ranges_for(o, hp, layer_weight_bytes(hp, type, rules));
  if (!ranges) return ranges.error();
  const SyntheticModel m{hp, type, seed, rules};
  auto pipeline = cuda_pipeline(o, hp, ranges.value(), [&](model::LayerRange r, const CudaStageOptions& so) {
    return CudaStage::synthetic(m, r, so);
  });
  if (!pipeline) return Error(pipeline.error().code, "synthetic weights on the CUDA backend: " + pipeline.error().message);
  return pipeline;
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
