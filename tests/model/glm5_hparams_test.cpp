#include "model/glm5/glm5_hparams.hpp"

#include <gtest/gtest.h>

#include <string>

namespace ferry::model {
namespace {

TEST(Glm5HparamsHf, DefaultsAreTheReleasedModelWithTheClassDefaultKpool) {
  const auto r = glm5_hparams_from_hf_config(R"({"model_type": "glm5_next", "text_config": {}})");
  ASSERT_TRUE(r) << r.error().message;
  const Glm5Hparams& hp = r.value();
  EXPECT_EQ(hp.n_layers, 45u);
  EXPECT_EQ(hp.hidden_size, 4096u);
  EXPECT_EQ(hp.index_kpool, 16u);  // transformers' class default; the release sets 4
  EXPECT_EQ(hp.n_nextn_layers, 0u);
  ASSERT_EQ(hp.layer_kinds.size(), 45u);
  EXPECT_EQ(hp.layer_kinds[3], LayerKind::dsa);
  EXPECT_EQ(hp.layer_kinds[4], LayerKind::kda);
  EXPECT_EQ(hp.ffn_kinds[2], FfnKind::dense);
  EXPECT_EQ(hp.ffn_kinds[3], FfnKind::moe);
  ASSERT_EQ(hp.indexer_full.size(), 45u);
  for (bool full : hp.indexer_full) EXPECT_TRUE(full);
  EXPECT_FLOAT_EQ(hp.kda_lower_bound, -5.0f);
}

TEST(Glm5HparamsHf, ReadsATinyTextConfig) {
  const auto r = glm5_hparams_from_hf_config(R"({
    "model_type": "glm5_next",
    "text_config": {
      "model_type": "glm5_next_text", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 96,
      "moe_intermediate_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
      "num_key_value_heads": 4, "n_routed_experts": 6, "num_experts_per_tok": 2, "n_shared_experts": 1,
      "q_lora_rank": 40, "kv_lora_rank": 24, "qk_nope_head_dim": 16, "qk_rope_head_dim": 0,
      "v_head_dim": 12, "index_n_heads": 3, "index_head_dim": 8, "index_topk": 8, "index_kpool": 4,
      "linear_num_heads": 2, "linear_head_dim": 10, "linear_conv_kernel_dim": 3, "linear_lower_bound": -4.5,
      "hc_mult": 2, "hc_sinkhorn_iters": 7, "hc_eps": 1e-5, "rms_norm_eps": 1e-6, "routed_scaling_factor": 1.5,
      "swiglu_limit": 7, "layer_types": ["linear_attention", "full_attention", "linear_attention",
      "deepseek_sparse_attention"], "mlp_layer_types": ["dense", "dense", "sparse", "sparse"],
      "indexer_types": ["full", "full", "full", "shared"], "max_position_embeddings": 2048,
      "num_nextn_predict_layers": 1, "index_kpool_always_select_tail": false
    },
    "vision_config": {"depth": 1}
  })");
  ASSERT_TRUE(r) << r.error().message;
  const Glm5Hparams& hp = r.value();
  EXPECT_EQ(hp.vocab_size, 300u);
  EXPECT_EQ(hp.n_experts, 6u);
  EXPECT_EQ(hp.conv_kernel, 3u);
  EXPECT_FLOAT_EQ(hp.kda_lower_bound, -4.5f);
  EXPECT_EQ(hp.hc_sinkhorn_iters, 7u);
  EXPECT_FLOAT_EQ(hp.rms_eps, 1e-6f);
  EXPECT_FLOAT_EQ(hp.swiglu_limit, 7.0f);
  EXPECT_EQ(hp.context_length, 2048u);
  EXPECT_EQ(hp.n_nextn_layers, 1u);
  EXPECT_FALSE(hp.index_select_tail);
  EXPECT_EQ(hp.layer_kinds, (std::vector<LayerKind>{LayerKind::kda, LayerKind::dsa, LayerKind::kda, LayerKind::dsa}));
  EXPECT_EQ(hp.ffn_kinds, (std::vector<FfnKind>{FfnKind::dense, FfnKind::dense, FfnKind::moe, FfnKind::moe}));
  EXPECT_EQ(hp.indexer_full, (std::vector<bool>{true, true, true, false}));
}

TEST(Glm5HparamsHf, ReleaseSpellingsLinearAttnConfigAndFirstKDense) {
  const auto r = glm5_hparams_from_hf_config(R"({"model_type": "glm5_next", "text_config": {
      "num_hidden_layers": 8, "first_k_dense_replace": 2, "index_kpool": 4,
      "linear_num_heads": 7, "linear_attn_config": {"num_heads": 64, "head_dim": 128,
      "short_conv_kernel_size": 4, "gate_lower_bound": null, "safe_gate": true},
      "index_topk_pattern": "FFFFFFFS"}})");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->kda_heads, 64u);
  EXPECT_FLOAT_EQ(r->kda_lower_bound, -5.0f);
  EXPECT_EQ(r->ffn_kinds, (std::vector<FfnKind>{FfnKind::dense, FfnKind::dense, FfnKind::moe, FfnKind::moe,
                                                FfnKind::moe, FfnKind::moe, FfnKind::moe, FfnKind::moe}));
  EXPECT_FALSE(r->indexer_full[7]);
  EXPECT_TRUE(r->indexer_full[3]);
}

std::string error_of(const char* json);

TEST(Glm5HparamsHf, NewerTransformersSpellings) {
  // transformers 5.24 renamed the DSA layer type to indexed_attention; full_attention still maps to it.
  const auto r = glm5_hparams_from_hf_config(R"({"model_type": "glm5_next", "text_config": {
      "num_hidden_layers": 4, "index_kpool": 4,
      "layer_types": ["linear_attention", "indexed_attention", "full_attention", "deepseek_sparse_attention"]}})");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->layer_kinds, (std::vector<LayerKind>{LayerKind::kda, LayerKind::dsa, LayerKind::dsa, LayerKind::dsa}));
  // The first port's linear_attn_config: "lower_bound", and safe_gate off unless set.
  const auto old = glm5_hparams_from_hf_config(R"({"model_type": "glm5_next", "text_config": {
      "num_hidden_layers": 4, "index_kpool": 4, "linear_attn_config": {"num_heads": 8, "lower_bound": -3.5}}})");
  ASSERT_TRUE(old) << old.error().message;
  EXPECT_FLOAT_EQ(old->kda_lower_bound, -3.5f);
  EXPECT_EQ(old->kda_heads, 8u);
  const auto unbounded = glm5_hparams_from_hf_config(R"({"model_type": "glm5_next", "text_config": {
      "num_hidden_layers": 4, "index_kpool": 4, "linear_attn_config": {"lower_bound": null}}})");
  ASSERT_FALSE(unbounded);
  EXPECT_EQ(unbounded.error().code, ErrorCode::unsupported);
  const auto safe = glm5_hparams_from_hf_config(R"({"model_type": "glm5_next", "text_config": {
      "num_hidden_layers": 4, "index_kpool": 4, "linear_attn_config": {"lower_bound": null, "safe_gate": true}}})");
  ASSERT_TRUE(safe) << safe.error().message;
  EXPECT_FLOAT_EQ(safe->kda_lower_bound, -5.0f);
  EXPECT_NE(error_of(R"({"model_type": "glm5_next", "text_config": {"num_hidden_layers": 1,
      "layer_types": ["sliding_attention"]}})").find("indexed_attention"), std::string::npos);
}

TEST(Glm5HparamsHf, FlatTextOnlyConfig) {
  const auto r = glm5_hparams_from_hf_config(R"({"model_type": "glm5_next", "num_hidden_layers": 4, "index_kpool": 4})");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->n_layers, 4u);
}

std::string error_of(const char* json) {
  const auto r = glm5_hparams_from_hf_config(json);
  return r ? std::string("(accepted)") : r.error().message;
}

TEST(Glm5HparamsHf, ErrorsNameTheField) {
  EXPECT_EQ(error_of("{"), "config.json: not valid JSON: " + std::string(error_of("{").substr(29)));
  EXPECT_NE(error_of("{").find("not valid JSON"), std::string::npos);
  EXPECT_EQ(error_of("[]"), "config.json: the top level is not a JSON object");
  EXPECT_EQ(error_of(R"({"model_type": "llama"})"), "config.json: model_type is 'llama', expected 'glm5_next'");
  EXPECT_EQ(error_of(R"({"hidden_size": 5})"), "config.json: has no model_type (expected 'glm5_next')");
  EXPECT_EQ(error_of(R"({"model_type": "glm5_next", "text_config": {"hidden_size": -3}})"),
            "config.json: text_config.hidden_size is -3, expected an unsigned 32-bit integer");
  EXPECT_EQ(error_of(R"({"model_type": "glm5_next", "text_config": {"rms_norm_eps": "x"}})"),
            "config.json: text_config.rms_norm_eps is \"x\", expected a finite number");
  EXPECT_EQ(error_of(R"({"model_type": "glm5_next", "text_config": {"qk_rope_head_dim": 64}})"),
            "config.json: text_config.qk_rope_head_dim is 64, expected 0 (glm5_next has no RoPE)");
  EXPECT_EQ(error_of(R"({"model_type": "glm5_next", "text_config": {"num_key_value_heads": 8}})"),
            "config.json: text_config.num_key_value_heads is 8, expected num_attention_heads = 64");
  EXPECT_EQ(error_of(R"({"model_type": "glm5_next", "text_config": {"num_hidden_layers": 2,
            "layer_types": ["linear_attention", "sliding"]}})"),
            "config.json: text_config.layer_types[1] is \"sliding\", expected one of linear_attention, "
            "deepseek_sparse_attention, indexed_attention, full_attention");
  EXPECT_EQ(error_of(R"({"model_type": "glm5_next", "text_config": {"num_hidden_layers": 3,
            "mlp_layer_types": ["dense"]}})"),
            "config.json: text_config.mlp_layer_types has 1 entries, expected num_hidden_layers = 3");
  EXPECT_EQ(error_of(R"({"model_type": "glm5_next", "text_config": {"index_topk": 2047}})"),
            "config.json: inconsistent hyper-parameters: index_topk is 2047, expected a positive multiple of "
            "index_kpool = 16");
  EXPECT_EQ(error_of(R"({"model_type": "glm5_next", "text_config": {"linear_lower_bound": null}})"),
            "config.json: text_config.linear_lower_bound is null: the softplus forget gate (no lower bound) is "
            "not supported, only the bounded one");
  EXPECT_EQ(error_of(R"({"model_type": "glm5_next", "text_config": {"model_type": "qwen3"}})"),
            "config.json: text_config.model_type is 'qwen3', expected 'glm5_next_text'");
  EXPECT_EQ(error_of(R"({"model_type": "glm5_next", "text_config": {"num_hidden_layers": 4,
            "indexer_types": ["full", "full", "full", "shared"], "layer_types": ["linear_attention",
            "linear_attention", "linear_attention", "deepseek_sparse_attention"]}})"),
            "config.json: inconsistent hyper-parameters: layer 3 has a shared indexer but no full DSA layer "
            "precedes it");
}

TEST(Glm5HparamsHf, ErrorCodesSayWhatKindOfProblem) {
  const auto code_of = [](const char* json) { return glm5_hparams_from_hf_config(json).error().code; };
  EXPECT_EQ(code_of("{"), ferry::ErrorCode::invalid_input);
  EXPECT_EQ(code_of(R"({"model_type": "glm5_next", "text_config": {"hidden_size": -3}})"), ferry::ErrorCode::invalid_input);
  EXPECT_EQ(code_of(R"({"model_type": "llama"})"), ferry::ErrorCode::unsupported);
  EXPECT_EQ(code_of(R"({"model_type": "glm5_next", "text_config": {"linear_lower_bound": null}})"),
            ferry::ErrorCode::unsupported);
  const auto missing = glm5_hparams_from_hf_config_file("/nonexistent/config.json");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, ferry::ErrorCode::io);
  EXPECT_EQ(missing.error().message, "/nonexistent/config.json: cannot open");
}

TEST(Glm5HparamsValidate, NamesEachProblem) {
  Glm5Hparams hp;
  hp.n_layers = 2;
  hp.layer_kinds = {LayerKind::kda};
  hp.ffn_kinds = {FfnKind::moe, FfnKind::moe};
  hp.n_experts_used = 300;
  hp.kda_lower_bound = 1.0f;
  const auto bad = hp.validate();
  ASSERT_EQ(bad.size(), 3u);
  EXPECT_EQ(bad[0], "layer_kinds has 1 entries, expected n_layers = 2");
  EXPECT_EQ(bad[1], "n_experts_used is 300, expected 1..288");
  EXPECT_EQ(bad[2], "kda_lower_bound is 1.000000, expected < 0 (it scales the sigmoid decay gate)");
}

}  // namespace
}  // namespace ferry::model
