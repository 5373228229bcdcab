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

namespace ferry::model {

struct Glm5ConvertOptions {
  GgmlType type = GgmlType::BF16;       // F32, F16, BF16, Q8_0, Q4_K, Q5_K or Q6_K
  std::optional<GgmlType> output_type;   // output.weight's (one of those); unset: see glm5_tensor_type
  std::string keep_f32_regex;            // GGUF names matching it (ECMAScript, search) stay F32
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

// The GGUF type a tensor gets for the requested `type`: F32 for small state and keep_f32 matches,
// else `type` (for the output head: `output_type` when given, else Q6_K when `type` is Q4_K or Q5_K)
// when the row length (dims[0]) is a whole number of its blocks, else Q8_0 when that fits, else F16.
// `why` says why it is not what was asked for (empty when it is).
GgmlType glm5_tensor_type(const Glm5TensorSpec& spec, GgmlType type, bool keep_f32, std::string* why = nullptr,
                          std::optional<GgmlType> output_type = std::nullopt);

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

// Plans and writes `out`. On failure nothing is left at `out` (the writer removes its partial file).
Expected<Glm5ConvertResult> convert_glm5_checkpoint(const std::filesystem::path& hf_dir,
                                                    const std::filesystem::path& out,
                                                    const Glm5ConvertOptions& options);

}  // namespace ferry::model
