#pragma once
// A stage's weights on its device, bound by role from the model's one weight catalogue
// (model/glm5/glm5_tensors.hpp): every tensor of the stage's layers (plus the embedding on the first
// stage and the final norm and head on the last), uploaded from a GGUF file's mapping or made as
// synthetic values. Matrices keep their GGUF block layout (DevMatrix); the small state is f32.
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "model/glm5/glm5_hparams.hpp"
#include "model/glm5/glm5_tensors.hpp"
#include "model/glm5/glm5_type_rules.hpp"
#include "model/stage.hpp"

namespace ferry::model {
class Glm5Weights;
}

namespace ferry::gpu {

// Deterministic pseudo-random weights of any glm5_next shape, made on the device (no file). Every
// tensor's values are a function of (seed, role, layer) and every routed expert's of (seed, role,
// layer, expert), so a stage makes the same values for its layers however the model is split.
struct SyntheticModel {
  model::Glm5Hparams hparams;
  model::GgmlType type = model::GgmlType::Q4_K;  // of the large matrices; small state stays f32
  uint64_t seed = 1;
  // Random weights route nearly uniformly, real models do not: with a skew, each layer's router
  // prefers its experts by a stable random rank (the choice-score bias gets -skew * ln(rank)).
  float route_skew = 0;
  // Per-tensor types (`--recipe`): a tensor a rule names gets the rule's type instead of `type`
  // (model::Glm5TypeRules::requested); rows that are not whole blocks fall back as with `type`.
  model::Glm5TypeRules rules;
};

struct DevLayer {
  uint32_t index = 0;
  model::LayerKind kind = model::LayerKind::kda;
  model::FfnKind ffn = model::FfnKind::dense;
  bool has_indexer = false;
  std::array<DevMatrix, model::kGlm5TensorRoles> matrices{};
  std::array<const float*, model::kGlm5TensorRoles> vectors{};
  const float* conv = nullptr;  // the q, k and v conv taps in one buffer: [3C][kernel]

  const DevMatrix& m(model::Glm5Tensor role) const { return matrices[static_cast<size_t>(role)]; }
  const float* v(model::Glm5Tensor role) const { return vectors[static_cast<size_t>(role)]; }
};

class DeviceWeights {
 public:
  // Both throw CudaError: out of device memory, a weight type the kernels cannot read. Without
  // `routed_experts` the stacked expert tensors stay out (a StageExperts pool holds them instead).
  static DeviceWeights upload(const model::Glm5Weights& weights, model::LayerRange layers, bool routed_experts,
                              cudaStream_t stream);
  static DeviceWeights synthesize(const SyntheticModel& model, model::LayerRange layers, bool routed_experts,
                                  cudaStream_t stream);

  // Whole-model tensors: the embedding on the first stage, the final norm and head on the last.
  DevMatrix token_embd, output;
  const float* output_norm = nullptr;

  const DevLayer& layer(uint32_t index) const { return layers_[index - first_]; }
  uint64_t bytes() const { return bytes_; }
  // Bytes one decoded token reads from these weights: every matrix of the stage once, one row of the
  // embedding, `experts_used` of each MoE layer's routed experts (when they are here).
  uint64_t decode_bytes(uint32_t experts_used, uint32_t experts) const;

 private:
  class Source;
  class FileSource;
  class Synthesizer;
  DeviceWeights(const model::Glm5Hparams& hp, model::LayerRange layers, bool routed_experts, Source& source,
                cudaStream_t stream);

  uint32_t first_ = 0;
  std::vector<DevLayer> layers_;
  std::vector<DeviceBuffer> buffers_;
  uint64_t bytes_ = 0;
};

}  // namespace ferry::gpu
