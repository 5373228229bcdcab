#include "model/glm5/glm5_tensors.hpp"

#include <gtest/gtest.h>

#include <set>

namespace ferry::model {
namespace {

// Four trunk layers (KDA, KDA, KDA, DSA), one dense FFN then MoE, one MTP block; widths all distinct
// so that a swapped dimension cannot go unnoticed.
Glm5Hparams tiny() {
  Glm5Hparams hp;
  hp.vocab_size = 300;
  hp.hidden_size = 64;
  hp.n_layers = 4;
  hp.n_nextn_layers = 1;
  hp.dense_ffn = 96;
  hp.moe_ffn = 32;
  hp.n_experts = 6;
  hp.n_experts_used = 2;
  hp.n_shared_experts = 1;
  hp.n_heads = 4;
  hp.q_lora_rank = 40;
  hp.kv_lora_rank = 24;
  hp.qk_nope_head_dim = 16;
  hp.v_head_dim = 12;
  hp.index_n_heads = 3;
  hp.index_head_dim = 8;
  hp.index_topk = 8;
  hp.index_kpool = 4;
  hp.kda_heads = 2;
  hp.kda_head_dim = 10;
  hp.conv_kernel = 4;
  hp.hc_mult = 2;
  hp.layer_kinds = {LayerKind::kda, LayerKind::kda, LayerKind::kda, LayerKind::dsa};
  hp.ffn_kinds = {FfnKind::dense, FfnKind::moe, FfnKind::moe, FfnKind::moe};
  return hp;
}

// The released GLM-5.3-Flash: 45 trunk layers (DSA at i % 4 == 3), 3 dense, 1 MTP block.
Glm5Hparams released() {
  Glm5Hparams hp;
  for (uint32_t i = 0; i < hp.n_layers; ++i) {
    hp.layer_kinds.push_back(i % 4 == 3 ? LayerKind::dsa : LayerKind::kda);
    hp.ffn_kinds.push_back(i < 3 ? FfnKind::dense : FfnKind::moe);
  }
  return hp;
}

uint64_t product(const std::vector<uint64_t>& v) {
  uint64_t n = 1;
  for (uint64_t x : v) n *= x;
  return n;
}

TEST(Glm5Tensors, TinyConfigIsValid) { EXPECT_TRUE(tiny().validate().empty()); }

TEST(Glm5Tensors, NamesParseBackToRoleAndLayer) {
  const Glm5Hparams hp = tiny();
  std::set<std::string> names;
  for (const Glm5TensorSpec& s : glm5_all_tensors(hp)) {
    EXPECT_TRUE(names.insert(s.name).second) << "duplicate " << s.name;
    const auto parsed = parse_glm5_tensor_name(s.name);
    ASSERT_TRUE(parsed) << s.name;
    EXPECT_EQ(parsed->first, s.role) << s.name;
    EXPECT_EQ(parsed->second, s.layer) << s.name;
    EXPECT_EQ(glm5_tensor_name(s.role, s.layer), s.name);
  }
  for (size_t i = 0; i < kGlm5TensorRoles; ++i) {
    const auto role = static_cast<Glm5Tensor>(i);
    const int32_t layer = glm5_tensor_is_global(role) ? -1 : 17;
    const auto parsed = parse_glm5_tensor_name(glm5_tensor_name(role, layer));
    ASSERT_TRUE(parsed);
    EXPECT_EQ(parsed->first, role);
    EXPECT_EQ(parsed->second, layer);
  }
}

TEST(Glm5Tensors, ParseRejectsForeignNames) {
  for (const char* bad : {"blk.01.attn_norm.weight", "blk.x.attn_norm.weight", "blk..attn_norm.weight",
                          "attn_norm.weight", "blk.3.token_embd.weight", "blk.3.attn_qkv.weight",
                          "blk.-1.attn_norm.weight", "blk.3", "output.bias", ""}) {
    EXPECT_FALSE(parse_glm5_tensor_name(bad)) << bad;
  }
}

TEST(Glm5Tensors, LayerPlanOfTinyConfig) {
  const Glm5Hparams hp = tiny();
  EXPECT_EQ(glm5_block_count(hp), 5u);
  EXPECT_EQ(glm5_leading_dense_blocks(hp), 1u);
  EXPECT_EQ(glm5_layer_kind(hp, 4), LayerKind::dsa);  // the MTP block
  EXPECT_EQ(glm5_ffn_kind(hp, 4), FfnKind::moe);
  // KDA + dense: 1 + 3 hc + 15 KDA + 1 + 3 hc + 3 dense
  EXPECT_EQ(glm5_layer_tensors(hp, 0).size(), 26u);
  // DSA + MoE: 1 + 3 + 8 MLA + 7 indexer + 1 + 3 + 8 MoE (with shared expert)
  EXPECT_EQ(glm5_layer_tensors(hp, 3).size(), 31u);
  // MTP: no mHC, DSA + indexer + MoE + 6 nextn (2 optional)
  const auto mtp = glm5_layer_tensors(hp, 4);
  EXPECT_EQ(mtp.size(), 31u);
  size_t optional = 0;
  for (const auto& s : mtp) optional += s.optional;
  EXPECT_EQ(optional, 2u);
  EXPECT_FALSE(glm5_find_tensor(hp, Glm5Tensor::hc_attn_fn, 4));
  EXPECT_FALSE(glm5_find_tensor(hp, Glm5Tensor::attn_q_a, 0));
  EXPECT_FALSE(glm5_find_tensor(hp, Glm5Tensor::token_embd, 0));
  EXPECT_FALSE(glm5_find_tensor(hp, Glm5Tensor::attn_norm, 5));
  ASSERT_TRUE(glm5_find_tensor(hp, Glm5Tensor::token_embd));
}

TEST(Glm5Tensors, SharedIndexerLayerHasNoIndexerWeights) {
  Glm5Hparams hp = tiny();
  hp.n_layers = 5;
  hp.layer_kinds.push_back(LayerKind::dsa);
  hp.ffn_kinds.push_back(FfnKind::moe);
  hp.indexer_full = {true, true, true, true, false};
  ASSERT_TRUE(hp.validate().empty());
  EXPECT_TRUE(glm5_find_tensor(hp, Glm5Tensor::indexer_proj, 3));
  EXPECT_FALSE(glm5_find_tensor(hp, Glm5Tensor::indexer_proj, 4));
  EXPECT_TRUE(glm5_find_tensor(hp, Glm5Tensor::attn_k_b, 4));
  EXPECT_TRUE(glm5_find_tensor(hp, Glm5Tensor::indexer_proj, 5));  // MTP always runs its own indexer
}

TEST(Glm5Tensors, ReleasedShapesMatchThePublishedFiles) {
  const Glm5Hparams hp = released();
  ASSERT_TRUE(hp.validate().empty());
  EXPECT_EQ(glm5_block_count(hp), 46u);
  auto dims = [&](Glm5Tensor role, int32_t layer) { return glm5_find_tensor(hp, role, layer).value().dims; };
  using V = std::vector<uint64_t>;
  EXPECT_EQ(dims(Glm5Tensor::token_embd, -1), (V{4096, 154880}));
  EXPECT_EQ(dims(Glm5Tensor::attn_q_a, 3), (V{4096, 1536}));
  EXPECT_EQ(dims(Glm5Tensor::attn_q_b, 3), (V{1536, 16384}));
  EXPECT_EQ(dims(Glm5Tensor::attn_kv_a_mqa, 3), (V{4096, 512}));
  EXPECT_EQ(dims(Glm5Tensor::attn_k_b, 3), (V{256, 512, 64}));
  EXPECT_EQ(dims(Glm5Tensor::attn_v_b, 3), (V{512, 256, 64}));
  EXPECT_EQ(dims(Glm5Tensor::attn_output, 3), (V{16384, 4096}));
  EXPECT_EQ(dims(Glm5Tensor::indexer_attn_q_b, 3), (V{1536, 4096}));
  EXPECT_EQ(dims(Glm5Tensor::indexer_attn_k, 3), (V{4096, 128}));
  EXPECT_EQ(dims(Glm5Tensor::indexer_proj, 3), (V{4096, 32}));
  EXPECT_EQ(dims(Glm5Tensor::indexer_compressor_ape, 3), (V{128, 4}));
  EXPECT_EQ(dims(Glm5Tensor::indexer_compressor_gate, 3), (V{4096, 128}));
  EXPECT_EQ(dims(Glm5Tensor::hc_attn_fn, 0), (V{16384, 24}));
  EXPECT_EQ(dims(Glm5Tensor::hc_ffn_base, 44), (V{24}));
  EXPECT_EQ(dims(Glm5Tensor::attn_q, 0), (V{4096, 8192}));
  EXPECT_TRUE(same_ggml_dims(dims(Glm5Tensor::ssm_conv1d_q, 0), V{4, 1, 8192}));
  EXPECT_EQ(dims(Glm5Tensor::ssm_a, 0), (V{64}));
  EXPECT_EQ(dims(Glm5Tensor::ssm_dt_bias, 0), (V{8192}));
  EXPECT_EQ(dims(Glm5Tensor::ssm_norm, 0), (V{128}));
  EXPECT_EQ(dims(Glm5Tensor::ffn_gate, 2), (V{4096, 12288}));
  EXPECT_EQ(dims(Glm5Tensor::ffn_gate_exps, 3), (V{4096, 2048, 288}));
  EXPECT_EQ(dims(Glm5Tensor::ffn_down_exps, 3), (V{2048, 4096, 288}));
  EXPECT_EQ(dims(Glm5Tensor::ffn_up_shexp, 3), (V{4096, 2048}));
  EXPECT_EQ(dims(Glm5Tensor::nextn_eh_proj, 45), (V{8192, 4096}));
  EXPECT_TRUE(glm5_find_tensor(hp, Glm5Tensor::indexer_proj, 45));
  EXPECT_FALSE(glm5_find_tensor(hp, Glm5Tensor::hc_ffn_fn, 45));
  EXPECT_TRUE(glm5_find_tensor(hp, Glm5Tensor::indexer_compressor_ape, 7).value().keep_f32);
  EXPECT_TRUE(glm5_find_tensor(hp, Glm5Tensor::ffn_up_exps, 7).value().expert);
  EXPECT_FALSE(glm5_find_tensor(hp, Glm5Tensor::ffn_up_exps, 7).value().keep_f32);
}

TEST(Glm5Tensors, EveryRecipeHasTheRightElementCount) {
  const Glm5Hparams hp = tiny();
  for (const Glm5TensorSpec& s : glm5_all_tensors(hp)) {
    const auto recipes = glm5_hf_recipes(hp, s, kHfPrefixMultimodal);
    ASSERT_FALSE(recipes.empty()) << s.name;
    for (const HfRecipe& r : recipes) {
      uint64_t n = 0;
      for (const HfSource& src : r.sources) n += product(src.shape);
      switch (r.transform) {
        case HfTransform::copy:
        case HfTransform::neg_exp:
        case HfTransform::stack:
          EXPECT_EQ(n, s.n_elements()) << s.name << " from " << r.sources[0].name;
          break;
        case HfTransform::slice:
          EXPECT_EQ(r.count, s.n_elements()) << s.name;
          EXPECT_LE(r.offset + r.count, n) << s.name;
          break;
        case HfTransform::fused_half:
          EXPECT_EQ(n, 2 * s.n_elements()) << s.name;
          break;
        case HfTransform::kv_b_k:
        case HfTransform::kv_b_v: {
          const uint64_t part = r.transform == HfTransform::kv_b_k ? hp.qk_nope_head_dim : hp.v_head_dim;
          EXPECT_EQ(n * part, s.n_elements() * (hp.qk_nope_head_dim + hp.v_head_dim)) << s.name;
          break;
        }
      }
      if (r.transform == HfTransform::copy && r.sources.size() == 1 && s.role != Glm5Tensor::ffn_down_exps) {
        const auto& shape = r.sources[0].shape;
        EXPECT_TRUE(same_ggml_dims({shape.rbegin(), shape.rend()}, s.dims)) << s.name;
      }
    }
  }
}

TEST(Glm5Tensors, CheckpointNamesMapToGgufNames) {
  const Glm5Hparams hp = tiny();
  const Glm5HfNameMap map(hp, kHfPrefixMultimodal);
  auto gguf = [&](const char* hf) {
    const std::string* n = map.gguf_name(hf);
    return n ? *n : std::string("(none)");
  };
  EXPECT_EQ(gguf("model.language_model.embed_tokens.weight"), "token_embd.weight");
  EXPECT_EQ(gguf("model.language_model.norm.weight"), "output_norm.weight");
  EXPECT_EQ(gguf("lm_head.weight"), "output.weight");
  EXPECT_EQ(gguf("model.language_model.layers.0.input_layernorm.weight"), "blk.0.attn_norm.weight");
  EXPECT_EQ(gguf("model.language_model.layers.0.hc_attn_fn"), "blk.0.hc_attn_fn.weight");
  EXPECT_EQ(gguf("model.language_model.layers.0.attn_hc.fn"), "blk.0.hc_attn_fn.weight");
  EXPECT_EQ(gguf("model.language_model.layers.2.ffn_hc.scale"), "blk.2.hc_ffn_scale.weight");
  EXPECT_EQ(gguf("model.language_model.layers.1.self_attn.A_log"), "blk.1.ssm_a");
  EXPECT_EQ(gguf("model.language_model.layers.1.self_attn.forget_gate.A_log"), "blk.1.ssm_a");
  EXPECT_EQ(gguf("model.language_model.layers.1.self_attn.forget_gate.dt_bias"), "blk.1.ssm_dt.bias");
  EXPECT_EQ(gguf("model.language_model.layers.1.self_attn.k_conv1d.weight"), "blk.1.ssm_conv1d_k.weight");
  EXPECT_EQ(gguf("model.language_model.layers.1.self_attn.conv1d.weight"), "blk.1.ssm_conv1d_q.weight");
  EXPECT_EQ(gguf("model.language_model.layers.1.self_attn.o_norm.weight"), "blk.1.ssm_norm.weight");
  EXPECT_EQ(gguf("model.language_model.layers.1.self_attn.b_proj.weight"), "blk.1.ssm_beta.weight");
  EXPECT_EQ(gguf("model.language_model.layers.3.self_attn.kv_b_proj.weight"), "blk.3.attn_k_b.weight");
  EXPECT_EQ(gguf("model.language_model.layers.3.self_attn.indexer.index_kpool_compress_ape"),
            "blk.3.indexer_compressor_ape.weight");
  EXPECT_EQ(gguf("model.language_model.layers.3.self_attn.indexer.k_norm.bias"), "blk.3.indexer.k_norm.bias");
  EXPECT_EQ(gguf("model.language_model.layers.3.mlp.experts.5.down_proj.weight"), "blk.3.ffn_down_exps.weight");
  EXPECT_EQ(gguf("model.language_model.layers.3.mlp.experts.gate_up_proj"), "blk.3.ffn_gate_exps.weight");
  EXPECT_EQ(gguf("model.language_model.layers.3.mlp.gate.e_score_correction_bias"), "blk.3.exp_probs_b.bias");
  EXPECT_EQ(gguf("model.language_model.layers.0.mlp.down_proj.weight"), "blk.0.ffn_down.weight");
  EXPECT_EQ(gguf("model.language_model.layers.4.eh_proj.weight"), "blk.4.nextn.eh_proj.weight");
  EXPECT_EQ(gguf("model.language_model.layers.4.shared_head.norm.weight"), "blk.4.nextn.shared_head_norm.weight");
  EXPECT_EQ(gguf("model.language_model.layers.3.mlp.experts.6.down_proj.weight"), "(none)");  // 6 experts: 0..5
  EXPECT_EQ(gguf("model.language_model.layers.5.input_layernorm.weight"), "(none)");
  EXPECT_EQ(gguf("model.layers.0.input_layernorm.weight"), "(none)");  // other prefix
  const Glm5HfNameMap text_only(hp, kHfPrefixText);
  ASSERT_NE(text_only.gguf_name("model.layers.0.input_layernorm.weight"), nullptr);
  EXPECT_EQ(*text_only.gguf_name("model.layers.0.input_layernorm.weight"), "blk.0.attn_norm.weight");
  EXPECT_TRUE(glm5_hf_is_vision("model.visual.blocks.0.attn.qkv.weight"));
  EXPECT_FALSE(glm5_hf_is_vision("model.language_model.norm.weight"));
}

TEST(Glm5Tensors, EveryRecipeSourceMapsBackToItsTensor) {
  const Glm5Hparams hp = tiny();
  const Glm5HfNameMap map(hp, kHfPrefixMultimodal);
  std::set<std::string> sources;
  for (const Glm5TensorSpec& s : glm5_all_tensors(hp)) {
    auto recipes = glm5_hf_recipes(hp, s, kHfPrefixMultimodal);
    if (s.role == Glm5Tensor::output) recipes.resize(1);  // the second is the tied embedding
    for (const HfRecipe& r : recipes) {
      for (const HfSource& src : r.sources) {
        sources.insert(src.name);
        const std::string* g = map.gguf_name(src.name);
        ASSERT_NE(g, nullptr) << src.name;
        // A fused source (kv_b, gate_up_proj, conv1d) feeds several tensors; the map names the first.
        Glm5Tensor first = s.role;
        if (r.transform == HfTransform::kv_b_k || r.transform == HfTransform::kv_b_v) first = Glm5Tensor::attn_k_b;
        if (r.transform == HfTransform::fused_half) first = Glm5Tensor::ffn_gate_exps;
        if (r.transform == HfTransform::slice) first = Glm5Tensor::ssm_conv1d_q;
        const std::string expected = glm5_tensor_name(first, s.layer);
        EXPECT_EQ(*g, expected) << src.name;
      }
    }
  }
  EXPECT_EQ(map.size(), sources.size());
}

}  // namespace
}  // namespace ferry::model
