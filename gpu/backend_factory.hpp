#pragma once
// Which backend computes the model, how its layers split into stages, and where its routed experts
// live, in one place for every command (serve, run, bench, eval-ref, plan): "cuda" (CUDA stages,
// gpu/), "cpu" (model::CpuStage) or "auto" (cuda when this ferry was built with CUDA and a device is
// visible, else cpu). Builds without CUDA answer "cuda" with an error. On CUDA the memory plan comes
// first (gpu/memory_plan.hpp): a configuration that cannot fit is refused before anything is loaded.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/expected.hpp"
#include "config/kv_type.hpp"
#include "config/serve_config.hpp"
#include "config/stage_split.hpp"
#include "gpu/memory_plan.hpp"
#include "model/expert_policy.hpp"
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
  config::MemoryConfig memory;    // where routed experts go when the devices cannot hold them
  float route_skew = 0;           // synthetic weights: the routers' preference (ModelConfig::route_skew)
  std::optional<config::KvType> kv_type;  // DSA latent rows (--kv-type); unset: default_kv_type(backend)
  bool mtp = false;               // the last stage runs the model's MTP block, when it has one
  uint32_t verify_rows = 0;       // with mtp, and a model with an MTP block: rows a step's verify sets add
  uint64_t checkpoint_bytes = 0;  // host RAM the prefix cache may take (--checkpoint-budget)
  // CUDA: latent rows per DSA layer and slot kept on the device (--kv-resident); a longer context keeps
  // the rest in a pinned host tier (gpu/kv_window.hpp). 0: the whole context on the device; unset:
  // the memory plan chooses (every row when they fit, else gpu::kDefaultKvResident).
  std::optional<uint32_t> kv_resident;
  std::optional<uint64_t> kv_host_budget;  // --kv-host-budget; unset: what the tier needs, within the RAM floor
};

// The latent rows' format when --kv-type is not given: int8 on "cuda", f32 (the reference) on "cpu".
config::KvType default_kv_type(const std::string& resolved_kind);
// --kv-type as every command takes it: "auto" (the backend's default) or a KvType into options.kv_type.
Status parse_kv_type_option(const std::string& text, BackendOptions& options);

// A model ready to run: its stages, the memory plan they were made from (CUDA), and the policy that
// moves experts between their pools and the host store (when some stage keeps a pool).
struct OpenedModel {
  std::unique_ptr<model::Pipeline> pipeline;
  std::shared_ptr<model::ExpertPolicy> experts;
  std::vector<int> expert_stage;  // per pipeline stage: its number in the policy, -1 when all resident
  MemoryPlan plan;

  // The expert policy once for every tiered stage, as the expert-cache actor runs it after each step:
  // for commands that drive the pipeline themselves (bench, eval-ref).
  void rebalance();
};

// "cpu" or "cuda" for `kind`, or an error naming the value or why CUDA cannot be used.
Expected<std::string> resolve_backend_kind(const std::string& kind);

// The GGUF model on the chosen backend, split into stages. Errors name the file, the backend, the
// stage and the cause; a memory plan that does not fit is refused with one line per problem.
Expected<OpenedModel> open_pipeline(const std::filesystem::path& model, const BackendOptions& options);

// Synthetic weights of the shape in `hparams` (always CUDA stages): loud in describe(). `rules`
// (--recipe) give tensors other types than `type`.
Expected<OpenedModel> open_synthetic_pipeline(const model::Glm5Hparams& hparams, model::GgmlType type, uint64_t seed,
                                              const BackendOptions& options, const model::Glm5TypeRules& rules = {});

// The plan alone, for `ferry plan`: the model's tensors as stored (`tensor_bytes`), the split, and
// the devices' and the host's memory as given (a machine planned before it is booted).
MemoryPlan plan_for(const model::Glm5Hparams& hparams,
                    const std::function<uint64_t(const model::Glm5TensorSpec&)>& tensor_bytes,
                    const BackendOptions& options, const std::vector<uint64_t>& device_memory,
                    uint64_t host_available, std::vector<std::string>& errors);

// The weight bytes of every trunk layer of a model of this shape and type (for --split auto).
std::vector<uint64_t> layer_weight_bytes(const model::Glm5Hparams& hparams,
                                         const std::function<uint64_t(const model::Glm5TensorSpec&)>& tensor_bytes);

// RAM the kernel says it can give without swapping (MemAvailable); 0 when unknown.
uint64_t host_available_memory();

}  // namespace ferry::gpu
