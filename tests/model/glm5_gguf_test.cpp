#include "model/glm5/glm5_gguf.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>

#include "model/formats/gguf_writer.hpp"

namespace ferry::model {
namespace {

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
  hp.n_heads = 4;
  hp.q_lora_rank = 40;
  hp.kv_lora_rank = 24;
  hp.qk_nope_head_dim = 16;
  hp.v_head_dim = 12;
  hp.index_n_heads = 3;
  hp.index_head_dim = 8;
  hp.index_topk = 8;
  hp.index_kpool = 4;
  hp.kda_heads = 4;
  hp.kda_head_dim = 10;
  hp.hc_mult = 2;
  hp.context_length = 4096;
  hp.routed_scaling = 1.5f;
  hp.swiglu_limit = 7.0f;
  hp.layer_kinds = {LayerKind::kda, LayerKind::dsa, LayerKind::kda, LayerKind::dsa};
  hp.ffn_kinds = {FfnKind::dense, FfnKind::moe, FfnKind::moe, FfnKind::moe};
  hp.indexer_full = {true, true, true, false};
  return hp;
}

class Glm5Gguf : public ::testing::Test {
 protected:
  std::filesystem::path path_ = std::filesystem::temp_directory_path() /
                                ("glm5_gguf_test_" + std::to_string(::getpid()) + ".gguf");
  void TearDown() override { std::filesystem::remove(path_); }

  // The metadata write_glm5_hparams makes for `hp`, edited by `edit` (which may drop keys by
  // returning false), written and read back.
  Expected<Glm5Hparams> round_trip(const Glm5Hparams& hp,
                                   const std::function<bool(GgufKv&)>& edit = [](GgufKv&) { return true; }) {
    GgufWriter first;
    if (auto err = write_glm5_hparams(first, hp)) return *err;
    if (auto r = first.write_file(path_); !r) return r.error();
    std::vector<GgufKv> kvs;
    {
      auto f = GgufFile::open(path_);
      EXPECT_TRUE(f);
      kvs.assign(f->metadata().begin(), f->metadata().end());
    }
    GgufWriter second;
    for (GgufKv& kv : kvs) {
      if (edit(kv)) {
        EXPECT_FALSE(second.set(kv.key, kv.value));
      }
    }
    EXPECT_TRUE(second.write_file(path_));
    auto f = GgufFile::open(path_);
    EXPECT_TRUE(f);
    return glm5_hparams_from_gguf(*f);
  }
};

void expect_same(const Glm5Hparams& a, const Glm5Hparams& b) {
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_nextn_layers, b.n_nextn_layers);
  EXPECT_EQ(a.context_length, b.context_length);
  EXPECT_EQ(a.rms_eps, b.rms_eps);
  EXPECT_EQ(a.dense_ffn, b.dense_ffn);
  EXPECT_EQ(a.moe_ffn, b.moe_ffn);
  EXPECT_EQ(a.n_experts, b.n_experts);
  EXPECT_EQ(a.n_experts_used, b.n_experts_used);
  EXPECT_EQ(a.n_shared_experts, b.n_shared_experts);
  EXPECT_EQ(a.n_group, b.n_group);
  EXPECT_EQ(a.topk_group, b.topk_group);
  EXPECT_EQ(a.routed_scaling, b.routed_scaling);
  EXPECT_EQ(a.norm_topk_prob, b.norm_topk_prob);
  EXPECT_EQ(a.swiglu_limit, b.swiglu_limit);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.q_lora_rank, b.q_lora_rank);
  EXPECT_EQ(a.kv_lora_rank, b.kv_lora_rank);
  EXPECT_EQ(a.qk_nope_head_dim, b.qk_nope_head_dim);
  EXPECT_EQ(a.v_head_dim, b.v_head_dim);
  EXPECT_EQ(a.index_n_heads, b.index_n_heads);
  EXPECT_EQ(a.index_head_dim, b.index_head_dim);
  EXPECT_EQ(a.index_topk, b.index_topk);
  EXPECT_EQ(a.index_kpool, b.index_kpool);
  EXPECT_EQ(a.index_select_tail, b.index_select_tail);
  EXPECT_EQ(a.index_norm_eps, b.index_norm_eps);
  EXPECT_EQ(a.kda_heads, b.kda_heads);
  EXPECT_EQ(a.kda_head_dim, b.kda_head_dim);
  EXPECT_EQ(a.conv_kernel, b.conv_kernel);
  EXPECT_EQ(a.kda_lower_bound, b.kda_lower_bound);
  EXPECT_EQ(a.hc_mult, b.hc_mult);
  EXPECT_EQ(a.hc_sinkhorn_iters, b.hc_sinkhorn_iters);
  EXPECT_EQ(a.hc_eps, b.hc_eps);
  EXPECT_EQ(a.layer_kinds, b.layer_kinds);
  EXPECT_EQ(a.ffn_kinds, b.ffn_kinds);
  EXPECT_EQ(a.indexer_full, b.indexer_full);
}

TEST_F(Glm5Gguf, RoundTrip) {
  const Glm5Hparams hp = tiny();
  ASSERT_TRUE(hp.validate().empty());
  const auto r = round_trip(hp);
  ASSERT_TRUE(r) << r.error().message;
  expect_same(hp, r.value());
}

TEST_F(Glm5Gguf, MainlineArchSpellingAndBlockSizeOnly) {
  const auto r = round_trip(tiny(), [](GgufKv& kv) {
    if (kv.key == "general.architecture") kv.value = std::string("glm5-next");
    if (kv.key.starts_with("glm5next.")) kv.key = "glm5-next." + kv.key.substr(9);
    return kv.key != "glm5-next.attention.indexer.kpool";
  });
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->index_kpool, 4u);
}

// What mainline llama.cpp's conversion/glm.py (PR #27773, arch glm5-next) writes: per-layer arrays
// of num_hidden_layers entries beside a block_count that counts the MTP block, indexer.types as
// bools, an index_share_mtp flag, and neither expert_shared_feed_forward_length, expert_gating_func
// nor (without one in the config) kda.gate_lower_bound.
TEST_F(Glm5Gguf, MainlineConverterVariant) {
  const Glm5Hparams hp = tiny();
  const auto r = round_trip(hp, [&](GgufKv& kv) {
    if (kv.key == "general.architecture") kv.value = std::string("glm5-next");
    if (kv.key.starts_with("glm5next.")) kv.key = "glm5-next." + kv.key.substr(9);
    if (kv.key == "glm5-next.attention.head_count_kv") kv.value = GgufArray{std::vector<int32_t>{0, 1, 0, 1}};
    if (kv.key == "glm5-next.attention.indexer.types") kv.value = GgufArray{std::vector<bool>{true, true, true, false}};
    if (kv.key == "glm5-next.context_length") kv.value = uint64_t{4096};
    if (kv.key == "glm5-next.attention.indexer.kpool_select_tail") {
      kv.key = "glm5-next.attention.indexer.index_share_mtp";  // an extra key, ignored
      kv.value = false;
      return true;
    }
    return kv.key != "glm5-next.expert_shared_feed_forward_length" && kv.key != "glm5-next.expert_gating_func" &&
           kv.key != "glm5-next.kda.gate_lower_bound" && kv.key != "glm5-next.attention.indexer.block_size";
  });
  ASSERT_TRUE(r) << r.error().message;
  expect_same(hp, r.value());
}

TEST_F(Glm5Gguf, KpoolWithoutBlockSizeAndWithoutOptionalKeys) {
  const auto r = round_trip(tiny(), [](GgufKv& kv) {
    return kv.key != "glm5next.attention.indexer.block_size" && kv.key != "glm5next.attention.indexer.types" &&
           kv.key != "glm5next.vocab_size" && kv.key != "glm5next.expert_group_count" &&
           kv.key != "glm5next.attention.indexer.kpool_select_tail";
  });
  ASSERT_FALSE(r);  // no vocab_size and no tokenizer or embedding to count it from
  EXPECT_EQ(r.error().message, "glm5next.vocab_size is missing (and there is no tokenizer.ggml.tokens or token_embd.weight)");
  const auto r2 = round_trip(tiny(), [](GgufKv& kv) {
    return kv.key != "glm5next.attention.indexer.block_size" && kv.key != "glm5next.attention.indexer.types";
  });
  ASSERT_TRUE(r2) << r2.error().message;
  EXPECT_TRUE(r2->indexer_full.empty());  // all full
  EXPECT_EQ(r2->index_kpool, 4u);
}

TEST_F(Glm5Gguf, PublishedScalarClampsAndTheKeysLoadersAdd) {
  const auto r = round_trip(tiny(), [](GgufKv& kv) {
    if (kv.key == "glm5next.swiglu_clamp_exp" || kv.key == "glm5next.swiglu_clamp_shexp") kv.value = 7.0f;
    return true;
  });
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->swiglu_limit, 7.0f);
}

TEST_F(Glm5Gguf, ErrorsNameTheKey) {
  auto error = [&](const std::function<bool(GgufKv&)>& edit) {
    const auto r = round_trip(tiny(), edit);
    return r ? std::string("(accepted)") : r.error().message;
  };
  EXPECT_EQ(error([](GgufKv& kv) { return kv.key != "glm5next.attention.kv_lora_rank"; }),
            "metadata key 'glm5next.attention.kv_lora_rank' is missing");
  EXPECT_EQ(error([](GgufKv& kv) {
              if (kv.key == "general.architecture") kv.value = std::string("deepseek2");
              return true;
            }),
            "general.architecture is 'deepseek2', expected 'glm5next' (or 'glm5-next')");
  EXPECT_EQ(error([](GgufKv& kv) {
              return kv.key != "glm5next.attention.indexer.kpool" && kv.key != "glm5next.attention.indexer.block_size";
            }),
            "glm5next.attention.indexer.kpool is missing (and so is glm5next.attention.indexer.block_size)");
  EXPECT_EQ(error([](GgufKv& kv) {
              if (kv.key == "glm5next.attention.indexer.block_size") kv.value = uint32_t{16};
              return true;
            }),
            "glm5next.attention.indexer.block_size is 16 but glm5next.attention.indexer.kpool is 4");
  EXPECT_EQ(error([](GgufKv& kv) {
              if (kv.key == "glm5next.attention.head_count_kv") kv.value = uint32_t{1};
              return true;
            }),
            "glm5next.attention.head_count_kv is a u32, expected a per-block array (0 = KDA block, 1 = DSA block)");
  EXPECT_EQ(error([](GgufKv& kv) {
              if (kv.key == "glm5next.attention.head_count_kv") kv.value = GgufArray{std::vector<int32_t>{0, 1}};
              return true;
            }),
            "glm5next.attention.head_count_kv has 2 entries, expected one per block (block_count = 5) or per trunk "
            "block (4)");
  EXPECT_EQ(error([](GgufKv& kv) {
              if (kv.key == "glm5next.rope.dimension_count") kv.value = uint32_t{64};
              return true;
            }),
            "glm5next.rope.dimension_count is 64, expected 0 (glm5next has no RoPE)");
  EXPECT_EQ(error([](GgufKv& kv) {
              if (kv.key == "glm5next.expert_gating_func") kv.value = uint32_t{1};
              return true;
            }),
            "glm5next.expert_gating_func is 1, expected 2");
  EXPECT_EQ(error([](GgufKv& kv) {
              if (kv.key == "glm5next.swiglu_clamp_shexp") kv.value = GgufArray{std::vector<float>{7, 7, 7, 7, 8}};
              return true;
            }),
            "glm5next.swiglu_clamp_exp holds different limits (7.000000 and 8.000000); ferry supports one SwiGLU "
            "limit for every layer");
  EXPECT_EQ(error([](GgufKv& kv) {
              if (kv.key == "glm5next.expert_used_count") kv.value = uint32_t{9};
              return true;
            }),
            "GGUF metadata (glm5next) is inconsistent: n_experts_used is 9, expected 1..6");
}

TEST_F(Glm5Gguf, DenseLayersAfterMoeUseFerrysFeedForwardTypes) {
  Glm5Hparams hp = tiny();
  GgufWriter w;
  ASSERT_FALSE(write_glm5_hparams(w, hp));
  EXPECT_EQ(w.find("glm5next.feed_forward_types"), nullptr);  // a leading run: the published key suffices
  hp.ffn_kinds = {FfnKind::moe, FfnKind::dense, FfnKind::moe, FfnKind::dense};
  const auto r = round_trip(hp);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->ffn_kinds, hp.ffn_kinds);
  const auto bad = round_trip(hp, [](GgufKv& kv) {
    if (kv.key == "glm5next.leading_dense_block_count") kv.value = uint32_t{1};
    return true;
  });
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().message, "glm5next.leading_dense_block_count is 1 but glm5next.feed_forward_types starts with 0 dense blocks");
}

TEST_F(Glm5Gguf, KdaHeadCountIsWrittenOnlyWhenItDiffers) {
  Glm5Hparams hp = tiny();
  GgufWriter w;
  ASSERT_FALSE(write_glm5_hparams(w, hp));
  EXPECT_EQ(w.find("glm5next.kda.head_count"), nullptr);
  hp.kda_heads = 2;
  const auto r = round_trip(hp);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->kda_heads, 2u);
  EXPECT_EQ(r->n_heads, 4u);
}

}  // namespace
}  // namespace ferry::model

namespace ferry::model {
namespace {

// The transformers-made fixtures: every config parses, and survives GGUF metadata unchanged.
TEST_F(Glm5Gguf, ReferenceFixtureConfigsRoundTrip) {
  for (const char* name : {"serve_tiny", "dsa_adjacent", "kda_moe_long", "short_decode", "trained_small"}) {
    SCOPED_TRACE(name);
    const auto hp = glm5_hparams_from_hf_config_file(std::filesystem::path(FERRY_SOURCE_DIR) / "tests/fixtures/glm5" /
                                                     name / "config.json");
    ASSERT_TRUE(hp) << hp.error().message;
    const auto back = round_trip(hp.value());
    ASSERT_TRUE(back) << back.error().message;
    expect_same(hp.value(), back.value());
  }
}

}  // namespace
}  // namespace ferry::model
