#pragma once
// `ferry convert`: a glm5_next Hugging Face checkpoint (BF16/F16/F32 as save_pretrained writes it,
// or the FP8 release with block scales) to a GGUF file as the published glm5next files lay it out
// (names, dims and keys from glm5_tensors.hpp and glm5_gguf.hpp). It streams: each GGUF tensor is
// made a few MB of rows at a time from the memory-mapped shards while the file is written, so a
// 642 GB checkpoint converts in constant memory.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/formats/ggml_type.hpp"
#include "model/glm5/glm5_hparams.hpp"
#include "model/glm5/glm5_tensors.hpp"
#include "model/glm5/glm5_type_rules.hpp"

namespace ferry::model {

struct Glm5ConvertOptions {
  GgmlType type = GgmlType::BF16;       // of tensors no rule names: glm5_writable_type
  std::optional<GgmlType> output_type;   // output.weight's (one of those); unset: see glm5_tensor_type
  std::string keep_f32_regex;            // GGUF names matching it (ECMAScript, search) stay F32
  Glm5TypeRules rules;                   // --tensor-type, then --recipe: the first match wins
  std::filesystem::path tokenizer_dir;   // empty: write no tokenizer
  std::string name;                      // general.name; empty: the checkpoint directory's name
  unsigned threads = 0;                  // quantization threads; 0: the hardware's
  // Notes (skipped tensors, fallback types, ...) and progress lines; may be empty.
  std::function<void(const std::string&)> log;
};

// One GGUF tensor of the plan: what it is, how it is made, and its type in the file.
struct Glm5ConvertItem {
  Glm5TensorSpec spec;
  HfRecipe recipe;
  GgmlType type = GgmlType::F32;
};

struct Glm5ConvertPlan {
  Glm5Hparams hparams;                 // n_nextn_layers lowered to the MTP blocks the checkpoint has
  std::string text_prefix;             // "model.language_model." or "model."
  std::vector<Glm5ConvertItem> items;  // in file order
  std::vector<std::string> notes;      // what the user should know (skipped vision tower, fallbacks)
  uint64_t gguf_bytes = 0;             // tensor data bytes
  uint32_t fp8_block_rows = 128, fp8_block_cols = 128;
};

class HfCheckpoint;

// What decides each tensor's type in a conversion.
struct Glm5TypePolicy {
  GgmlType type = GgmlType::BF16;        // tensors nothing else names
  std::optional<GgmlType> output_type;   // output.weight (--output-type)
  std::optional<std::regex> keep_f32;    // --keep-f32
  Glm5TypeRules rules;                   // --tensor-type / --recipe
  bool tied_embedding = false;           // output.weight is the embedding (no lm_head in the checkpoint)
};

// The GGUF type of `spec`, in this order: F32 for the catalogue's small state and --keep-f32 matches;
// the first matching rule's type; for the output head, output_type, else Q6_K in a file of 4- or
// 5-bit types (q4_K, q5_K, iq4_xs, iq3_s; llama.cpp's k-quant and IQ files do the same), else
// `type`; for a tied embedding (token_embd, which is also the head), the head's type, as llama.cpp
// quantizes a tied embedding; else `type`. Then, when the row length (dims[0]) is not a whole number
// of that type's blocks, Q8_0 when that fits, else F16. `why` says why it is not `type` (empty when
// it is, or when a rule or --keep-f32 asked for it).
GgmlType glm5_tensor_type(const Glm5TensorSpec& spec, const Glm5TypePolicy& policy, std::string* why = nullptr);

// llama.cpp's general.file_type for a file made with --type `type` (LLAMA_FTYPE_*; the K types map
// to their _S variants, the mixes nearest to one type throughout).
uint32_t glm5_file_type(GgmlType type);

// Reads config.json and the safetensors headers of `hf_dir` and decides every output tensor. The
// error names the file, tensor or field that is wrong.
Expected<Glm5ConvertPlan> plan_glm5_conversion(const std::filesystem::path& hf_dir, const HfCheckpoint& ck,
                                               const Glm5ConvertOptions& options);

struct Glm5ConvertResult {
  uint64_t file_bytes = 0;
  uint64_t tensors = 0;
  std::vector<std::string> notes;
};

// The type a file's general.file_type names: --type's, or with rules (--tensor-type, --recipe) the
// quantized type holding the most bytes, as llama.cpp's "mostly" file types mean.
GgmlType glm5_mostly_type(const Glm5ConvertPlan& plan, const Glm5ConvertOptions& options);

// Plans and writes `out`. On failure nothing is left at `out` (the writer removes its partial file).
Expected<Glm5ConvertResult> convert_glm5_checkpoint(const std::filesystem::path& hf_dir,
                                                    const std::filesystem::path& out,
                                                    const Glm5ConvertOptions& options);

}  // namespace ferry::model
