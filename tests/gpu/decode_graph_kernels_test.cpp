// The kernels of one captured decode step (CudaStage::decode_graph_kernels, issue 15's launch count):
// a CUDA stage on the random Q4_K 5-layer model decodes one slot until its one-row graph is
// captured; the list is printed in order (runs of one kernel folded) with its count, and the fused
// launches must stand in for the ones they replace: no DSA norm, latent store, key norm or ring write
// or pool keys of their own, the last MoE combine in the final post, and (where the mHC cluster
// kernel runs: sm90 code) a comb kernel a site, no MoE combine and no gated norm apart from its
// recurrence.
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gpu/cuda_stage.hpp"
#include "gpu/graph_kernels.hpp"
#include "model/glm5/glm5_weights.hpp"
#include "model/pipeline.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/model/random_model.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::have_device;
using model::SlotRows;

TEST(DecodeGraphKernels, ShortNamesDropNamespacesAndParameters) {
  // Itanium names of `void ferry::gpu::(anon)::f<5, 1>(int)` and `void ferry::gpu::g(float*)`.
  EXPECT_EQ(short_kernel_name("_ZN5ferry3gpu12_GLOBAL__N_11fILi5ELi1EEEvi"), "f<5, 1>");
  EXPECT_EQ(short_kernel_name("_ZN5ferry3gpu1gEPf"), "g");
  // nvcc's name for an anonymous namespace, as cudaFuncGetName gives it.
  EXPECT_EQ(short_kernel_name("_ZN5ferry3gpu38_GLOBAL__N__ee5153d1_6_kda_cu_f7908fdc21recurrent_norm_kernelILi128EEEvNS0_"
                              "7KdaArgsENS0_9GatedNormE"),
            "recurrent_norm_kernel<128>");
  EXPECT_EQ(short_kernel_name("not_mangled"), "not_mangled");
}

TEST(DecodeGraphKernels, OneRowStepListsItsFusedLaunches) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  model::Glm5Hparams hp = ferry::testing::tiny_gpu_shape(256);  // rows of 256: the int16 matvecs
  hp.kda_head_dim = 32;  // a warp a head: the recurrence and its norm in one launch where built for sm90
  ASSERT_TRUE(hp.validate().empty());
  const std::string path = testing::temp_model_path("graph_kernels_q4_k");
  ASSERT_TRUE(testing::write_random_model(hp, model::GgmlType::Q4_K, path, 29));
  auto w = model::Glm5Weights::load(path);
  ASSERT_TRUE(w) << w.error().message;
  CudaStageOptions o;
  o.max_slots = 1;
  o.max_context = 256;
  o.max_step_rows = 32;
  auto s = CudaStage::from_weights(*w.value(), {0, hp.n_layers}, o);
  ASSERT_TRUE(s) << s.error().message;
  CudaStage* cs = s.value().get();
  std::vector<std::shared_ptr<model::Stage>> stages{std::move(s.value())};
  auto p = model::Pipeline::make(std::move(stages));
  ASSERT_TRUE(p) << p.error().message;
  std::vector<int32_t> prompt(20);
  std::mt19937 rng(5);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % hp.vocab_size);
  auto r = p.value()->step({SlotRows{0, 0, prompt, false, true, {}}});
  ASSERT_TRUE(r) << r.error().message;
  int32_t next = r.value()[0].sampled;
  for (uint32_t i = 0; i < 3; ++i) {  // eager, captured, replayed
    r = p.value()->step({SlotRows{0, static_cast<uint32_t>(prompt.size()) + i, {next}, false, true, {}}});
    ASSERT_TRUE(r) << r.error().message;
    next = r.value()[0].sampled;
  }
  std::filesystem::remove(path);
  const std::vector<std::string> k = cs->decode_graph_kernels(1, 1, 1);
  ASSERT_FALSE(k.empty()) << "no one-row decode graph was captured";
  std::map<std::string, int> count;
  std::cout << "decode graph, one row, " << hp.n_layers << " layers: " << k.size() << " kernels:";
  for (size_t i = 0; i < k.size();) {
    size_t j = i;
    while (j < k.size() && k[j] == k[i]) ++j;
    std::cout << (i == 0 ? " " : ", ") << k[i];
    if (j - i > 1) std::cout << " x" << j - i;
    i = j;
  }
  std::cout << "\n";
  for (const std::string& name : k) ++count[name];
  for (const char* replaced : {"rms_norm_kernel", "store_latents_kernel", "layer_norm_kernel", "scatter_to_cache_kernel",
                               "pool_key_kernel", "indexer_keys_kernel"}) {
    EXPECT_EQ(count[replaced], 0) << replaced << " runs in the decode step beside its fused launch";
  }
  int dsa = 0, indexers = 0;
  for (uint32_t il = 0; il < hp.n_layers; ++il) {
    const bool is_dsa = hp.layer_kinds[il] == model::LayerKind::dsa;
    dsa += is_dsa;
    indexers += is_dsa && hp.indexer_is_full(il);
  }
  EXPECT_EQ(count["dsa_norms_kernel"], dsa);
  EXPECT_EQ(count["indexer_keys_pools_kernel"], indexers);
  // The last layer's MoE combine is made by the final post.
  EXPECT_EQ(count["mhc_post_combine_kernel"], hp.ffn_kinds.back() == model::FfnKind::moe ? 1 : 0);
  const int sites = count["mhc_site_kernel<16>"] + count["mhc_site_kernel<8>"];
  if (sites > 0) {
    // sm90 code: every other MoE combine is made inside the next mHC site, every site's comb on
    // the branch beside the sublayer, and every KDA recurrence runs with its gated norm.
    EXPECT_EQ(sites, 2 * static_cast<int>(hp.n_layers));
    EXPECT_EQ(count["mhc_comb_kernel"], sites);
    EXPECT_EQ(count["moe_combine_kernel"], 0);
    const int kda = static_cast<int>(hp.n_layers) - dsa;
    EXPECT_EQ(count["recurrent_norm_kernel<32>"], kda);
    EXPECT_EQ(count["gated_norm_kernel"], 0);
  }
}

}  // namespace
}  // namespace ferry::gpu
#endif
