#pragma once
// What `ferry inspect` tells about a GGUF file of glm5_next: the numbers a user needs to plan memory
// budgets (bytes by type, per block, routed experts versus the rest, per-slot state), checked against
// the weight catalogue. Works on any GGUF file: parts it cannot read are reported as problems.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/formats/ggml_type.hpp"
#include "model/formats/gguf.hpp"
#include "model/glm5/glm5_hparams.hpp"
#include "model/glm5/glm5_tensors.hpp"

namespace ferry::model {

struct Glm5TypeBytes {
  std::string type;  // ggml's name: "q4_K", "f32"
  uint64_t tensors = 0;
  uint64_t bytes = 0;
};

struct Glm5BlockPlan {
  uint32_t index = 0;
  bool nextn = false;                  // an MTP block
  LayerKind attention = LayerKind::kda;
  bool indexer = false;                // DSA block that runs its own indexer
  FfnKind ffn = FfnKind::dense;
  uint64_t bytes = 0;                  // every tensor of the block found in the file
  uint64_t expert_bytes = 0;           // its stacked routed experts (ffn_{gate,up,down}_exps)
  uint64_t bytes_per_expert = 0;       // expert_bytes / n_experts: one expert's gate + up + down
  std::string expert_types;            // "gate/up/down" types, e.g. "iq3_s/iq3_s/q4_K"
};

// The types of one group of tensors (routed experts' gate/up, the shared expert, the KDA
// projections, ...): what a mixed file puts where.
struct Glm5TypeMix {
  std::string group;                   // "routed experts: gate, up", "KDA projections", ...
  uint64_t tensors = 0;
  uint64_t bytes = 0;
  std::vector<Glm5TypeBytes> types;    // by bytes, largest first
};

struct Glm5TokenizerSummary {
  std::string model, pre;
  uint64_t tokens = 0, merges = 0;
  std::optional<uint32_t> bos, eos, eot, pad;
  uint64_t chat_template_bytes = 0;
};

struct Glm5FileReport {
  uint32_t version = 0;
  uint64_t file_size = 0;
  uint32_t alignment = 0;
  std::string architecture, name;
  std::optional<uint32_t> file_type, quantization_version;
  uint64_t metadata_keys = 0;

  uint64_t tensor_count = 0;
  uint64_t tensor_bytes = 0;
  std::vector<Glm5TypeBytes> by_type;  // ordered by bytes, largest first

  std::optional<Glm5Hparams> hparams;  // absent when the metadata does not describe glm5next
  std::vector<Glm5BlockPlan> blocks;
  uint64_t global_bytes = 0;           // token_embd, output_norm, output
  uint64_t expert_bytes = 0;           // all routed experts
  uint64_t dense_bytes = 0;            // everything else: what each stage keeps on its GPU
  // Per-slot state the engine keeps: cached values per token over all DSA blocks (the latent plus
  // the indexer's key and gate scores; stored INT8 by default) and the KDA state in f32.
  uint64_t kv_values_per_token = 0;
  uint64_t kda_state_bytes_per_slot = 0;

  std::vector<Glm5TypeMix> type_mix;   // in the catalogue's group order; groups the file lacks are left out

  // ferry's own extensions of the glm5next layout that the llama.cpp family's loaders (llama.cpp PR
  // #27754 glm5next and PR #27773 glm5-next, ik_llama.cpp) do not implement and refuse: one line per
  // extension, naming the key. Empty: those loaders can read the file.
  std::vector<std::string> extensions;

  std::optional<Glm5TokenizerSummary> tokenizer;
  // Missing tensors, wrong dims, tensors the model does not use, metadata errors. Empty: the file is
  // a complete glm5next model ferry can load.
  std::vector<std::string> problems;
};

Glm5FileReport inspect_glm5_gguf(const GgufFile& file);

// The type-mix group of a tensor role (see Glm5TypeMix), e.g. "routed experts: down".
std::string_view glm5_tensor_group(Glm5Tensor role);

}  // namespace ferry::model
