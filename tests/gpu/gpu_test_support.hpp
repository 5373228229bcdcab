// What the CUDA tests share: whether a device is visible, buffers of random values, and the small
// 5-layer glm5_next shape (KDA and DSA layers, dense then MoE) their stages run.
#pragma once

#include <cuda_runtime_api.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "model/glm5/glm5_hparams.hpp"

namespace ferry::testing {

inline bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// `floats` values drawn from N(0, scale^2), on the device.
inline gpu::DeviceBuffer random_buffer(size_t floats, float scale, std::mt19937& rng) {
  std::normal_distribution<float> n(0.0f, scale);
  std::vector<float> v(floats);
  for (float& x : v) x = n(rng);
  gpu::DeviceBuffer b(floats * 4);
  EXPECT_EQ(cudaMemcpy(b.get(), v.data(), floats * 4, cudaMemcpyHostToDevice), cudaSuccess);
  return b;
}

inline model::Glm5Hparams tiny_gpu_shape(uint32_t hidden) {
  using model::FfnKind;
  using model::LayerKind;
  model::Glm5Hparams hp;
  hp.vocab_size = 97;
  hp.hidden_size = hidden;
  hp.n_layers = 5;
  hp.n_nextn_layers = 0;
  hp.dense_ffn = 48;
  hp.moe_ffn = 32;
  hp.n_experts = 6;
  hp.n_experts_used = 2;
  hp.n_group = 3;
  hp.topk_group = 2;
  hp.n_heads = 2;
  hp.q_lora_rank = 64;
  hp.kv_lora_rank = 32;
  hp.qk_nope_head_dim = 16;
  hp.v_head_dim = 24;
  hp.index_n_heads = 16;
  hp.index_head_dim = 16;
  hp.index_topk = 8;
  hp.index_kpool = 4;
  hp.kda_heads = 2;
  hp.kda_head_dim = 16;
  hp.hc_mult = 4;
  hp.context_length = 4096;
  hp.routed_scaling = 2.5f;
  hp.swiglu_limit = 1.5f;
  hp.layer_kinds = {LayerKind::kda, LayerKind::dsa, LayerKind::kda, LayerKind::dsa, LayerKind::dsa};
  hp.ffn_kinds = {FfnKind::dense, FfnKind::moe, FfnKind::moe, FfnKind::moe, FfnKind::moe};
  return hp;
}

}  // namespace ferry::testing
