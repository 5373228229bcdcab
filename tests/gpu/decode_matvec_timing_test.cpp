// Timing lines (printed, not asserted) of decode's quantized matvecs at the 12-layer shape, one row,
// inside captured graphs with PDL as a decode step runs them (event-timed median of 7 runs of 10
// replays, the first run a warm-up):
// - the routed experts' two launches of a MoE layer (8 of 288 experts and the shared expert as
//   parts: gate/up, then down over their SwiGLU; gpu/moe_decode.hpp), over 9 layers of distinct
//   experts a replay, so that no launch finds its weights in L2 from the one before;
// - the same launches in the user's mix (model/glm5/recipes/maya-l.recipe: IQ3_S gate and up on the
//   dp2a kernel, Q5_K down and shared expert on the tensor-core kernel where it is built), the shared
//   expert in the routes' launches (its gate and up a launch of their own: fused_gate_up) and apart;
// - chains of 36 calls of one shape (each its own matrix, reading x and writing its own y): the
//   per-call time and its weights' GB/s, against the copy bandwidth (read + write); Q4_K (with KDA's
//   and DSA's output projections, K 8,192 and 16,384; the down projections over their SwiGLU input), and
//   the user's mix's Q5_K shapes and Q6_K head.
// The bits are MoeDecodeTest's and MatvecMmaTest's concern.
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "gpu/bandwidth.hpp"
#include "gpu/cuda_memory.hpp"
#include "gpu/decode_fusion.hpp"
#include "gpu/kernels.hpp"
#include "gpu/moe_decode.hpp"
#include "gpu/pdl.hpp"
#include "model/formats/quant.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/gpu/graph_timing.hpp"
#include "tests/gpu/quant_rows.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::copy_gbs;
using ferry::testing::graph_replay_us;
using ferry::testing::have_device;
using ferry::testing::random_buffer;
using model::GgmlType;

// `count` distinct expert ids of `E` in random order, on the device.
DeviceBuffer distinct_experts(uint32_t E, uint32_t count, std::mt19937& rng) {
  std::vector<int32_t> all(E);
  for (uint32_t e = 0; e < E; ++e) all[e] = static_cast<int32_t>(e);
  std::shuffle(all.begin(), all.end(), rng);
  DeviceBuffer d(size_t{count} * 4);
  EXPECT_EQ(cudaMemcpy(d.get(), all.data(), size_t{count} * 4, cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

// `copies` copies of one random Q4_K matrix of rows x cols, back to back.
DeviceBuffer q4k_copies(size_t rows, size_t cols, size_t copies) {
  const std::vector<uint8_t> one = ferry::testing::random_q4k_blocks(rows, cols);
  DeviceBuffer b(one.size() * copies);
  EXPECT_EQ(cudaMemcpy(b.get(), one.data(), one.size(), cudaMemcpyHostToDevice), cudaSuccess);
  for (size_t i = 1; i < copies; ++i) {
    EXPECT_EQ(cudaMemcpy(b.as<uint8_t>() + i * one.size(), b.get(), one.size(), cudaMemcpyDeviceToDevice), cudaSuccess);
  }
  return b;
}
DevMatrix q4k(const DeviceBuffer& b, size_t rows, size_t cols, size_t index) {
  const size_t row_bytes = *model::ggml_bytes(GgmlType::Q4_K, cols);
  return {GgmlType::Q4_K, b.as<uint8_t>() + index * rows * row_bytes, static_cast<uint32_t>(rows),
          static_cast<uint32_t>(cols), row_bytes};
}

// `copies` copies of one matrix of random bytes of `type` (its values do not matter for timing).
DeviceBuffer random_copies(GgmlType type, size_t rows, size_t cols, size_t copies) {
  if (type == GgmlType::Q4_K) return q4k_copies(rows, cols, copies);
  std::vector<uint8_t> one(*model::ggml_bytes(type, rows * cols));
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i + 8 <= one.size(); i += 8) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    std::memcpy(&one[i], &s, 8);
  }
  DeviceBuffer b(one.size() * copies);
  for (size_t i = 0; i < copies; ++i) {
    EXPECT_EQ(cudaMemcpy(b.as<uint8_t>() + i * one.size(), one.data(), one.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  return b;
}
DevMatrix matrix(GgmlType type, const DeviceBuffer& b, size_t rows, size_t cols, size_t index) {
  const size_t row_bytes = *model::ggml_bytes(type, cols);
  return {type, b.as<uint8_t>() + index * rows * row_bytes, static_cast<uint32_t>(rows), static_cast<uint32_t>(cols),
          row_bytes};
}

// Microseconds a replay of the graph of what `body` enqueues under PDL.
double replay_us(const std::function<void(cudaStream_t)>& body) { return graph_replay_us(body, 10, true); }

// Bytes of a matrix.
double q_bytes(GgmlType type, size_t rows, size_t cols) { return double(rows) * *model::ggml_bytes(type, cols); }
double q4k_bytes(size_t rows, size_t cols) { return q_bytes(GgmlType::Q4_K, rows, cols); }

// 9 MoE layers, each 8 distinct routed experts of 288 and a shared expert of its own, D 4,096, I 2,048.
TEST(DecodeMatvecTiming, RoutedExpertLaunches) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  constexpr uint32_t D = 4096, I = 2048, E = 288, K = 8, L = 9;
  const double copy = copy_gbs();
  const DeviceBuffer gate = q4k_copies(I, D, E), up = q4k_copies(I, D, E), down = q4k_copies(D, I, E);
  const DeviceBuffer sgate = q4k_copies(I, D, L), sup = q4k_copies(I, D, L), sdown = q4k_copies(D, I, L);
  std::mt19937 rng(61);
  const DeviceBuffer d_ids = distinct_experts(E, L * K, rng);  // layer l's experts: [l K, l K + K)
  const DeviceBuffer x = random_buffer(D, 1.0f, rng);
  DeviceBuffer eg(size_t{K + 1} * I * 4), eu(size_t{K + 1} * I * 4), eo(size_t{K} * D * 4), sh(size_t{D} * 4);
  ASSERT_EQ(cudaMemset(eg.get(), 0, eg.bytes()), cudaSuccess);
  ASSERT_EQ(cudaMemset(eu.get(), 0, eu.bytes()), cudaSuccess);
  std::vector<DecodeExperts> layers(L);
  for (uint32_t l = 0; l < L; ++l) {
    DecodeExperts& a = layers[l];
    a.gate = q4k(gate, I, D, 0), a.up = q4k(up, I, D, 0), a.down = q4k(down, D, I, 0);
    a.ids = d_ids.as<int32_t>() + l * K, a.x = x.as<float>(), a.rows = 1, a.k = K, a.swiglu_limit = 10.0f;
    a.eg = eg.as<float>(), a.eu = eu.as<float>(), a.eo = eo.as<float>();
    a.shared_gate = q4k(sgate, I, D, l), a.shared_up = q4k(sup, I, D, l), a.shared_down = q4k(sdown, D, I, l);
    a.sg = a.eg + size_t{K} * I, a.su = a.eu + size_t{K} * I, a.sh = sh.as<float>();
    ASSERT_TRUE(shared_expert_fused(a));
  }
  const double layer_bytes = double(K + 1) * 3 * q4k_bytes(I, D);
  const double us = replay_us([&](cudaStream_t s) {
    for (const DecodeExperts& a : layers) decode_experts_per_route(a, s);
  });
  std::printf("[ timing ] routed experts + shared, %u layers x 2 launches: %.1f us a layer, %.0f GB/s, %.0f%% of copy "
              "(%.0f GB/s)\n",
              L, us / L, layer_bytes / (us / L) / 1e3, 100.0 * layer_bytes / (us / L) / 1e3 / copy, copy);
  // Each launch apart: the gate/up launches of the 9 layers, then the down launches (the products'
  // values do not matter here).
  for (int which = 0; which < 2; ++which) {
    const double one = replay_us([&](cudaStream_t s) {
      for (const DecodeExperts& a : layers) {
        if (which == 0) {
          fused_gate_up(a, s);
        } else {
          matvec(fused_down(a), s);
        }
      }
    });
    const double bytes = double(K + 1) * (which == 0 ? 2 : 1) * q4k_bytes(I, D);
    std::printf("[ timing ] routed experts + shared, %s: %.1f us a launch, %.1f MB, %.0f GB/s, %.0f%% of copy\n",
                which == 0 ? "gate/up" : "down", one / L, bytes / 1e6, bytes / (one / L) / 1e3,
                100.0 * bytes / (one / L) / 1e3 / copy);
  }
}

// The user's mix: 9 MoE layers as above, IQ3_S gate / up and Q5_K down of 288 experts, a Q5_K shared
// expert each: in the routes' launches (shared_expert_fused, the two types in one launch) and apart,
// before them (LayerRunner::dense_ffn: gate and up as one launch, then down over their SwiGLU).
TEST(DecodeMatvecTiming, RoutedExpertLaunchesOfTheUsersMix) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  constexpr uint32_t D = 4096, I = 2048, E = 288, K = 8, L = 9;
  constexpr GgmlType kGateUp = GgmlType::IQ3_S, kDown = GgmlType::Q5_K, kShared = GgmlType::Q5_K;
  const double copy = copy_gbs();
  const DeviceBuffer gate = random_copies(kGateUp, I, D, E), up = random_copies(kGateUp, I, D, E);
  const DeviceBuffer down = random_copies(kDown, D, I, E);
  const DeviceBuffer sgate = random_copies(kShared, I, D, L), sup = random_copies(kShared, I, D, L);
  const DeviceBuffer sdown = random_copies(kShared, D, I, L);
  std::mt19937 rng(72);
  const DeviceBuffer d_ids = distinct_experts(E, L * K, rng);
  const DeviceBuffer x = random_buffer(D, 1.0f, rng);
  DeviceBuffer eg(size_t{K + 1} * I * 4), eu(size_t{K + 1} * I * 4), eo(size_t{K} * D * 4), sh(size_t{D} * 4);
  ASSERT_EQ(cudaMemset(eg.get(), 0, eg.bytes()), cudaSuccess);
  ASSERT_EQ(cudaMemset(eu.get(), 0, eu.bytes()), cudaSuccess);
  std::vector<DecodeExperts> layers(L);
  std::vector<DevMatrix> shared(3 * L);
  for (uint32_t l = 0; l < L; ++l) {
    DecodeExperts& a = layers[l];
    a.gate = matrix(kGateUp, gate, I, D, 0), a.up = matrix(kGateUp, up, I, D, 0), a.down = matrix(kDown, down, D, I, 0);
    a.ids = d_ids.as<int32_t>() + l * K, a.x = x.as<float>(), a.rows = 1, a.k = K, a.swiglu_limit = 10.0f;
    a.eg = eg.as<float>(), a.eu = eu.as<float>(), a.eo = eo.as<float>();
    shared[3 * l] = matrix(kShared, sgate, I, D, l), shared[3 * l + 1] = matrix(kShared, sup, I, D, l);
    shared[3 * l + 2] = matrix(kShared, sdown, D, I, l);
    a.shared_gate = shared[3 * l], a.shared_up = shared[3 * l + 1], a.shared_down = shared[3 * l + 2];
    a.sg = a.eg + size_t{K} * I, a.su = a.eu + size_t{K} * I, a.sh = sh.as<float>();
    ASSERT_TRUE(shared_expert_fused(a));
  }
  // The shared expert apart (LayerRunner::dense_ffn at one row).
  auto shared_apart = [&](uint32_t l, cudaStream_t s, int which) {
    const DecodeExperts& a = layers[l];
    if (which != 1) {
      const MatvecProduct gate_up[] = {{&shared[3 * l], a.sg}, {&shared[3 * l + 1], a.su}};
      EXPECT_TRUE(matvec_products(gate_up, 2, a.x, D, 1, I, s));
    }
    if (which != 0) {
      MatvecArgs d;
      d.w = shared[3 * l + 2];
      d.x_tok_stride = I;
      d.y = a.sh;
      d.y_tok_stride = D;
      matvec_swiglu(d, a.sg, a.su, I, 1, I, a.swiglu_limit, s);
    }
  };
  auto apart = [&](uint32_t l) {
    DecodeExperts a = layers[l];
    a.shared_gate = {};
    return a;
  };
  const double layer_bytes = double(K) * (2 * q_bytes(kGateUp, I, D) + q_bytes(kDown, D, I)) +
                             2 * q_bytes(kShared, I, D) + q_bytes(kShared, D, I);
  for (const bool fused : {false, true}) {
    const double us = replay_us([&](cudaStream_t s) {
      for (uint32_t l = 0; l < L; ++l) {
        if (!fused) shared_apart(l, s, 2);
        decode_experts_per_route(fused ? layers[l] : apart(l), s);
      }
    });
    std::printf("[ timing ] the user's mix, routed experts + shared (%s), %u layers: %.1f us a layer, %.0f GB/s, %.0f%% "
                "of copy (%.0f GB/s)\n",
                fused ? "in their launches" : "apart", L, us / L, layer_bytes / (us / L) / 1e3,
                100.0 * layer_bytes / (us / L) / 1e3 / copy, copy);
  }
  // Each launch apart, over the 9 layers.
  struct Launch {
    const char* name;
    double bytes;
    std::function<void(uint32_t, cudaStream_t)> run;
  };
  const Launch launches[] = {
      {"shared gate/up", 2 * q_bytes(kShared, I, D), [&](uint32_t l, cudaStream_t s) { shared_apart(l, s, 0); }},
      {"shared down", q_bytes(kShared, D, I), [&](uint32_t l, cudaStream_t s) { shared_apart(l, s, 1); }},
      {"routed gate/up + down", double(K) * (2 * q_bytes(kGateUp, I, D) + q_bytes(kDown, D, I)),
       [&](uint32_t l, cudaStream_t s) { decode_experts_per_route(apart(l), s); }},
      {"gate/up + shared", double(K) * 2 * q_bytes(kGateUp, I, D) + 2 * q_bytes(kShared, I, D),
       [&](uint32_t l, cudaStream_t s) { fused_gate_up(layers[l], s); }},
      {"down + shared", double(K) * q_bytes(kDown, D, I) + q_bytes(kShared, D, I),
       [&](uint32_t l, cudaStream_t s) { matvec(fused_down(layers[l]), s); }}};
  for (const Launch& la : launches) {
    const double one = replay_us([&](cudaStream_t s) {
      for (uint32_t l = 0; l < L; ++l) la.run(l, s);
    });
    std::printf("[ timing ] the user's mix, %s: %.1f us a layer, %.1f MB, %.0f GB/s, %.0f%% of copy\n", la.name, one / L,
                la.bytes / 1e6, la.bytes / (one / L) / 1e3, 100.0 * la.bytes / (one / L) / 1e3 / copy);
  }
}

// Chains of one shape: `calls` calls a replay, each its own matrix of `type` (rows x cols), x and its own y;
// with `swiglu`, the input is SwiGLU(x, up) as a down projection reads its gate and up products.
void time_chains(GgmlType type, std::initializer_list<std::pair<size_t, size_t>> shapes, size_t calls,
                 bool swiglu = false) {
  const double copy = copy_gbs();
  std::mt19937 rng(62);
  const DeviceBuffer x = random_buffer(16384, 1.0f, rng), up = random_buffer(16384, 1.0f, rng);
  DeviceBuffer y(calls * 160000 * 4);
  const std::string name(model::ggml_type_traits(type).name);
  for (const auto& [rows, cols] : shapes) {
    const DeviceBuffer w = random_copies(type, rows, cols, calls);
    const double us = replay_us([&](cudaStream_t s) {
      for (size_t i = 0; i < calls; ++i) {
        MatvecArgs a;
        a.w = matrix(type, w, rows, cols, i);
        a.x = x.as<float>();
        a.x_tok_stride = cols;
        a.y = y.as<float>() + i * rows;
        a.y_tok_stride = rows;
        if (swiglu) a.x_up = up.as<float>(), a.swiglu_limit = 10.0f;
        matvec(a, s);
      }
    });
    const double bytes = q_bytes(type, rows, cols), per = us / calls;
    std::printf("[ timing ] chain of %zu %s %zu x %zu%s (%.1f MB): %.2f us a call, %.0f GB/s, %.0f%% of copy\n", calls,
                name.c_str(), rows, cols, swiglu ? " over a SwiGLU" : "", bytes / 1e6, per, bytes / per / 1e3,
                100.0 * bytes / per / 1e3 / copy);
  }
}

TEST(DecodeMatvecTiming, ChainsOfOneShape) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  time_chains(GgmlType::Q4_K,
              {{4096, 2048}, {4096, 4096}, {2048, 4096}, {8192, 4096}, {12288, 4096}, {4096, 8192}, {4096, 12288}, {4096, 16384}},
              36);
}

// Down projections over their SwiGLU input: the dense FFN's (K 12,288) and a shared expert's apart (K 2,048).
TEST(DecodeMatvecTiming, ChainsOfSwigluInput) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  time_chains(GgmlType::Q4_K, {{4096, 12288}, {4096, 2048}}, 36, true);
}

// Plain (eager, no PDL) calls of decode's slow Q4_K shapes, one matrix each: first one call of each in
// turn (what a profiler is pointed at: `ncu --launch-count 5`), then 20 of each, event-timed.
TEST(DecodeMatvecTiming, PlainCallsOfTheSlowShapes) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  struct Shape {
    const char* name;
    size_t rows, cols;
    bool swiglu;
  };
  const Shape shapes[] = {{"dense FFN down", 4096, 12288, true},
                          {"KDA out", 4096, 8192, false},
                          {"4096 x 4096", 4096, 4096, false},
                          {"12288 x 4096", 12288, 4096, false},
                          {"DSA out", 4096, 16384, false}};
  const double copy = copy_gbs();
  std::mt19937 rng(63);
  const DeviceBuffer x = random_buffer(16384, 1.0f, rng), up = random_buffer(16384, 1.0f, rng);
  DeviceBuffer y(12288 * 4);
  std::vector<DeviceBuffer> w;
  std::vector<MatvecArgs> calls;
  for (const Shape& sh : shapes) {
    w.push_back(q4k_copies(sh.rows, sh.cols, 1));
    MatvecArgs a;
    a.w = q4k(w.back(), sh.rows, sh.cols, 0);
    a.x = x.as<float>();
    a.x_tok_stride = sh.cols;
    a.y = y.as<float>();
    a.y_tok_stride = sh.rows;
    if (sh.swiglu) a.x_up = up.as<float>(), a.swiglu_limit = 10.0f;
    calls.push_back(a);
  }
  for (const MatvecArgs& a : calls) matvec(a, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (size_t i = 0; i < calls.size(); ++i) {
    Event e0, e1;
    e0.record(nullptr);
    for (int r = 0; r < 20; ++r) matvec(calls[i], nullptr);
    e1.record(nullptr);
    ASSERT_EQ(cudaEventSynchronize(e1.get()), cudaSuccess);
    const double us = e1.since(e0) * 1000.0 / 20, bytes = q4k_bytes(shapes[i].rows, shapes[i].cols);
    std::printf("[ timing ] plain call, %s (%zu x %zu, %.1f MB): %.2f us, %.0f GB/s, %.0f%% of copy\n", shapes[i].name,
                shapes[i].rows, shapes[i].cols, bytes / 1e6, us, bytes / us / 1e3, 100.0 * bytes / us / 1e3 / copy);
  }
}

// The user's mix outside the routed experts (maya-l.recipe): Q5_K projections and dense FFNs, the Q6_K
// output head (154,880 x 4,096: 4 calls a replay).
TEST(DecodeMatvecTiming, ChainsOfTheUsersTypes) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  time_chains(GgmlType::Q5_K, {{4096, 2048}, {4096, 4096}, {8192, 4096}, {12288, 4096}, {4096, 12288}}, 36);
  time_chains(GgmlType::Q6_K, {{154880, 4096}}, 4);
}

}  // namespace
}  // namespace ferry::gpu
#endif
