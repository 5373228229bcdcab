#pragma once
// Which backend computes the model, and how its layers split into stages, in one place for every
// command (serve, run, bench, eval-ref): "cuda" (CUDA stages, gpu/), "cpu" (model::CpuStage) or "auto"
// (cuda when this ferry was built with CUDA and a device is visible, else cpu). Builds without CUDA
// answer "cuda" with an error.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "config/expected.hpp"
#include "config/stage_split.hpp"
#include "model/formats/ggml_type.hpp"
#include "model/glm5/glm5_hparams.hpp"
#include "model/glm5/glm5_type_rules.hpp"
#include "model/pipeline.hpp"

namespace ferry::gpu {

struct BackendOptions {
  std::string kind = "auto";      // auto | cpu | cuda
  uint32_t max_slots = 4;
  uint32_t max_context = 0;       // tokens per slot, at most the model's trained context (0: that context)
  uint32_t max_step_rows = 4096;  // the largest step (prefill chunk + decode rows) a GPU stage plans for
  unsigned threads = 0;           // CPU backend threads (0: every core)
  bool graphs = true;             // CUDA: replay decode steps from graphs
  config::StageSplit split;       // the stages' layers and devices
};

// "cpu" or "cuda" for `kind`, or an error naming the value or why CUDA cannot be used.
Expected<std::string> resolve_backend_kind(const std::string& kind);

// The GGUF model on the chosen backend, split into stages. Errors name the file, the backend, the
// stage and the cause.
Expected<std::unique_ptr<model::Pipeline>> open_pipeline(const std::filesystem::path& model,
                                                         const BackendOptions& options);

// Synthetic weights of the shape in `hparams` (always CUDA stages): loud in describe(). `rules`
// (--recipe) give tensors other types than `type`.
Expected<std::unique_ptr<model::Pipeline>> open_synthetic_pipeline(const model::Glm5Hparams& hparams,
                                                                   model::GgmlType type, uint64_t seed,
                                                                   const BackendOptions& options,
                                                                   const model::Glm5TypeRules& rules = {});

// The weight bytes of every trunk layer of a model of this shape and type (for --split auto).
std::vector<uint64_t> layer_weight_bytes(const model::Glm5Hparams& hparams, model::GgmlType type,
                                         const model::Glm5TypeRules& rules = {});

}  // namespace ferry::gpu
