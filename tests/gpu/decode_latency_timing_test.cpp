// Timing lines (printed, not asserted) of decode's one-block-latency kernels where a decode graph runs
// them: an mHC site (the post, the mixer product and the pre in one launch, gpu/mhc_decode.hpp) after
// the 4,096 x 4,096 Q4_K matvec whose output it takes, and the router after its 288-row matvec, each
// in a captured chain of 12 links with PDL as the decode graphs have it (the site also with its comb
// made on a branch, MhcCombBranch; the router also with its product in one launch, moe_route_decode); a
// chain of the matvecs alone is subtracted, so a line says what the kernel adds to a step. The bits are MhcDecode's and
// MoeRoute's concern.
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "gpu/mhc_decode.hpp"
#include "gpu/moe_route_decode.hpp"
#include "gpu/pdl.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/gpu/graph_timing.hpp"
#include "tests/gpu/quant_rows.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::graph_replay_us;
using ferry::testing::have_device;
using ferry::testing::random_buffer;

constexpr uint32_t kLinks = 12;

DevMatrix upload(DeviceBuffer& b, model::GgmlType type, uint32_t rows, uint32_t cols, std::mt19937& rng) {
  const std::vector<uint8_t> q = ferry::testing::random_rows(type, rows, cols, rng);
  b = DeviceBuffer(q.size());
  EXPECT_EQ(cudaMemcpy(b.get(), q.data(), q.size(), cudaMemcpyHostToDevice), cudaSuccess);
  return DevMatrix{type, b.as<uint8_t>(), rows, cols, q.size() / rows};
}

// Microseconds a replay of the graph of what `body` enqueues, captured with PDL where the device has it.
double replay_us(const std::function<void(cudaStream_t)>& body) { return graph_replay_us(body, 10, true); }

void matvec_into(const DevMatrix& w, const float* x, uint32_t rows, float* y, cudaStream_t s) {
  MatvecArgs a;
  a.w = w;
  a.x = x;
  a.x_tok_stride = w.cols;
  a.y = y;
  a.y_tok_stride = w.rows;
  a.tokens = rows;
  matvec(a, s);
}

TEST(DecodeLatencyTiming, MhcSiteAfterItsMatvec) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  constexpr uint32_t D = 4096, H = 4, kMix = (2 + H) * H;
  std::mt19937 rng(71);
  DeviceBuffer wb;
  const DevMatrix w = upload(wb, model::GgmlType::Q4_K, D, D, rng);
  for (uint32_t rows : {1u, 3u}) {
    DeviceBuffer streams = random_buffer(size_t{rows} * H * D, 1, rng), y = random_buffer(size_t{rows} * D, 1, rng),
                 post = random_buffer(size_t{rows} * H, 0.3f, rng), comb = random_buffer(size_t{rows} * H * H, 0.3f, rng),
                 base = random_buffer(kMix, 1, rng), scale = random_buffer(3, 1, rng), norm = random_buffer(D, 1, rng),
                 x = random_buffer(size_t{rows} * D, 1, rng);
    // One mixer a link, as each site has its own (1.5 MB each: not all in L2 between replays).
    std::vector<DeviceBuffer> fns;
    std::vector<DevMatrix> fm;
    for (uint32_t i = 0; i < kLinks; ++i) {
      fns.push_back(random_buffer(size_t{kMix} * H * D, 0.008f, rng));
      fm.push_back(DevMatrix{model::GgmlType::F32, fns.back().as<uint8_t>(), kMix, H * D, size_t{H} * D * 4});
    }
    bool fused = true;
    MhcCombBranch branch;
    auto chain = [&](bool sites, bool on_branch = false) {
      return [&, sites, on_branch](cudaStream_t s) {
        for (uint32_t i = 0; i < kLinks; ++i) {
          matvec_into(w, x.as<float>(), rows, y.as<float>(), s);
          if (!sites) continue;
          MhcPostPre p;
          p.pre.streams = streams.as<float>(), p.pre.base = base.as<float>(), p.pre.scale = scale.as<float>();
          p.pre.norm_w = norm.as<float>(), p.pre.rows = rows, p.pre.H = H, p.pre.D = D, p.pre.iters = 20;
          p.pre.x = x.as<float>(), p.pre.post = post.as<float>(), p.pre.comb = comb.as<float>();
          p.fn = &fm[i], p.streams = streams.as<float>(), p.y = y.as<float>();
          p.post_in = post.as<float>(), p.comb_in = comb.as<float>();
          p.branch = on_branch ? &branch : nullptr;
          fused = mhc_post_pre(p, s) && fused;
        }
        branch.join(s);
      };
    };
    const double matvecs = replay_us(chain(false)), both = replay_us(chain(true));
    const double branched = replay_us(chain(true, true));
    if (!fused) {
      std::printf("decode latency: mHC site: not fused here (no sm90 code)\n");
      return;
    }
    std::printf("decode latency: mHC site rows %u: %u x (matvec + site) %.1f us, matvecs alone %.1f us: %.2f us a site;"
                " comb on a branch %.2f us a site\n",
                rows, kLinks, both, matvecs, (both - matvecs) / kLinks, (branched - matvecs) / kLinks);
  }
}

TEST(DecodeLatencyTiming, RouterAfterItsMatvec) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  constexpr uint32_t D = 4096, E = 288, K = 8;
  std::mt19937 rng(72);
  DeviceBuffer wb;
  const DevMatrix w = upload(wb, model::GgmlType::F32, E, D, rng);
  for (uint32_t rows : {1u, 3u}) {
    DeviceBuffer x = random_buffer(size_t{rows} * D, 0.02f, rng), logits(size_t{rows} * E * 4),
                 bias = random_buffer(E, 0.01f, rng), ids(size_t{rows} * K * 4), weights(size_t{rows} * K * 4);
    RouterArgs a;
    a.logits = logits.as<float>(), a.bias = bias.as<float>(), a.rows = rows, a.E = E, a.k = K;
    a.ids = ids.as<int32_t>(), a.weights = weights.as<float>();
    DeviceBuffer done(4);
    ASSERT_EQ(cudaMemset(done.get(), 0, 4), cudaSuccess);
    bool fused = true;
    auto chain = [&](bool route) {
      return [&, route](cudaStream_t s) {
        for (uint32_t i = 0; i < kLinks; ++i) {
          matvec_into(w, x.as<float>(), rows, logits.as<float>(), s);
          if (route) moe_route(a, s);
        }
      };
    };
    auto one_launch = [&](cudaStream_t s) {
      for (uint32_t i = 0; i < kLinks; ++i) {
        fused = moe_route_decode(w, x.as<float>(), logits.as<float>(), a, done.as<uint32_t>(), s) && fused;
      }
    };
    const double matvecs = replay_us(chain(false)), both = replay_us(chain(true));
    std::printf("decode latency: router rows %u: %u x (matvec + route) %.1f us, matvecs alone %.1f us: %.2f us a route",
                rows, kLinks, both, matvecs, (both - matvecs) / kLinks);
    const double one = replay_us(one_launch);
    if (fused) {
      std::printf("; in one launch (gpu/moe_route_decode.hpp) %.1f us: %.2f us a route\n", one, (one - matvecs) / kLinks);
    } else {
      std::printf("; not in one launch (gpu/moe_route_decode.hpp: one row only)\n");
    }
  }
}

}  // namespace
}  // namespace ferry::gpu
#endif
