// Glm5Hparams from GGUF metadata (the key table is in glm5_gguf.hpp).
#include <optional>

#include "model/glm5/glm5_gguf.hpp"
#include "model/glm5/glm5_tensors.hpp"

namespace ferry::model {
namespace {

// Typed reads of "{arch}.{suffix}" keys; keeps the first error, after which reads return defaults.
class KeyReader {
 public:
  KeyReader(const GgufFile& file, std::string arch) : f_(file), prefix_(std::move(arch) + ".") {}

  std::string key(std::string_view suffix) const { return prefix_ + std::string(suffix); }
  bool has(std::string_view suffix) const { return f_.contains(key(suffix)); }

  uint32_t u32(std::string_view suffix) { return take(f_.get_u32(key(suffix)), 0u); }
  uint32_t u32_or(std::string_view suffix, uint32_t fallback) { return has(suffix) ? u32(suffix) : fallback; }
  float f32(std::string_view suffix) { return take(f_.get_f32(key(suffix)), 0.0f); }
  float f32_or(std::string_view suffix, float fallback) { return has(suffix) ? f32(suffix) : fallback; }
  bool boolean_or(std::string_view suffix, bool fallback) {
    return has(suffix) ? take(f_.get_bool(key(suffix)), fallback) : fallback;
  }
  std::vector<int64_t> i64_array(std::string_view suffix) { return take(f_.get_i64_array(key(suffix)), {}); }
  std::vector<uint32_t> u32_array(std::string_view suffix) { return take(f_.get_u32_array(key(suffix)), {}); }
  // A per-layer flag array that files store as integers (ferry, the unsloth converter) or as bools
  // (mainline's conversion/glm.py writes indexer.types as [t == "full" ...]).
  std::vector<uint32_t> flag_array(std::string_view suffix) {
    if (const GgufValue* v = f_.find(key(suffix))) {
      if (const auto* a = std::get_if<GgufArray>(v)) {
        if (const auto* flags = a->as<bool>()) return {flags->begin(), flags->end()};
      }
    }
    return u32_array(suffix);
  }
  // A per-layer float that files store either as an array or as one scalar.
  std::vector<float> f32_scalar_or_array(std::string_view suffix) {
    const GgufValue* v = f_.find(key(suffix));
    if (v != nullptr && gguf_value_type(*v) != GgufValueType::Array) return {f32(suffix)};
    return take(f_.get_f32_array(key(suffix)), {});
  }

  const Status& error() const { return error_; }

 private:
  template <class V>
  V take(Expected<V> r, V fallback) {
    if (r) return std::move(r.value());
    if (!error_) error_ = r.error();
    return fallback;
  }

  const GgufFile& f_;
  std::string prefix_;
  Status error_;
};

}  // namespace

Expected<std::string> glm5_gguf_arch(const GgufFile& file) {
  const Expected<std::string_view> arch = file.get_string("general.architecture");
  if (!arch) return arch.error();
  if (*arch == kGlm5Arch || *arch == kGlm5ArchMainline) return std::string(*arch);
  return Error(ErrorCode::unsupported,
               "general.architecture is '" + std::string(arch->substr(0, 64)) + "', expected '" +
                   std::string(kGlm5Arch) + "' (or '" + std::string(kGlm5ArchMainline) + "')");
}

Expected<Glm5Hparams> glm5_hparams_from_gguf(const GgufFile& file) {
  const Expected<std::string> arch = glm5_gguf_arch(file);
  if (!arch) return arch.error();
  KeyReader k(file, *arch);
  namespace key = glm5_key;
  const auto s = [](auto v) { return std::to_string(v); };

  Glm5Hparams hp;
  const uint32_t blocks = k.u32(key::block_count);
  hp.n_nextn_layers = k.u32_or(key::nextn_predict_layers, 0);
  hp.context_length = k.u32_or(key::context_length, hp.context_length);
  hp.hidden_size = k.u32(key::embedding_length);
  hp.dense_ffn = k.u32(key::feed_forward_length);
  const uint32_t leading_dense = k.u32(key::leading_dense_block_count);
  hp.n_heads = k.u32(key::head_count);
  if (const GgufValue* v = file.find(k.key(key::head_count_kv)); v && gguf_value_type(*v) != GgufValueType::Array) {
    return Error(k.key(key::head_count_kv) + " is a " + gguf_value_type_name(gguf_value_type(*v)) +
                 ", expected a per-block array (0 = KDA block, 1 = DSA block)");
  }
  const std::vector<int64_t> head_count_kv = k.i64_array(key::head_count_kv);
  hp.q_lora_rank = k.u32(key::q_lora_rank);
  hp.kv_lora_rank = k.u32(key::kv_lora_rank);
  const uint32_t rope_dim = k.u32_or(key::rope_dimension_count, 0);
  hp.qk_nope_head_dim = k.u32(key::key_length_mla);
  hp.v_head_dim = k.u32(key::value_length_mla);
  hp.rms_eps = k.f32(key::rms_eps);
  hp.index_norm_eps = k.f32_or(key::norm_eps, 1e-6f);
  hp.conv_kernel = k.u32(key::conv_kernel);
  hp.kda_head_dim = k.u32(key::kda_head_dim);
  // Mainline's converter writes the bound only when the config has one; -5 is transformers' default.
  hp.kda_lower_bound = k.f32_or(key::kda_gate_lower_bound, -5.0f);
  hp.index_n_heads = k.u32(key::indexer_head_count);
  hp.index_head_dim = k.u32(key::indexer_key_length);
  hp.index_topk = k.u32(key::indexer_top_k);
  hp.index_select_tail = k.boolean_or(key::indexer_kpool_select_tail, true);
  hp.hc_mult = k.u32(key::hc_count);
  hp.hc_sinkhorn_iters = k.u32(key::hc_sinkhorn_iterations);
  hp.hc_eps = k.f32(key::hc_epsilon);
  hp.n_experts = k.u32(key::expert_count);
  hp.n_experts_used = k.u32(key::expert_used_count);
  hp.moe_ffn = k.u32(key::expert_feed_forward_length);
  hp.n_shared_experts = k.u32(key::expert_shared_count);
  hp.n_group = k.u32_or(key::expert_group_count, 1);
  hp.topk_group = k.u32_or(key::expert_group_used_count, 1);
  hp.routed_scaling = k.f32(key::expert_weights_scale);
  hp.norm_topk_prob = k.boolean_or(key::expert_weights_norm, false);
  const std::vector<float> clamp_exp = k.f32_scalar_or_array(key::swiglu_clamp_exp);
  if (k.error()) return *k.error();

  // The k-pool size has two spellings; a file with both must agree.
  const bool has_kpool = k.has(key::indexer_kpool), has_block = k.has(key::indexer_block_size);
  if (!has_kpool && !has_block) {
    return Error(k.key(key::indexer_kpool) + " is missing (and so is " + k.key(key::indexer_block_size) + ")");
  }
  hp.index_kpool = has_kpool ? k.u32(key::indexer_kpool) : k.u32(key::indexer_block_size);
  if (has_kpool && has_block && !k.error() && k.u32(key::indexer_block_size) != hp.index_kpool) {
    return Error(k.key(key::indexer_block_size) + " is " + s(k.u32(key::indexer_block_size)) +
                 " but " + k.key(key::indexer_kpool) + " is " + s(hp.index_kpool));
  }
  hp.kda_heads = k.u32_or(key::kda_head_count, hp.n_heads);
  if (k.error()) return *k.error();

  if (hp.n_nextn_layers >= blocks) {
    return Error(k.key(key::nextn_predict_layers) + " is " + s(hp.n_nextn_layers) + ", expected less than " +
                 k.key(key::block_count) + " = " + s(blocks));
  }
  hp.n_layers = blocks - hp.n_nextn_layers;

  if (k.has(key::vocab_size)) {
    hp.vocab_size = k.u32(key::vocab_size);
  } else if (const auto tokens = file.get_array("tokenizer.ggml.tokens")) {
    hp.vocab_size = static_cast<uint32_t>((*tokens)->size());
  } else if (const GgufTensorInfo* embd = file.find_tensor("token_embd.weight"); embd && embd->dims.size() == 2) {
    hp.vocab_size = static_cast<uint32_t>(embd->dims[1]);
  } else {
    return Error(k.key(key::vocab_size) + " is missing (and there is no tokenizer.ggml.tokens or token_embd.weight)");
  }

  // One entry per block (the published files, ferry); mainline's converter at one point wrote one per
  // trunk block only (its MTP blocks are DSA blocks either way).
  if (head_count_kv.size() != blocks && head_count_kv.size() != hp.n_layers) {
    return Error(k.key(key::head_count_kv) + " has " + s(head_count_kv.size()) +
                 " entries, expected one per block (block_count = " + s(blocks) + ") or per trunk block (" +
                 s(hp.n_layers) + ")");
  }
  for (uint32_t i = 0; i < head_count_kv.size(); ++i) {
    if (i < hp.n_layers) {
      hp.layer_kinds.push_back(head_count_kv[i] == 0 ? LayerKind::kda : LayerKind::dsa);
    } else if (head_count_kv[i] == 0) {
      return Error(k.key(key::head_count_kv) + "[" + s(i) + "] is 0 (KDA), but block " + s(i) +
                   " is an MTP block, which is a DSA block");
    }
  }
  if (leading_dense > hp.n_layers) {
    return Error(k.key(key::leading_dense_block_count) + " is " + s(leading_dense) + ", more than the " +
                 s(hp.n_layers) + " trunk blocks");
  }
  if (k.has(key::feed_forward_types)) {
    const std::vector<uint32_t> types = k.u32_array(key::feed_forward_types);
    if (k.error()) return *k.error();
    if (types.size() != hp.n_layers) {
      return Error(k.key(key::feed_forward_types) + " has " + s(types.size()) + " entries, expected " +
                   s(hp.n_layers) + " (one per trunk block)");
    }
    for (uint32_t t : types) hp.ffn_kinds.push_back(t != 0 ? FfnKind::dense : FfnKind::moe);
    if (glm5_leading_dense_blocks(hp) != leading_dense) {
      return Error(k.key(key::leading_dense_block_count) + " is " + s(leading_dense) + " but " +
                   k.key(key::feed_forward_types) + " starts with " + s(glm5_leading_dense_blocks(hp)) +
                   " dense blocks");
    }
  } else {
    for (uint32_t i = 0; i < hp.n_layers; ++i) hp.ffn_kinds.push_back(i < leading_dense ? FfnKind::dense : FfnKind::moe);
  }

  if (k.has(key::indexer_types)) {
    const std::vector<uint32_t> types = k.flag_array(key::indexer_types);
    if (k.error()) return *k.error();
    if (types.size() != hp.n_layers && types.size() != blocks) {
      return Error(k.key(key::indexer_types) + " has " + s(types.size()) + " entries, expected " +
                   s(hp.n_layers) + " (one per trunk block)");
    }
    for (uint32_t i = 0; i < hp.n_layers; ++i) hp.indexer_full.push_back(types[i] != 0);
  }

  if (rope_dim != 0) {
    return Error(ErrorCode::unsupported,
                 k.key(key::rope_dimension_count) + " is " + s(rope_dim) + ", expected 0 (glm5next has no RoPE)");
  }
  for (auto [suffix, expected] : {std::pair{key::key_length, hp.kv_lora_rank}, std::pair{key::value_length, hp.kv_lora_rank},
                                  std::pair{key::expert_shared_feed_forward_length, hp.moe_ffn * hp.n_shared_experts},
                                  std::pair{key::expert_gating_func, kGlm5GatingSigmoid}}) {
    if (!k.has(suffix)) continue;
    const uint32_t v = k.u32(suffix);
    if (!k.error() && v != expected) {
      return Error(k.key(suffix) + " is " + s(v) + ", expected " + s(expected));
    }
  }
  if (clamp_exp.empty()) return Error(k.key(key::swiglu_clamp_exp) + " is an empty array");
  std::vector<float> clamps = clamp_exp;
  if (k.has(key::swiglu_clamp_shexp)) {
    const std::vector<float> shexp = k.f32_scalar_or_array(key::swiglu_clamp_shexp);
    clamps.insert(clamps.end(), shexp.begin(), shexp.end());
  }
  if (k.error()) return *k.error();
  hp.swiglu_limit = clamps[0];
  for (float c : clamps) {
    if (c != hp.swiglu_limit) {
      return Error(ErrorCode::unsupported,
                   k.key(key::swiglu_clamp_exp) + " holds different limits (" + s(hp.swiglu_limit) + " and " + s(c) +
                       "); ferry supports one SwiGLU limit for every layer");
    }
  }

  if (const std::vector<std::string> bad = hp.validate(); !bad.empty()) {
    std::string all;
    for (const std::string& b : bad) all += (all.empty() ? "" : "; ") + b;
    return Error("GGUF metadata (" + *arch + ") is inconsistent: " + all);
  }
  return hp;
}

}  // namespace ferry::model
