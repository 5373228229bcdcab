#include "model/glm5/glm5_inspect.hpp"

#include <algorithm>
#include <map>
#include <set>

#include "model/glm5/glm5_gguf.hpp"
#include "model/glm5/glm5_tensors.hpp"

namespace ferry::model {
namespace {

std::string type_name(GgmlType t) {
  const auto traits = ggml_type_traits(static_cast<uint32_t>(t));
  return traits ? std::string(traits->name) : "type " + std::to_string(static_cast<uint32_t>(t));
}

std::string dims_text(const std::vector<uint64_t>& dims) {
  std::string s = "{";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "}";
}

template <class T>
std::optional<T> optional_value(Expected<T> r) {
  return r ? std::optional<T>(*r) : std::nullopt;
}

std::optional<Glm5TokenizerSummary> tokenizer_summary(const GgufFile& f) {
  if (!f.contains("tokenizer.ggml.model") && !f.contains("tokenizer.ggml.tokens")) return std::nullopt;
  Glm5TokenizerSummary t;
  if (const auto m = f.get_string("tokenizer.ggml.model")) t.model = std::string(*m);
  if (const auto p = f.get_string("tokenizer.ggml.pre")) t.pre = std::string(*p);
  if (const auto a = f.get_array("tokenizer.ggml.tokens")) t.tokens = (*a)->size();
  if (const auto a = f.get_array("tokenizer.ggml.merges")) t.merges = (*a)->size();
  t.bos = optional_value(f.get_u32("tokenizer.ggml.bos_token_id"));
  t.eos = optional_value(f.get_u32("tokenizer.ggml.eos_token_id"));
  t.eot = optional_value(f.get_u32("tokenizer.ggml.eot_token_id"));
  t.pad = optional_value(f.get_u32("tokenizer.ggml.padding_token_id"));
  if (const auto c = f.get_string("tokenizer.chat_template")) t.chat_template_bytes = c->size();
  return t;
}

// Groups in the order inspect prints them.
constexpr std::string_view kGroups[] = {
    "token embedding",        "output head",         "routed experts: gate, up", "routed experts: down",
    "shared expert",          "dense FFN",           "router",                   "KDA projections",
    "KDA state",              "MLA projections",     "attention output",         "indexer",
    "mHC mixers",             "norms",               "MTP block",
};

// The MTP block's tensors (hp known: every tensor of a block >= n_layers) make one group of their own.
void type_mix(const GgufFile& f, const Glm5Hparams* hp, Glm5FileReport& r) {
  std::map<std::string_view, std::map<GgmlType, Glm5TypeBytes>> groups;
  for (const GgufTensorInfo& t : f.tensors()) {
    const auto parsed = parse_glm5_tensor_name(t.name);
    std::string_view group = parsed ? glm5_tensor_group(parsed->first) : std::string_view("other");
    if (parsed && hp != nullptr && parsed->second >= 0 && static_cast<uint32_t>(parsed->second) >= hp->n_layers) {
      group = kGroups[14];
    }
    Glm5TypeBytes& tb = groups[group][t.type];
    tb.type = type_name(t.type);
    tb.tensors += 1;
    tb.bytes += t.n_bytes;
  }
  auto add = [&](std::string_view name) {
    const auto it = groups.find(name);
    if (it == groups.end()) return;
    Glm5TypeMix mix;
    mix.group = std::string(name);
    for (const auto& [type, tb] : it->second) {
      mix.tensors += tb.tensors;
      mix.bytes += tb.bytes;
      mix.types.push_back(tb);
    }
    std::stable_sort(mix.types.begin(), mix.types.end(), [](const auto& a, const auto& b) { return a.bytes > b.bytes; });
    r.type_mix.push_back(std::move(mix));
  };
  for (std::string_view g : kGroups) add(g);
  add("other");
}

// The layouts ferry writes for test models that the llama.cpp family cannot load (its loaders
// derive the KDA heads from attention.head_count and build dense FFNs for leading blocks only).
void llama_cpp_extensions(const GgufFile& f, const Glm5Hparams& hp, Glm5FileReport& r) {
  const std::string arch = r.architecture + ".";
  if (hp.kda_heads != hp.n_heads) {
    r.extensions.push_back(arch + std::string(glm5_key::kda_head_count) + " = " + std::to_string(hp.kda_heads) +
                           ": KDA heads differ from attention heads (" + std::to_string(hp.n_heads) +
                           "); llama.cpp-family loaders ignore the key, take the KDA heads from " + arch +
                           std::string(glm5_key::head_count) + " and refuse the file (attn_q has the wrong shape)");
  }
  const uint32_t lead = glm5_leading_dense_blocks(hp);
  for (uint32_t i = lead; i < hp.n_layers; ++i) {
    if (hp.ffn_kinds[i] != FfnKind::dense) continue;
    r.extensions.push_back(arch + std::string(glm5_key::feed_forward_types) + ": block " + std::to_string(i) +
                           " is dense after a MoE block; llama.cpp-family loaders support only leading dense blocks (" +
                           arch + std::string(glm5_key::leading_dense_block_count) + " = " + std::to_string(lead) +
                           ") and refuse the file (ffn_gate_inp not found)");
    break;
  }
  (void)f;
}

// Checks the file's tensors against the catalogue and fills the per-block plan.
void plan_blocks(const GgufFile& f, const Glm5Hparams& hp, Glm5FileReport& r) {
  std::set<std::string, std::less<>> expected;
  auto check = [&](const Glm5TensorSpec& spec) -> const GgufTensorInfo* {
    expected.insert(spec.name);
    const GgufTensorInfo* t = f.find_tensor(spec.name);
    if (t == nullptr) {
      if (!spec.optional) r.problems.push_back("missing tensor " + spec.name + " " + dims_text(spec.dims));
      return nullptr;
    }
    if (!same_ggml_dims(t->dims, spec.dims)) {
      r.problems.push_back("tensor " + spec.name + " has dims " + dims_text(t->dims) + ", expected " +
                           dims_text(spec.dims));
    }
    return t;
  };
  for (const Glm5TensorSpec& spec : glm5_global_tensors(hp)) {
    if (const GgufTensorInfo* t = check(spec)) r.global_bytes += t->n_bytes;
  }
  for (uint32_t il = 0; il < glm5_block_count(hp); ++il) {
    Glm5BlockPlan b;
    b.index = il;
    b.nextn = glm5_is_nextn(hp, il);
    b.attention = glm5_layer_kind(hp, il);
    b.indexer = glm5_has_indexer(hp, il);
    b.ffn = glm5_ffn_kind(hp, il);
    std::string types[3];
    for (const Glm5TensorSpec& spec : glm5_layer_tensors(hp, il)) {
      const GgufTensorInfo* t = check(spec);
      if (t == nullptr) continue;
      b.bytes += t->n_bytes;
      if (!spec.expert) continue;
      b.expert_bytes += t->n_bytes;
      const int slot = spec.role == Glm5Tensor::ffn_gate_exps ? 0 : spec.role == Glm5Tensor::ffn_up_exps ? 1 : 2;
      types[slot] = type_name(t->type);
    }
    if (b.ffn == FfnKind::moe) {
      b.bytes_per_expert = hp.n_experts > 0 ? b.expert_bytes / hp.n_experts : 0;
      b.expert_types = types[0] + "/" + types[1] + "/" + types[2];
    }
    r.expert_bytes += b.expert_bytes;
    r.blocks.push_back(std::move(b));
  }
  r.dense_bytes = r.tensor_bytes - r.expert_bytes;

  std::vector<std::string> unexpected;
  for (const GgufTensorInfo& t : f.tensors()) {
    if (!expected.contains(t.name)) unexpected.push_back(t.name);
  }
  if (!unexpected.empty()) {
    std::string list;
    for (size_t i = 0; i < unexpected.size() && i < 5; ++i) list += (i ? ", " : "") + unexpected[i];
    if (unexpected.size() > 5) list += ", ...";
    r.problems.push_back(std::to_string(unexpected.size()) + " tensor(s) the model does not use: " + list);
  }

  uint64_t dsa = 0, kda = 0;
  for (uint32_t il = 0; il < glm5_block_count(hp); ++il) (glm5_layer_kind(hp, il) == LayerKind::dsa ? dsa : kda) += 1;
  r.kv_values_per_token = dsa * (uint64_t{hp.kv_lora_rank} + 2 * uint64_t{hp.index_head_dim});
  const uint64_t di = uint64_t{hp.kda_heads} * hp.kda_head_dim;
  const uint64_t recurrent = uint64_t{hp.kda_heads} * hp.kda_head_dim * hp.kda_head_dim;
  const uint64_t conv = (hp.conv_kernel > 0 ? hp.conv_kernel - 1 : 0) * 3 * di;
  r.kda_state_bytes_per_slot = kda * (recurrent + conv) * sizeof(float);
}

}  // namespace

Glm5FileReport inspect_glm5_gguf(const GgufFile& f) {
  Glm5FileReport r;
  r.version = f.version();
  r.file_size = f.file_size();
  r.alignment = f.alignment();
  r.metadata_keys = f.metadata().size();
  if (const auto a = f.get_string("general.architecture")) r.architecture = std::string(*a);
  if (const auto n = f.get_string("general.name")) r.name = std::string(*n);
  r.file_type = optional_value(f.get_u32("general.file_type"));
  r.quantization_version = optional_value(f.get_u32("general.quantization_version"));

  std::map<GgmlType, Glm5TypeBytes> by_type;
  for (const GgufTensorInfo& t : f.tensors()) {
    Glm5TypeBytes& tb = by_type[t.type];
    tb.type = type_name(t.type);
    tb.tensors += 1;
    tb.bytes += t.n_bytes;
    r.tensor_count += 1;
    r.tensor_bytes += t.n_bytes;
  }
  for (auto& [type, tb] : by_type) r.by_type.push_back(tb);
  std::stable_sort(r.by_type.begin(), r.by_type.end(), [](const auto& a, const auto& b) { return a.bytes > b.bytes; });

  r.tokenizer = tokenizer_summary(f);
  Expected<Glm5Hparams> hp = glm5_hparams_from_gguf(f);
  if (!hp) {
    r.problems.push_back(hp.error().message);
    r.dense_bytes = r.tensor_bytes;
    type_mix(f, nullptr, r);
    return r;
  }
  r.hparams = std::move(hp).value();
  type_mix(f, &*r.hparams, r);
  plan_blocks(f, *r.hparams, r);
  llama_cpp_extensions(f, *r.hparams, r);
  return r;
}

std::string_view glm5_tensor_group(Glm5Tensor role) {
  using T = Glm5Tensor;
  switch (role) {
    case T::token_embd: return kGroups[0];
    case T::output: return kGroups[1];
    case T::ffn_gate_exps: case T::ffn_up_exps: return kGroups[2];
    case T::ffn_down_exps: return kGroups[3];
    case T::ffn_gate_shexp: case T::ffn_up_shexp: case T::ffn_down_shexp: return kGroups[4];
    case T::ffn_gate: case T::ffn_up: case T::ffn_down: return kGroups[5];
    case T::ffn_gate_inp: case T::ffn_exp_probs_b: return kGroups[6];
    case T::attn_q: case T::attn_k: case T::attn_v: case T::ssm_f_a: case T::ssm_f_b: case T::ssm_g_a:
    case T::ssm_g_b: case T::ssm_beta: return kGroups[7];
    case T::ssm_conv1d_q: case T::ssm_conv1d_k: case T::ssm_conv1d_v: case T::ssm_a: case T::ssm_dt_bias:
    case T::ssm_norm: return kGroups[8];
    case T::attn_q_a: case T::attn_q_b: case T::attn_kv_a_mqa: case T::attn_k_b: case T::attn_v_b: return kGroups[9];
    case T::attn_output: return kGroups[10];
    case T::indexer_attn_q_b: case T::indexer_attn_k: case T::indexer_k_norm: case T::indexer_k_norm_bias:
    case T::indexer_proj: case T::indexer_compressor_gate: case T::indexer_compressor_ape: return kGroups[11];
    case T::hc_attn_fn: case T::hc_attn_base: case T::hc_attn_scale: case T::hc_ffn_fn: case T::hc_ffn_base:
    case T::hc_ffn_scale: return kGroups[12];
    case T::output_norm: case T::attn_norm: case T::ffn_norm: case T::attn_q_a_norm: case T::attn_kv_a_norm:
      return kGroups[13];
    case T::nextn_eh_proj: case T::nextn_enorm: case T::nextn_hnorm: case T::nextn_shared_head_norm:
    case T::nextn_embed_tokens: case T::nextn_shared_head_head: return kGroups[14];
  }
  return "other";
}

}  // namespace ferry::model
