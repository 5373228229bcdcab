#pragma once
// Which backend computes the model, in one place for every command (serve, run, bench, eval-ref):
// "cuda" (the CUDA backend, gpu/), "cpu" (model::CpuBackend) or "auto" (cuda when this ferry was
// built with CUDA and a device is visible, else cpu). Builds without CUDA answer "cuda" with an error.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "model/backend.hpp"
#include "model/formats/ggml_type.hpp"
#include "model/glm5/glm5_hparams.hpp"

namespace ferry::gpu {

struct BackendOptions {
  std::string kind = "auto";     // auto | cpu | cuda
  uint32_t max_slots = 4;
  uint32_t max_context = 0;      // 0: the model's trained context, capped at 65536 on the GPU
  uint32_t max_step_rows = 4096; // the largest step (prefill chunk + decode rows) the GPU backend plans for
  unsigned threads = 0;          // CPU backend threads (0: every core)
  int device = 0;                // CUDA device
};

// "cpu" or "cuda" for `kind`, or an error naming the value or why CUDA cannot be used.
Expected<std::string> resolve_backend_kind(const std::string& kind);

// Opens the GGUF model on the chosen backend. Errors name the file, the backend and the cause.
Expected<std::shared_ptr<model::Backend>> open_backend(const std::filesystem::path& model,
                                                       const BackendOptions& options);

// Synthetic weights of the shape in `hparams` (always the CUDA backend): loud in describe().
Expected<std::shared_ptr<model::Backend>> open_synthetic_backend(const model::Glm5Hparams& hparams,
                                                                 model::GgmlType type, uint64_t seed,
                                                                 const BackendOptions& options);

}  // namespace ferry::gpu
