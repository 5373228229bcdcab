#pragma once
// The glm5_next weight catalogue: the one table in ferry that names every weight of the text model,
// both as a GGUF file stores it (name, dims, which tensors stay F32) and as a Hugging Face checkpoint
// does (names, shapes, and how the GGUF tensor is made from them). The forward pass fetches weights
// by role through it; `ferry convert` writes files by it; `ferry inspect` reads files by it.
//
// GGUF names are those of the published GLM-5.3-Flash files (llama.cpp `glm5next` as in the unsloth
// fork's src/models/glm5next.cpp and conversion/glm5next.py; ik_llama.cpp PR #2376 and mainline
// llama.cpp PR #27773 `glm5-next` use the same tensor names). Dims are ggml's (ne0, the contiguous
// one, first): a Hugging Face [out, in] matrix is GGUF {in, out}. See glm5_tensors.cpp for the table
// and the sources it was checked against.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/glm5/glm5_hparams.hpp"

namespace ferry::model {

// What a weight is for. One role per distinct GGUF name suffix.
enum class Glm5Tensor : uint8_t {
  // whole model
  token_embd, output_norm, output,
  // every block: the two sublayer norms and (trunk blocks only) the two mHC mixers
  attn_norm, ffn_norm,
  hc_attn_fn, hc_attn_base, hc_attn_scale, hc_ffn_fn, hc_ffn_base, hc_ffn_scale,
  // KDA (linear attention) blocks
  attn_q, attn_k, attn_v, ssm_conv1d_q, ssm_conv1d_k, ssm_conv1d_v,
  ssm_f_a, ssm_f_b, ssm_g_a, ssm_g_b, ssm_beta, ssm_a, ssm_dt_bias, ssm_norm,
  // attention output projection (KDA and DSA blocks alike)
  attn_output,
  // DSA blocks: MLA without RoPE
  attn_q_a, attn_q_a_norm, attn_q_b, attn_kv_a_mqa, attn_kv_a_norm, attn_k_b, attn_v_b,
  // DSA blocks: the lightning indexer with its k-pool compressor (absent on "shared" indexer layers)
  indexer_attn_q_b, indexer_attn_k, indexer_k_norm, indexer_k_norm_bias, indexer_proj,
  indexer_compressor_gate, indexer_compressor_ape,
  // dense FFN blocks
  ffn_gate, ffn_up, ffn_down,
  // MoE FFN blocks: router, router bias, stacked routed experts, shared expert
  ffn_gate_inp, ffn_exp_probs_b, ffn_gate_exps, ffn_up_exps, ffn_down_exps,
  ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp,
  // MTP ("nextn") blocks, at index n_layers and up
  nextn_eh_proj, nextn_enorm, nextn_hnorm, nextn_shared_head_norm, nextn_embed_tokens,
  nextn_shared_head_head,
};
inline constexpr size_t kGlm5TensorRoles = static_cast<size_t>(Glm5Tensor::nextn_shared_head_head) + 1;

// One weight as a GGUF file of this model holds it.
struct Glm5TensorSpec {
  Glm5Tensor role{};
  int32_t layer = -1;           // block index; -1 for whole-model tensors
  std::string name;             // "blk.3.attn_q_b.weight"
  std::vector<uint64_t> dims;   // ne0 first
  bool keep_f32 = false;        // small state: written F32 whatever type the user asked for
  bool optional = false;        // a file may lack it (the MTP block's own copies of embed / head)
  bool expert = false;          // stacked routed experts: dims {.., .., n_experts}

  uint64_t n_elements() const;
};

// "attn_q_b.weight", "ssm_a", "exp_probs_b.bias", ...: the name without "blk.N.".
std::string_view glm5_tensor_suffix(Glm5Tensor role);
bool glm5_tensor_is_global(Glm5Tensor role);  // token_embd, output_norm, output
// Small state the forward pass reads as one f32 array (norms, biases, conv taps, the APE, ...), not as
// a matrix of rows.
bool glm5_tensor_is_vector(Glm5Tensor role);
// "blk.{layer}.{suffix}" or, for whole-model roles, the suffix alone.
std::string glm5_tensor_name(Glm5Tensor role, int32_t layer);
// Inverse of glm5_tensor_name; nullopt for a name this model does not use.
std::optional<std::pair<Glm5Tensor, int32_t>> parse_glm5_tensor_name(std::string_view name);

// Block kinds including the MTP blocks (index >= n_layers), which are DSA blocks with a full
// indexer; their FFN is dense only when the leading dense run covers their index (as in llama.cpp).
LayerKind glm5_layer_kind(const Glm5Hparams& hp, uint32_t layer);
FfnKind glm5_ffn_kind(const Glm5Hparams& hp, uint32_t layer);
bool glm5_has_indexer(const Glm5Hparams& hp, uint32_t layer);
inline bool glm5_is_nextn(const Glm5Hparams& hp, uint32_t layer) { return layer >= hp.n_layers; }
inline uint32_t glm5_block_count(const Glm5Hparams& hp) { return hp.n_layers + hp.n_nextn_layers; }
// Leading dense blocks (what GGUF's leading_dense_block_count stores).
uint32_t glm5_leading_dense_blocks(const Glm5Hparams& hp);

// The expected tensors. Preconditions: hp.validate() is empty; layer < glm5_block_count(hp).
std::vector<Glm5TensorSpec> glm5_global_tensors(const Glm5Hparams& hp);
std::vector<Glm5TensorSpec> glm5_layer_tensors(const Glm5Hparams& hp, uint32_t layer);
std::vector<Glm5TensorSpec> glm5_all_tensors(const Glm5Hparams& hp);  // globals, then blocks in order
// One tensor by role; nullopt when that block does not have it.
std::optional<Glm5TensorSpec> glm5_find_tensor(const Glm5Hparams& hp, Glm5Tensor role, int32_t layer = -1);

// Two dims lists describe the same ggml tensor when they agree up to trailing 1s (ggml pads every
// tensor to 4 dims with 1s: {4, 1, 8192} and {4, 1, 8192, 1} are one shape).
bool same_ggml_dims(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b);

// ---- the Hugging Face side ------------------------------------------------------------------------

// How the GGUF tensor's data (in GGUF element order) is made from the checkpoint tensors.
enum class HfTransform : uint8_t {
  copy,        // the single source's row-major data as is
  slice,       // elements [offset, offset + count) of the single source (one part of a fused tensor)
  neg_exp,     // -exp(x) of the single source (KDA: ssm_a = -exp(A_log))
  kv_b_k,      // kv_b [H*(nope+v), r] -> per head the k rows, transposed: GGUF {nope, r, H}
  kv_b_v,      // kv_b [H*(nope+v), r] -> per head the v rows: GGUF {r, v, H}
  stack,       // one source per expert, concatenated in expert order
  fused_half,  // one fused [E, 2I, D] source: per expert rows [part*I, part*I + I)
};

struct HfSource {
  std::string name;              // full checkpoint name
  std::vector<uint64_t> shape;   // expected shape, outermost first (size-1 dims may differ)
};

// One way to make a GGUF tensor from a checkpoint. A checkpoint matches a recipe when it has every
// source; the first matching recipe of glm5_hf_recipes() is the one to use.
struct HfRecipe {
  HfTransform transform = HfTransform::copy;
  std::vector<HfSource> sources;
  uint64_t offset = 0;   // slice: first element
  uint64_t count = 0;    // slice: element count
  uint32_t part = 0;     // fused_half: 0 = gate (first half), 1 = up
};

// Prefixes of the text model in checkpoints: "model.language_model." (Glm5NextForConditionalGeneration,
// the release and save_pretrained) or "model." (text-only exports). lm_head.weight has no prefix.
inline constexpr std::string_view kHfPrefixMultimodal = "model.language_model.";
inline constexpr std::string_view kHfPrefixText = "model.";

// The recipes for one GGUF tensor, preferred first: the released checkpoint's spelling (per-expert
// weights, q/k/v_conv1d, bare hc_attn_fn, A_log under self_attn) and the spelling of transformers'
// modules (fused 3-D experts, one fused conv1d, attn_hc.fn, forget_gate.*). For `output` the second
// recipe is the tied embedding.
std::vector<HfRecipe> glm5_hf_recipes(const Glm5Hparams& hp, const Glm5TensorSpec& spec,
                                      std::string_view text_prefix);

// Every checkpoint name that any recipe of any expected tensor reads, mapped to the GGUF name it
// feeds. A fused source feeds several; the map names the first: kv_b -> attn_k_b, gate_up_proj ->
// ffn_gate_exps, conv1d -> ssm_conv1d_q.
class Glm5HfNameMap {
 public:
  Glm5HfNameMap(const Glm5Hparams& hp, std::string_view text_prefix);
  // nullptr when the name feeds no tensor of this model.
  const std::string* gguf_name(std::string_view hf_name) const;
  size_t size() const { return map_.size(); }

 private:
  std::map<std::string, std::string, std::less<>> map_;
};

// Checkpoint tensors that belong to the vision tower (skipped by convert).
bool glm5_hf_is_vision(std::string_view hf_name);

}  // namespace ferry::model
