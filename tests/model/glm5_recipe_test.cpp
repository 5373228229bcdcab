// The shipped recipes (model/glm5/recipes/) on the released shape: the types they give each group and
// the file size they make, against the sizes of the user's two files (SEED.md, in GiB).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <map>

#include "model/glm5/glm5_convert.hpp"
#include "model/glm5/glm5_inspect.hpp"
#include "model/glm5/glm5_type_rules.hpp"

namespace ferry::model {
namespace {

Glm5Hparams released() {
  Glm5Hparams hp;  // the defaults are the release's but for the schedules
  for (uint32_t i = 0; i < hp.n_layers; ++i) {
    hp.layer_kinds.push_back(i % 4 != 3 ? LayerKind::kda : LayerKind::dsa);
    hp.ffn_kinds.push_back(i < 3 ? FfnKind::dense : FfnKind::moe);
  }
  return hp;
}

Glm5TypePolicy recipe(const char* name) {
  auto rules = Glm5TypeRules::load_recipe(std::filesystem::path(FERRY_SOURCE_DIR) / "model/glm5/recipes" / name);
  EXPECT_TRUE(rules) << (rules ? "" : rules.error().message);
  Glm5TypePolicy p;
  p.type = GgmlType::BF16;  // every recipe ends in a catch-all rule: --type does not matter
  if (rules) p.rules = *rules;
  return p;
}

struct Plan {
  uint64_t bytes = 0;
  uint64_t f32_matrices = 0;  // 2-D and larger tensors stored f32 (what the user counts as "kept in F32")
  std::map<std::string, std::map<GgmlType, uint64_t>> groups;  // group -> type -> tensors
};

Plan plan(const Glm5TypePolicy& p) {
  Plan out;
  const Glm5Hparams hp = released();
  for (const Glm5TensorSpec& spec : glm5_all_tensors(hp)) {
    if (spec.optional) continue;  // the MTP block's own embedding and head: the release has none
    const GgmlType t = glm5_tensor_type(spec, p);
    out.bytes += *ggml_bytes(t, spec.n_elements());
    out.groups[std::string(glm5_tensor_group(spec.role))][t] += 1;
  }
  // The user's 45: F32 matrices beyond those every glm5next file keeps F32 (mHC mixers, router,
  // indexer head weights and the APE are F32 in the published files too).
  for (const Glm5TensorSpec& spec : glm5_all_tensors(hp)) {
    if (spec.optional || spec.keep_f32 || spec.dims.size() < 2) continue;
    if (glm5_tensor_type(spec, p) == GgmlType::F32) ++out.f32_matrices;
  }
  return out;
}

double gib(uint64_t b) { return static_cast<double>(b) / double(uint64_t{1} << 30); }

TEST(Glm5Recipes, MayaLIsTheUsersPrimaryMix) {
  const Plan pl = plan(recipe("maya-l.recipe"));
  std::printf("maya-l on the released shape: %.2f GiB (%.2f GB), %llu extra f32 matrices\n", gib(pl.bytes),
              static_cast<double>(pl.bytes) / 1e9, static_cast<unsigned long long>(pl.f32_matrices));
  EXPECT_NEAR(gib(pl.bytes), 156.3, 156.3 * 0.01);  // within 1% of the user's figure
  EXPECT_EQ(pl.f32_matrices, 34u);  // ssm_beta; with the 11 trunk indexer.proj (F32 anyway): the user's 45
  using G = std::map<GgmlType, uint64_t>;
  // groups by role: the 42 MoE trunk blocks and the MTP block (43) together
  EXPECT_EQ(pl.groups.at("routed experts: gate, up"), (G{{GgmlType::IQ3_S, 86}}));
  EXPECT_EQ(pl.groups.at("routed experts: down"), (G{{GgmlType::Q5_K, 43}}));
  EXPECT_EQ(pl.groups.at("token embedding"), (G{{GgmlType::IQ4_XS, 1}}));
  EXPECT_EQ(pl.groups.at("output head"), (G{{GgmlType::Q6_K, 1}}));
  EXPECT_EQ(pl.groups.at("shared expert"), (G{{GgmlType::Q5_K, 129}}));
  EXPECT_EQ(pl.groups.at("attention output"), (G{{GgmlType::Q5_K, 46}}));
}

TEST(Glm5Recipes, Q4KXLIsTheUsersFallbackMix) {
  const Plan pl = plan(recipe("q4_k_xl.recipe"));
  std::printf("q4_k_xl on the released shape: %.2f GiB (%.2f GB), %llu extra f32 matrices\n", gib(pl.bytes),
              static_cast<double>(pl.bytes) / 1e9, static_cast<unsigned long long>(pl.f32_matrices));
  EXPECT_NEAR(gib(pl.bytes), 186.5, 186.5 * 0.01);
  using G = std::map<GgmlType, uint64_t>;
  EXPECT_EQ(pl.groups.at("routed experts: gate, up"), (G{{GgmlType::Q4_K, 86}}));
  EXPECT_EQ(pl.groups.at("routed experts: down"), (G{{GgmlType::Q5_K, 36}, {GgmlType::Q6_K, 7}}));
  EXPECT_EQ(pl.groups.at("output head"), (G{{GgmlType::Q8_0, 1}}));
  EXPECT_EQ(pl.groups.at("MLA projections").count(GgmlType::Q8_0), 1u);
}

}  // namespace
}  // namespace ferry::model
