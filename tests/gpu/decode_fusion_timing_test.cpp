// Timing lines (printed, not asserted) of the decode fusions at the 12-layer shape, one row: each
// fusion's launches and the launches it replaces, captured in a graph apiece and replayed (event-timed
// median of 7 runs of 20 replays), so that the line shows what a launch costs inside a decode graph.
// The bits are the fusion tests' concern (DsaDecodeFusion, KdaNormFusion, MoeCombineFusion,
// MoeDecodeTest.OneRowTakesTheSharedExpertInItsLaunches).
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/decode_fusion.hpp"
#include "gpu/dsa_decode_fusion.hpp"
#include "gpu/kda_fusion.hpp"
#include "gpu/kernels.hpp"
#include "gpu/mhc_decode.hpp"
#include "gpu/moe_decode.hpp"
#include "gpu/pdl.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/gpu/graph_timing.hpp"
#include "tests/gpu/quant_rows.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::graph_replay_us;
using ferry::testing::have_device;
using ferry::testing::random_buffer;

template <class V>
DeviceBuffer to_device(const std::vector<V>& v) {
  DeviceBuffer b(v.size() * sizeof(V));
  EXPECT_EQ(cudaMemcpy(b.get(), v.data(), b.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  return b;
}

// Microseconds a replay of the graph of what `body` enqueues, plain launches (PDL where a test asks for it).
double replay_us(const std::function<void(cudaStream_t)>& body) { return graph_replay_us(body, 20, false); }

void line(const char* what, int plain_launches, double plain, int fused_launches, double fused) {
  std::printf("fusion timing: %s: %d launches %.1f us, %d launch%s %.1f us a graph replay\n", what, plain_launches,
              plain, fused_launches, fused_launches == 1 ? "" : "es", fused);
}

TEST(DecodeFusionTiming, TimingLine) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(11);
  const std::vector<int32_t> zero = {0}, pos = {1023}, len = {1};
  const DeviceBuffer d_zero = to_device(zero), d_pos = to_device(pos), d_len = to_device(len);
  const RowInfo row{d_zero.as<int32_t>(), d_pos.as<int32_t>(), d_zero.as<int32_t>()};
  const SegInfo seg{d_zero.as<int32_t>(), d_pos.as<int32_t>(), d_len.as<int32_t>(), d_zero.as<int32_t>()};

  {  // DSA norms and the latent store: q_a 1,536, kv_a 512, f32 latents of a 4,096-row context.
    DeviceBuffer qa = random_buffer(1536, 1, rng), qw = random_buffer(1536, 1, rng), qr = random_buffer(1536, 1, rng),
                 lat = random_buffer(512, 1, rng), lw = random_buffer(512, 1, rng), cache(size_t{4096} * 512 * 4);
    const double plain = replay_us([&](cudaStream_t s) {
      rms_norm(qa.as<float>(), 1536, qw.as<float>(), 1, 1536, 1e-5f, qr.as<float>(), 1536, s);
      rms_norm(lat.as<float>(), 512, lw.as<float>(), 1, 512, 1e-5f, lat.as<float>(), 512, s);
      store_latents(lat.as<float>(), 512, row, 1, 512, 4096, config::KvType::f32, cache.get(), nullptr, s);
    });
    DsaNormsArgs a;
    a.rows = 1, a.qa = qa.as<float>(), a.qa_stride = 1536, a.qa_w = qw.as<float>(), a.qlr = 1536;
    a.qr = qr.as<float>(), a.qr_stride = 1536, a.lat = lat.as<float>(), a.lat_stride = 512, a.lat_w = lw.as<float>();
    a.kvlr = 512, a.row = row, a.ctx = 4096, a.cache = cache.get();
    line("DSA norms + latent store", 3, plain, 1, replay_us([&](cudaStream_t s) { dsa_norms(a, s); }));
  }
  {  // The indexer's keys: width 128, rings of 4,096 rows, pools of 4 (position 1,023 completes one).
    DeviceBuffer kk = random_buffer(128, 1, rng), gs = random_buffer(128, 1, rng), w = random_buffer(128, 1, rng),
                 b = random_buffer(128, 1, rng), ape = random_buffer(4 * 128, 1, rng),
                 keys = random_buffer(size_t{4096} * 128, 1, rng), gates = random_buffer(size_t{4096} * 128, 1, rng),
                 pools(size_t{1024} * 128 * 4);
    IndexerKeysArgs k;
    k.rows = 1, k.width = 128, k.kk = kk.as<float>(), k.kk_stride = 128, k.w = w.as<float>(), k.b = b.as<float>();
    k.gs = gs.as<float>(), k.gs_stride = 128, k.row = row, k.key_rows = 4096, k.keys = keys.as<float>();
    k.gates = gates.as<float>();
    IndexerArgs ia;
    ia.row = row, ia.seg = seg, ia.rows = 1, ia.segments = 1, ia.max_rows_per_segment = 1, ia.head_dim = 128;
    ia.kpool = 4, ia.ctx = 4096, ia.key_rows = 4096, ia.kk_cache = keys.as<float>(), ia.gate_cache = gates.as<float>();
    ia.ape = ape.as<float>(), ia.pool_cache = pools.as<float>();
    const double plain = replay_us([&](cudaStream_t s) {
      layer_norm(k.kk, 128, k.w, k.b, 1, 128, 1e-6f, k.kk, 128, s);
      scatter_to_cache(k.kk, 128, row, 1, 128, 4096, k.keys, s);
      scatter_to_cache(k.gs, 128, row, 1, 128, 4096, k.gates, s);
      indexer_pool_keys(ia, s);
    });
    line("indexer key norm + rings + pool keys", 4, plain, 1,
         replay_us([&](cudaStream_t s) { indexer_keys_and_pools(k, ia, s); }));
  }
  {  // The KDA recurrence and its gated norm: 64 heads of 128.
    constexpr uint32_t H = 64, DK = 128, C = H * DK;
    DeviceBuffer qkv = random_buffer(3 * C, 0.09f, rng), f = random_buffer(C, 1, rng), beta = random_buffer(H, 1, rng),
                 dt = random_buffer(C, 0.5f, rng), state = random_buffer(size_t{H} * DK * DK, 0.1f, rng),
                 o(C * 4), gate = random_buffer(C, 1, rng), w = random_buffer(DK, 1, rng), z(C * 4);
    std::vector<float> ssm_a(H, -1.0f);
    const DeviceBuffer d_a = to_device(ssm_a);
    KdaArgs a;
    a.row = row, a.seg = seg, a.rows = 1, a.segments = 1, a.heads = H, a.head_dim = DK, a.qkv = qkv.as<float>();
    a.f = f.as<float>(), a.dt_bias = dt.as<float>(), a.a = d_a.as<float>(), a.beta = beta.as<float>();
    a.state = state.as<float>(), a.out = o.as<float>();
    const GatedNorm g{gate.as<float>(), w.as<float>(), 1e-5f, z.as<float>()};
    const double plain = replay_us([&](cudaStream_t s) {
      kda_recurrent(a, s);
      gated_rms_norm(a.out, g.gate, g.w, 1, H, DK, g.eps, g.out, s);
    });
    bool fused = false;
    const double one = replay_us([&](cudaStream_t s) { fused = kda_recurrent_gated_norm(a, g, s); });
    if (fused) line("KDA recurrence + gated norm", 2, plain, 1, one);
    if (!fused) std::printf("fusion timing: KDA recurrence + gated norm: not fused here (no sm90 code)\n");
  }
  {  // The MoE combine before an mHC site: 8 experts and the shared one, D 4,096, H 4.
    constexpr uint32_t D = 4096, H = 4, K = 8, kMix = (2 + H) * H;
    DeviceBuffer streams = random_buffer(H * D, 1, rng), eo = random_buffer(K * D, 1, rng),
                 rw = random_buffer(K, 0.3f, rng), sh = random_buffer(D, 1, rng), y(D * 4),
                 post = random_buffer(H, 1, rng), comb = random_buffer(H * H, 0.3f, rng),
                 fn = random_buffer(size_t{kMix} * H * D, 0.008f, rng), base = random_buffer(kMix, 1, rng),
                 scale = random_buffer(3, 1, rng), norm = random_buffer(D, 1, rng), x(D * 4);
    DevMatrix m;
    m.type = model::GgmlType::F32, m.data = fn.as<uint8_t>(), m.rows = kMix, m.cols = H * D;
    m.row_bytes = size_t{m.cols} * 4;
    MhcPostPre p;
    p.pre.streams = streams.as<float>(), p.pre.base = base.as<float>(), p.pre.scale = scale.as<float>();
    p.pre.norm_w = norm.as<float>(), p.pre.rows = 1, p.pre.H = H, p.pre.D = D, p.pre.iters = 20;
    p.pre.x = x.as<float>(), p.pre.post = post.as<float>(), p.pre.comb = comb.as<float>();
    p.fn = &m, p.streams = streams.as<float>(), p.post_in = post.as<float>(), p.comb_in = comb.as<float>();
    p.y = y.as<float>();
    const MoeCombineIn c{eo.as<float>(), rw.as<float>(), sh.as<float>(), K};
    bool fused = true;
    const double plain = replay_us([&](cudaStream_t s) {
      moe_combine(c.eo, nullptr, c.weights, c.shared, 1, K, D, y.as<float>(), s);
      fused = mhc_post_pre(p, s);
    });
    MhcPostPre pc = p;
    pc.combine = &c;
    const double one = replay_us([&](cudaStream_t s) { fused = fused && mhc_post_pre(pc, s); });
    if (fused) line("MoE combine + mHC site", 2, plain, 1, one);
    if (!fused) std::printf("fusion timing: MoE combine + mHC site: not fused here (no sm90 code)\n");
  }
}

// The MoE layer's shared expert in the routed experts' launches (gpu/moe_decode.hpp): 8 routed
// experts and the shared one, Q4_K, D 4,096, I 2,048 (the 12-layer shape's), with and without PDL.
TEST(DecodeFusionTiming, SharedExpertInTheRoutedLaunches) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(12);
  constexpr uint32_t D = 4096, I = 2048, K = 8;
  const size_t gate_bytes = *model::ggml_bytes(model::GgmlType::Q4_K, size_t{I} * D);
  const DeviceBuffer gate = to_device(ferry::testing::random_q4k_blocks(size_t{K + 1} * I, D)),
                     up = to_device(ferry::testing::random_q4k_blocks(size_t{K + 1} * I, D)),
                     down = to_device(ferry::testing::random_q4k_blocks(size_t{K + 1} * D, I));
  std::vector<int32_t> ids(K);
  for (uint32_t j = 0; j < K; ++j) ids[j] = static_cast<int32_t>(j);
  const DeviceBuffer d_ids = to_device(ids);
  DeviceBuffer x = random_buffer(D, 1, rng), eg(size_t{K + 1} * I * 4), eu(size_t{K + 1} * I * 4), eo(size_t{K} * D * 4),
               sh(size_t{D} * 4);
  auto matrix = [](const DeviceBuffer& b, uint32_t rows, uint32_t cols, size_t at) {
    return DevMatrix{model::GgmlType::Q4_K, b.as<uint8_t>() + at, rows, cols,
                     *model::ggml_bytes(model::GgmlType::Q4_K, cols)};
  };
  DecodeExperts a;
  a.gate = matrix(gate, I, D, 0), a.up = matrix(up, I, D, 0), a.down = matrix(down, D, I, 0);
  a.ids = d_ids.as<int32_t>(), a.x = x.as<float>(), a.rows = 1, a.k = K, a.swiglu_limit = 10.0f;
  a.eg = eg.as<float>(), a.eu = eu.as<float>(), a.eo = eo.as<float>();
  const DevMatrix sg = matrix(gate, I, D, K * gate_bytes), su = matrix(up, I, D, K * gate_bytes),
                  sd = matrix(down, D, I, K * gate_bytes);
  float* const sg_y = a.eg + size_t{K} * I;
  float* const su_y = a.eu + size_t{K} * I;
  auto apart = [&](cudaStream_t s) {
    const MatvecProduct gate_up[] = {{&sg, sg_y}, {&su, su_y}};
    matvec_products(gate_up, 2, a.x, D, 1, I, s);
    MatvecArgs d;
    d.w = sd, d.x_tok_stride = I, d.y = sh.as<float>(), d.y_tok_stride = D;
    matvec_swiglu(d, sg_y, su_y, I, 1, I, a.swiglu_limit, s);
    decode_experts_per_route(a, s);
  };
  DecodeExperts b = a;
  b.shared_gate = sg, b.shared_up = su, b.shared_down = sd, b.sg = sg_y, b.su = su_y, b.sh = sh.as<float>();
  ASSERT_TRUE(shared_expert_fused(b));
  auto fused = [&](cudaStream_t s) { decode_experts_per_route(b, s); };
  line("shared expert + routed experts (no PDL)", 4, replay_us(apart), 2, replay_us(fused));
  const bool pdl = pdl_device_ready();
  auto with_pdl = [&](const std::function<void(cudaStream_t)>& body) {
    return [&, body](cudaStream_t s) {
      const PdlScope scope(pdl);
      body(s);
    };
  };
  line(pdl ? "shared expert + routed experts (PDL)" : "shared expert + routed experts (no PDL on this device)", 4,
       replay_us(with_pdl(apart)), 2, replay_us(with_pdl(fused)));
}

}  // namespace
}  // namespace ferry::gpu
#endif
