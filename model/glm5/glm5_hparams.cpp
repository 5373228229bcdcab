// Glm5Hparams: consistency checks and the reader of Hugging Face config.json files. The GGUF
// metadata reader is in glm5_hparams_gguf.cpp.
//
// config.json fields read (transformers' Glm5NextTextConfig; defaults are the class defaults):
//   vocab_size, hidden_size, intermediate_size, moe_intermediate_size, num_hidden_layers,
//   num_attention_heads (= num_key_value_heads), n_shared_experts, n_routed_experts
//   (num_local_experts), num_experts_per_tok, n_group, topk_group, routed_scaling_factor,
//   norm_topk_prob, swiglu_limit, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim (must
//   be 0), v_head_dim, index_n_heads, index_head_dim, index_topk, index_kpool,
//   index_kpool_always_select_tail, linear_num_heads, linear_head_dim, linear_conv_kernel_dim,
//   linear_lower_bound (all four overridden by linear_attn_config {num_heads, head_dim,
//   short_conv_kernel_size, gate_lower_bound, safe_gate}, as transformers does), hc_mult,
//   hc_sinkhorn_iters, hc_eps, rms_norm_eps, max_position_embeddings, layer_types, mlp_layer_types
//   (else first_k_dense_replace), indexer_types (else index_topk_pattern / index_topk_freq /
//   index_skip_topk_offset), num_nextn_predict_layers, hidden_act (must be silu), attention_bias
//   (must be false).
//
// Spellings of transformers' glm5_next configuration history, all read:
//   - layer_types names a DSA layer "deepseek_sparse_attention" (5.17 to 5.23), "indexed_attention"
//     (5.24 and later) or "full_attention" (mapped to the DSA kind by every version);
//   - linear_attn_config's bound is "gate_lower_bound" with safe_gate defaulting to true (the
//     release), or "lower_bound" with safe_gate defaulting to false (the first port).
#include "model/glm5/glm5_hparams.hpp"

#include <simdjson.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

namespace ferry::model {

std::vector<std::string> Glm5Hparams::validate() const {
  std::vector<std::string> bad;
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) bad.push_back(what);
  };
  auto finite = [](float v) { return std::isfinite(v); };
  const auto s = [](auto v) { return std::to_string(v); };

  need(vocab_size > 0, "vocab_size is 0");
  need(hidden_size > 0, "hidden_size is 0");
  need(n_layers > 0, "n_layers is 0");
  need(n_nextn_layers <= 16, "n_nextn_layers is " + s(n_nextn_layers) + ", expected at most 16");
  need(finite(rms_eps) && rms_eps > 0, "rms_eps is " + s(rms_eps) + ", expected > 0");
  need(layer_kinds.size() == n_layers,
       "layer_kinds has " + s(layer_kinds.size()) + " entries, expected n_layers = " + s(n_layers));
  need(ffn_kinds.size() == n_layers,
       "ffn_kinds has " + s(ffn_kinds.size()) + " entries, expected n_layers = " + s(n_layers));
  need(indexer_full.empty() || indexer_full.size() == n_layers,
       "indexer_full has " + s(indexer_full.size()) + " entries, expected 0 or n_layers = " + s(n_layers));

  bool any_kda = false, any_dsa = n_nextn_layers > 0, any_moe = n_nextn_layers > 0, any_dense = false;
  for (LayerKind k : layer_kinds) (k == LayerKind::kda ? any_kda : any_dsa) = true;
  for (FfnKind k : ffn_kinds) (k == FfnKind::moe ? any_moe : any_dense) = true;

  if (any_dense) need(dense_ffn > 0, "dense_ffn is 0 but some layers have a dense FFN");
  if (any_moe) {
    need(moe_ffn > 0, "moe_ffn is 0 but some layers are MoE");
    need(n_experts >= 2, "n_experts is " + s(n_experts) + ", expected at least 2");
    need(n_experts_used >= 1 && n_experts_used <= n_experts,
         "n_experts_used is " + s(n_experts_used) + ", expected 1.." + s(n_experts));
    need(n_group >= 1 && n_experts % std::max(n_group, 1u) == 0 && n_experts / std::max(n_group, 1u) >= 2,
         "n_group is " + s(n_group) + ", expected a divisor of n_experts = " + s(n_experts) +
             " leaving at least 2 experts per group");
    need(topk_group >= 1 && topk_group <= n_group,
         "topk_group is " + s(topk_group) + ", expected 1..n_group = " + s(n_group));
    if (n_group >= 1 && topk_group >= 1 && topk_group <= n_group && n_experts_used <= n_experts) {
      need(uint64_t{n_experts_used} <= uint64_t{topk_group} * (n_experts / n_group),
           "n_experts_used is " + s(n_experts_used) + ", more than the " + s(topk_group) +
               " kept groups hold");
    }
    need(finite(routed_scaling) && routed_scaling > 0, "routed_scaling is " + s(routed_scaling) + ", expected > 0");
  }
  need(finite(swiglu_limit) && swiglu_limit > 0, "swiglu_limit is " + s(swiglu_limit) + ", expected > 0");

  if (any_dsa) {
    need(n_heads > 0, "n_heads is 0");
    need(q_lora_rank > 0, "q_lora_rank is 0 (DSA attention needs the q LoRA)");
    need(kv_lora_rank > 0, "kv_lora_rank is 0");
    need(qk_nope_head_dim > 0, "qk_nope_head_dim is 0");
    need(v_head_dim > 0, "v_head_dim is 0");
    need(index_n_heads > 0, "index_n_heads is 0");
    need(index_head_dim > 0, "index_head_dim is 0");
    need(index_kpool >= 1, "index_kpool is 0, expected at least 1");
    need(index_topk > 0 && index_kpool >= 1 && index_topk % std::max(index_kpool, 1u) == 0,
         "index_topk is " + s(index_topk) + ", expected a positive multiple of index_kpool = " + s(index_kpool));
    need(finite(index_norm_eps) && index_norm_eps > 0, "index_norm_eps is " + s(index_norm_eps) + ", expected > 0");
    // A shared indexer reuses the top-k of the nearest full DSA layer before it.
    bool seen_full = false;
    for (uint32_t i = 0; i < layer_kinds.size(); ++i) {
      if (layer_kinds[i] != LayerKind::dsa) continue;
      if (indexer_is_full(i)) {
        seen_full = true;
      } else if (!seen_full) {
        bad.push_back("layer " + s(i) + " has a shared indexer but no full DSA layer precedes it");
        break;
      }
    }
  }
  if (any_kda) {
    need(kda_heads > 0, "kda_heads is 0");
    need(kda_head_dim > 0, "kda_head_dim is 0");
    need(conv_kernel >= 1, "conv_kernel is 0");
    need(finite(kda_lower_bound) && kda_lower_bound < 0,
         "kda_lower_bound is " + s(kda_lower_bound) + ", expected < 0 (it scales the sigmoid decay gate)");
  }
  need(hc_mult >= 1, "hc_mult is 0");
  need(hc_sinkhorn_iters >= 1, "hc_sinkhorn_iters is 0");
  need(finite(hc_eps) && hc_eps >= 0, "hc_eps is " + s(hc_eps) + ", expected >= 0");
  return bad;
}

namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;
using simdjson::dom::object;

std::string json_text_of(const element& e) {
  std::ostringstream os;
  os << e;
  std::string t = os.str();
  if (t.size() > 60) t = t.substr(0, 57) + "...";
  return t;
}

// Reads typed fields of one JSON object; the first problem found is kept and later reads are no-ops.
class Fields {
 public:
  Fields(object obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  std::optional<element> get(const char* key) const {
    element e;
    if (obj_[key].get(e) != simdjson::SUCCESS) return std::nullopt;
    return e;
  }
  bool has_non_null(const char* key) const {
    const auto e = get(key);
    return e && !e->is_null();
  }
  std::string name(const char* key) const { return where_ + key; }

  uint32_t u32(const char* key, uint32_t fallback) {
    const auto e = get(key);
    if (!e || e->is_null()) return fallback;
    uint64_t v = 0;
    if (e->get_uint64().get(v) != simdjson::SUCCESS || v > std::numeric_limits<uint32_t>::max()) {
      fail(name(key) + " is " + json_text_of(*e) + ", expected an unsigned 32-bit integer");
      return fallback;
    }
    return static_cast<uint32_t>(v);
  }
  float f32(const char* key, float fallback) {
    const auto e = get(key);
    if (!e || e->is_null()) return fallback;
    double v = 0;
    if (e->get_double().get(v) != simdjson::SUCCESS || !std::isfinite(v) ||
        std::fabs(v) > std::numeric_limits<float>::max()) {
      fail(name(key) + " is " + json_text_of(*e) + ", expected a finite number");
      return fallback;
    }
    return static_cast<float>(v);
  }
  bool boolean(const char* key, bool fallback) {
    const auto e = get(key);
    if (!e || e->is_null()) return fallback;
    bool v = false;
    if (e->get_bool().get(v) != simdjson::SUCCESS) {
      fail(name(key) + " is " + json_text_of(*e) + ", expected true or false");
      return fallback;
    }
    return v;
  }
  std::optional<std::string> str(const char* key) {
    const auto e = get(key);
    if (!e || e->is_null()) return std::nullopt;
    std::string_view v;
    if (e->get_string().get(v) != simdjson::SUCCESS) {
      fail(name(key) + " is " + json_text_of(*e) + ", expected a string");
      return std::nullopt;
    }
    return std::string(v);
  }
  // A list of strings, each one of `allowed`; returns the index into `allowed` per entry.
  std::optional<std::vector<size_t>> choices(const char* key, std::initializer_list<std::string_view> allowed) {
    const auto e = get(key);
    if (!e || e->is_null()) return std::nullopt;
    simdjson::dom::array arr;
    if (e->get_array().get(arr) != simdjson::SUCCESS) {
      fail(name(key) + " is " + json_text_of(*e) + ", expected a list of strings");
      return std::nullopt;
    }
    std::vector<size_t> out;
    size_t i = 0;
    for (element item : arr) {
      std::string_view v;
      size_t found = allowed.size();
      if (item.get_string().get(v) == simdjson::SUCCESS) {
        size_t j = 0;
        for (std::string_view a : allowed) {
          if (a == v) found = j;
          ++j;
        }
      }
      if (found == allowed.size()) {
        std::string list;
        for (std::string_view a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
        fail(name(key) + "[" + std::to_string(i) + "] is " + json_text_of(item) + ", expected one of " + list);
        return std::nullopt;
      }
      out.push_back(found);
      ++i;
    }
    return out;
  }

  void fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
  }
  const std::string& error() const { return error_; }

 private:
  object obj_;
  std::string where_;
  std::string error_;
};

// transformers' defaults for a per-layer schedule that config.json leaves out.
std::vector<bool> default_indexer_full(Fields& f, uint32_t n_layers) {
  std::vector<bool> full(n_layers, true);
  if (const auto e = f.get("index_topk_pattern"); e && !e->is_null()) {
    std::string_view pattern;
    if (e->get_string().get(pattern) == simdjson::SUCCESS) {
      if (pattern.size() != n_layers) {
        f.fail(f.name("index_topk_pattern") + " has " + std::to_string(pattern.size()) +
               " letters, expected num_hidden_layers = " + std::to_string(n_layers));
        return full;
      }
      for (uint32_t i = 0; i < n_layers; ++i) {
        if (pattern[i] != 'F' && pattern[i] != 'S') {
          f.fail(f.name("index_topk_pattern") + " has '" + std::string(1, pattern[i]) + "' at " +
                 std::to_string(i) + ", expected F or S");
          return full;
        }
        full[i] = pattern[i] == 'F';
      }
      return full;
    }
    const auto picks = f.choices("index_topk_pattern", {"full", "shared"});
    if (picks && picks->size() != n_layers) {
      f.fail(f.name("index_topk_pattern") + " has " + std::to_string(picks->size()) +
             " entries, expected num_hidden_layers = " + std::to_string(n_layers));
    } else if (picks) {
      for (uint32_t i = 0; i < n_layers; ++i) full[i] = (*picks)[i] == 0;
    }
    return full;
  }
  const uint32_t freq = std::max(f.u32("index_topk_freq", 1), 1u);
  const uint32_t offset = f.u32("index_skip_topk_offset", 2);
  for (uint32_t i = 0; i < n_layers; ++i) {
    const int64_t shifted = std::max<int64_t>(int64_t{i} - offset + 1, 0);
    full[i] = shifted % freq == 0;
  }
  return full;
}

// Parses config.json text; errors start with `label` (the file's name or path).
Expected<Glm5Hparams> from_config_json(std::string_view json_text, const std::string& label) {
  auto fail = [&](std::string message) -> Expected<Glm5Hparams> { return Error(label + ": " + std::move(message)); };
  // A glm5_next variant that ferry's math does not implement.
  auto unsupported = [&](std::string message) -> Expected<Glm5Hparams> {
    return Error(ErrorCode::unsupported, label + ": " + std::move(message));
  };
  simdjson::dom::parser parser;
  const simdjson::padded_string padded(json_text);
  element root_el;
  if (const auto err = parser.parse(padded).get(root_el); err != simdjson::SUCCESS) {
    return fail(std::string("not valid JSON: ") + simdjson::error_message(err));
  }
  object root;
  if (root_el.get_object().get(root) != simdjson::SUCCESS) return fail("the top level is not a JSON object");

  Fields top(root, "");
  const std::optional<std::string> model_type = top.str("model_type");
  if (!top.error().empty()) return fail(top.error());
  object text_obj = root;
  std::string where;
  if (const auto tc = top.get("text_config"); tc && !tc->is_null()) {
    if (tc->get_object().get(text_obj) != simdjson::SUCCESS) return fail("text_config is not a JSON object");
    where = "text_config.";
    if (model_type && *model_type != "glm5_next") {
      return unsupported("model_type is '" + *model_type + "', expected 'glm5_next'");
    }
  } else if (!model_type) {
    return fail("has no model_type (expected 'glm5_next')");
  } else if (*model_type != "glm5_next" && *model_type != "glm5_next_text") {
    return unsupported("model_type is '" + *model_type + "', expected 'glm5_next'");
  }
  Fields f(text_obj, where);
  if (!where.empty()) {
    if (const auto t = f.str("model_type"); t && *t != "glm5_next_text") {
      return unsupported(f.name("model_type") + " is '" + *t + "', expected 'glm5_next_text'");
    }
  }

  Glm5Hparams hp;
  hp.vocab_size = f.u32("vocab_size", 154880);
  hp.hidden_size = f.u32("hidden_size", 4096);
  hp.dense_ffn = f.u32("intermediate_size", 12288);
  hp.moe_ffn = f.u32("moe_intermediate_size", 2048);
  hp.n_layers = f.u32("num_hidden_layers", 45);
  hp.n_heads = f.u32("num_attention_heads", 64);
  const uint32_t kv_heads = f.u32("num_key_value_heads", hp.n_heads);
  hp.n_shared_experts = f.u32("n_shared_experts", 1);
  hp.n_experts = f.has_non_null("n_routed_experts") ? f.u32("n_routed_experts", 288) : f.u32("num_local_experts", 288);
  hp.routed_scaling = f.f32("routed_scaling_factor", 2.5f);
  hp.kv_lora_rank = f.u32("kv_lora_rank", 512);
  if (const auto e = f.get("q_lora_rank"); e && e->is_null()) {
    return unsupported(f.name("q_lora_rank") + " is null: DSA attention needs the q LoRA");
  }
  hp.q_lora_rank = f.u32("q_lora_rank", 1536);
  const uint32_t rope_dim = f.u32("qk_rope_head_dim", 0);
  hp.v_head_dim = f.u32("v_head_dim", 256);
  hp.qk_nope_head_dim = f.u32("qk_nope_head_dim", 256);
  hp.n_group = f.u32("n_group", 1);
  hp.topk_group = f.u32("topk_group", 1);
  hp.n_experts_used = f.u32("num_experts_per_tok", 8);
  hp.norm_topk_prob = f.boolean("norm_topk_prob", true);
  hp.context_length = f.u32("max_position_embeddings", 1048576);
  hp.rms_eps = f.f32("rms_norm_eps", 1e-5f);
  hp.index_topk = f.u32("index_topk", 2048);
  hp.index_head_dim = f.u32("index_head_dim", 128);
  hp.index_n_heads = f.u32("index_n_heads", 32);
  hp.index_kpool = f.u32("index_kpool", 16);
  hp.index_select_tail = f.boolean("index_kpool_always_select_tail", true);
  hp.index_norm_eps = 1e-6f;  // transformers builds the indexer's k LayerNorm with eps 1e-6, not from config
  hp.swiglu_limit = f.f32("swiglu_limit", 10.0f);
  hp.kda_head_dim = f.u32("linear_head_dim", 128);
  hp.kda_heads = f.u32("linear_num_heads", 64);
  hp.conv_kernel = f.u32("linear_conv_kernel_dim", 4);
  std::optional<float> lower_bound;
  if (f.has_non_null("linear_lower_bound") || !f.get("linear_lower_bound")) {
    lower_bound = f.f32("linear_lower_bound", -5.0f);
  }
  hp.hc_mult = f.u32("hc_mult", 4);
  hp.hc_eps = f.f32("hc_eps", 1e-6f);
  hp.hc_sinkhorn_iters = f.u32("hc_sinkhorn_iters", 20);
  hp.n_nextn_layers = f.u32("num_nextn_predict_layers", 0);
  const std::optional<std::string> act = f.str("hidden_act");
  const bool attention_bias = f.boolean("attention_bias", false);
  if (!f.error().empty()) return fail(f.error());

  // linear_attn_config (the release's spelling) overrides the linear_* fields, as in transformers.
  if (const auto lac = f.get("linear_attn_config"); lac && !lac->is_null()) {
    object lo;
    if (lac->get_object().get(lo) != simdjson::SUCCESS) {
      return fail(f.name("linear_attn_config") + " is not a JSON object");
    }
    Fields l(lo, f.name("linear_attn_config") + ".");
    hp.kda_head_dim = l.u32("head_dim", hp.kda_head_dim);
    hp.kda_heads = l.u32("num_heads", hp.kda_heads);
    hp.conv_kernel = l.u32("short_conv_kernel_size", hp.conv_kernel);
    // The first port spelled the bound "lower_bound" and defaulted safe_gate to false.
    const bool old_spelling = !l.get("gate_lower_bound") && l.get("lower_bound");
    const char* bound_key = old_spelling ? "lower_bound" : "gate_lower_bound";
    if (l.get(bound_key)) {
      lower_bound = l.has_non_null(bound_key) ? std::optional(l.f32(bound_key, -5.0f)) : std::nullopt;
    }
    if (!lower_bound && l.boolean("safe_gate", !old_spelling)) lower_bound = -5.0f;
    if (!l.error().empty()) return fail(l.error());
  }
  if (!lower_bound) {
    return unsupported(f.name("linear_lower_bound") +
                       " is null: the softplus forget gate (no lower bound) is not supported, only the bounded one");
  }
  hp.kda_lower_bound = *lower_bound;

  if (kv_heads != hp.n_heads) {
    return unsupported(f.name("num_key_value_heads") + " is " + std::to_string(kv_heads) +
                       ", expected num_attention_heads = " + std::to_string(hp.n_heads));
  }
  if (rope_dim != 0) {
    return unsupported(f.name("qk_rope_head_dim") + " is " + std::to_string(rope_dim) +
                       ", expected 0 (glm5_next has no RoPE)");
  }
  if (act && *act != "silu") return unsupported(f.name("hidden_act") + " is '" + *act + "', expected 'silu'");
  if (attention_bias) return unsupported(f.name("attention_bias") + " is true, expected false (no attention biases)");

  // Per-layer schedules.
  if (const auto kinds = f.choices("layer_types",
                                   {"linear_attention", "deepseek_sparse_attention", "indexed_attention", "full_attention"})) {
    if (kinds->size() != hp.n_layers) {
      return fail(f.name("layer_types") + " has " + std::to_string(kinds->size()) +
                  " entries, expected num_hidden_layers = " + std::to_string(hp.n_layers));
    }
    for (size_t k : *kinds) hp.layer_kinds.push_back(k == 0 ? LayerKind::kda : LayerKind::dsa);
  } else {
    for (uint32_t i = 0; i < hp.n_layers; ++i) hp.layer_kinds.push_back(i % 4 != 3 ? LayerKind::kda : LayerKind::dsa);
  }
  if (const auto kinds = f.choices("mlp_layer_types", {"dense", "sparse"})) {
    if (kinds->size() != hp.n_layers) {
      return fail(f.name("mlp_layer_types") + " has " + std::to_string(kinds->size()) +
                  " entries, expected num_hidden_layers = " + std::to_string(hp.n_layers));
    }
    for (size_t k : *kinds) hp.ffn_kinds.push_back(k == 0 ? FfnKind::dense : FfnKind::moe);
  } else {
    const uint32_t dense = f.has_non_null("first_k_dense_replace") ? f.u32("first_k_dense_replace", 3)
                                                                   : std::min(3u, hp.n_layers);
    for (uint32_t i = 0; i < hp.n_layers; ++i) hp.ffn_kinds.push_back(i < dense ? FfnKind::dense : FfnKind::moe);
  }
  if (const auto kinds = f.choices("indexer_types", {"full", "shared"})) {
    if (kinds->size() != hp.n_layers) {
      return fail(f.name("indexer_types") + " has " + std::to_string(kinds->size()) +
                  " entries, expected num_hidden_layers = " + std::to_string(hp.n_layers));
    }
    for (size_t k : *kinds) hp.indexer_full.push_back(k == 0);
  } else if (f.error().empty()) {
    hp.indexer_full = default_indexer_full(f, hp.n_layers);
  }
  if (!f.error().empty()) return fail(f.error());

  if (const std::vector<std::string> bad = hp.validate(); !bad.empty()) {
    std::string all;
    for (const std::string& b : bad) all += (all.empty() ? "" : "; ") + b;
    return fail("inconsistent hyper-parameters: " + all);
  }
  return hp;
}

}  // namespace

Expected<Glm5Hparams> glm5_hparams_from_hf_config(std::string_view json_text) {
  return from_config_json(json_text, "config.json");
}

Expected<Glm5Hparams> glm5_hparams_from_hf_config_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error(ErrorCode::io, path.string() + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Error(ErrorCode::io, path.string() + ": read error");
  return from_config_json(text.str(), path.string());
}

}  // namespace ferry::model
