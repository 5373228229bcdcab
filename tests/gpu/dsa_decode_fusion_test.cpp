// DSA's per-row kernels in fewer launches (gpu/dsa_decode_fusion.hpp) against the launches they
// replace: dsa_norms against rms_norm (q_a), rms_norm (kv_a, in place) and store_latents, over f32,
// f16 and int8 latent caches; indexer_keys against layer_norm (in place) and two scatter_to_cache
// calls, with positions past the key ring's rows (wrapped); indexer_keys_and_pools against
// indexer_keys and indexer_pool_keys (the pools a step's rows complete). Every output and cache is compared bit
// for bit (the first mismatch printed); outputs and caches start poisoned (0xff bytes: NaN floats),
// and the rows written must differ from the poison.
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/dsa_decode_fusion.hpp"
#include "gpu/kernels.hpp"
#include "tests/gpu/gpu_test_support.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::have_device;

template <class V>
DeviceBuffer to_device(const std::vector<V>& v) {
  DeviceBuffer b(v.size() * sizeof(V));
  EXPECT_EQ(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(V), cudaMemcpyHostToDevice), cudaSuccess);
  return b;
}
std::vector<uint8_t> bytes_of(const DeviceBuffer& b) {
  std::vector<uint8_t> v(b.bytes());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(v.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}
DeviceBuffer poisoned(size_t bytes) {
  DeviceBuffer b(bytes);
  EXPECT_EQ(cudaMemset(b.get(), 0xff, bytes), cudaSuccess);
  return b;
}
std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.5f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// The same bytes; else the first differing 4-byte word of each.
void expect_same(const std::vector<uint8_t>& plain, const std::vector<uint8_t>& fused, const std::string& what) {
  ASSERT_EQ(plain.size(), fused.size()) << what;
  for (size_t i = 0; i < plain.size(); ++i) {
    if (plain[i] == fused[i]) continue;
    const size_t w = i / 4 * 4;
    uint32_t p = 0, f = 0;
    std::memcpy(&p, plain.data() + w, std::min<size_t>(4, plain.size() - w));
    std::memcpy(&f, fused.data() + w, std::min<size_t>(4, fused.size() - w));
    float pf = 0.0f, ff = 0.0f;
    std::memcpy(&pf, &p, 4);
    std::memcpy(&ff, &f, 4);
    ADD_FAILURE() << what << ": first difference at byte " << i << " of " << plain.size() << ": word 0x" << std::hex
                  << p << " (" << pf << ") unfused, 0x" << f << " (" << ff << ") fused";
    return;
  }
}
size_t element_bytes(config::KvType t) { return t == config::KvType::f32 ? 4 : t == config::KvType::f16 ? 2 : 1; }
// 4-byte words still all 0xff (the poison): unwritten floats.
size_t poisoned_words(const std::vector<uint8_t>& b) {
  size_t n = 0;
  for (size_t i = 0; i + 4 <= b.size(); i += 4) {
    n += b[i] == 0xff && b[i + 1] == 0xff && b[i + 2] == 0xff && b[i + 3] == 0xff;
  }
  return n;
}
// Bytes no longer 0xff (a written value may hold some 0xff bytes: a lower bound on what was written).
size_t written(const std::vector<uint8_t>& b) {
  size_t n = 0;
  for (uint8_t v : b) n += v != 0xff;
  return n;
}

// Rows of a step: slots and positions (of a 64-row context a slot), one to eight of them.
struct Rows {
  std::vector<int32_t> slot, pos, first;
  DeviceBuffer d_slot, d_pos, d_first;
  Rows(std::vector<int32_t> s, std::vector<int32_t> p) : slot(std::move(s)), pos(std::move(p)) {
    for (size_t i = 0; i < slot.size(); ++i) first.push_back(static_cast<int32_t>(i));
    d_slot = to_device(slot), d_pos = to_device(pos), d_first = to_device(first);
  }
  uint32_t n() const { return static_cast<uint32_t>(slot.size()); }
  RowInfo info() const { return {d_slot.as<int32_t>(), d_pos.as<int32_t>(), d_first.as<int32_t>()}; }
};

TEST(DsaDecodeFusion, NormsAndLatentStoreGiveTheThreeLaunchesBits) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  constexpr uint32_t kSlots = 3, kCtx = 64;
  const std::vector<Rows> steps = [] {
    std::vector<Rows> v;
    v.emplace_back(std::vector<int32_t>{1}, std::vector<int32_t>{0});
    v.emplace_back(std::vector<int32_t>{2, 0, 0}, std::vector<int32_t>{63, 7, 8});
    v.emplace_back(std::vector<int32_t>{0, 0, 0, 0, 1, 1, 2, 2}, std::vector<int32_t>{20, 21, 22, 23, 5, 6, 40, 41});
    return v;
  }();
  struct Shape {
    uint32_t qlr, kvlr;
  };
  for (const Shape sh : {Shape{1536, 512}, Shape{64, 40}, Shape{300, 33}}) {
    for (const config::KvType type : {config::KvType::f32, config::KvType::f16, config::KvType::int8}) {
      for (const Rows& r : steps) {
        const std::string what = "q_a " + std::to_string(sh.qlr) + ", kv_a " + std::to_string(sh.kvlr) + ", " +
                                 std::string(config::kv_type_name(type)) + ", " + std::to_string(r.n()) + " rows";
        std::mt19937 rng(sh.qlr * 31 + sh.kvlr + r.n());
        // Input rows wider than the norms (strides apart), as the workspace lays them out.
        const size_t qa_ld = sh.qlr + 8, lat_ld = sh.kvlr + 4;
        const std::vector<float> qa = random_floats(r.n() * qa_ld, rng), lat = random_floats(r.n() * lat_ld, rng),
                                 qw = random_floats(sh.qlr, rng), lw = random_floats(sh.kvlr, rng);
        const DeviceBuffer d_qa = to_device(qa), d_qw = to_device(qw), d_lw = to_device(lw);
        const size_t cache_bytes = size_t{kSlots} * kCtx * sh.kvlr * element_bytes(type);
        std::vector<uint8_t> qr[2], lt[2], cache[2], scales[2];
        for (int fused = 0; fused < 2; ++fused) {
          DeviceBuffer d_qr = poisoned(r.n() * sh.qlr * 4), d_lat = to_device(lat), d_cache = poisoned(cache_bytes),
                       d_scales = poisoned(size_t{kSlots} * kCtx * 4);
          if (fused == 1) {
            DsaNormsArgs a;
            a.rows = r.n();
            a.eps = 1e-5f;
            a.qa = d_qa.as<float>(), a.qa_stride = qa_ld, a.qa_w = d_qw.as<float>(), a.qlr = sh.qlr;
            a.qr = d_qr.as<float>(), a.qr_stride = sh.qlr;
            a.lat = d_lat.as<float>(), a.lat_stride = lat_ld, a.lat_w = d_lw.as<float>(), a.kvlr = sh.kvlr;
            a.row = r.info(), a.ctx = kCtx, a.type = type, a.cache = d_cache.get(), a.scales = d_scales.as<float>();
            dsa_norms(a, nullptr);
          } else {
            rms_norm(d_qa.as<float>(), qa_ld, d_qw.as<float>(), r.n(), sh.qlr, 1e-5f, d_qr.as<float>(), sh.qlr,
                     nullptr);
            rms_norm(d_lat.as<float>(), lat_ld, d_lw.as<float>(), r.n(), sh.kvlr, 1e-5f, d_lat.as<float>(), lat_ld,
                     nullptr);
            store_latents(d_lat.as<float>(), lat_ld, r.info(), r.n(), sh.kvlr, kCtx, type, d_cache.get(),
                          d_scales.as<float>(), nullptr);
          }
          qr[fused] = bytes_of(d_qr), lt[fused] = bytes_of(d_lat), cache[fused] = bytes_of(d_cache);
          scales[fused] = bytes_of(d_scales);
        }
        expect_same(qr[0], qr[1], what + ": q_a norm");
        expect_same(lt[0], lt[1], what + ": kv_a norm");
        expect_same(cache[0], cache[1], what + ": latent cache");
        expect_same(scales[0], scales[1], what + ": latent scales");
        EXPECT_EQ(poisoned_words(qr[1]), 0u) << what << ": q_a norm values left unwritten";
        EXPECT_GE(written(cache[1]), size_t{r.n()} * sh.kvlr * element_bytes(type) / 2)
            << what << ": no latent rows in the cache";
        if (type == config::KvType::int8) {
          EXPECT_GE(written(scales[1]), r.n() * 4u / 2) << what << ": no scales";
        }
      }
    }
  }
}

TEST(DsaDecodeFusion, IndexerKeysGiveTheNormAndScattersBits) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  constexpr uint32_t kSlots = 3, kKeyRows = 16;
  const Rows one({1}, {0});
  const Rows three({2, 0, 0}, {63, 15, 16});  // 63 and 16 wrap in a ring of 16
  const Rows eight({0, 0, 0, 0, 1, 1, 2, 2}, {30, 31, 32, 33, 5, 6, 14, 15});
  for (const uint32_t width : {128u, 16u, 200u}) {
    for (const Rows* r : {&one, &three, &eight}) {
      const std::string what = "width " + std::to_string(width) + ", " + std::to_string(r->n()) + " rows";
      std::mt19937 rng(width + r->n());
      const size_t ld = width + 4;
      const std::vector<float> kk = random_floats(r->n() * ld, rng), gs = random_floats(r->n() * ld, rng),
                               w = random_floats(width, rng), b = random_floats(width, rng);
      const DeviceBuffer d_gs = to_device(gs), d_w = to_device(w), d_b = to_device(b);
      const size_t ring = size_t{kSlots} * kKeyRows * width * 4;
      std::vector<uint8_t> out[2], keys[2], gates[2];
      for (int fused = 0; fused < 2; ++fused) {
        DeviceBuffer d_kk = to_device(kk), d_keys = poisoned(ring), d_gates = poisoned(ring);
        if (fused == 1) {
          IndexerKeysArgs a;
          a.rows = r->n(), a.width = width, a.eps = 1e-6f;
          a.kk = d_kk.as<float>(), a.kk_stride = ld, a.w = d_w.as<float>(), a.b = d_b.as<float>();
          a.gs = d_gs.as<float>(), a.gs_stride = ld;
          a.row = r->info(), a.key_rows = kKeyRows, a.keys = d_keys.as<float>(), a.gates = d_gates.as<float>();
          indexer_keys(a, nullptr);
        } else {
          layer_norm(d_kk.as<float>(), ld, d_w.as<float>(), d_b.as<float>(), r->n(), width, 1e-6f, d_kk.as<float>(),
                     ld, nullptr);
          scatter_to_cache(d_kk.as<float>(), ld, r->info(), r->n(), width, kKeyRows, d_keys.as<float>(), nullptr);
          scatter_to_cache(d_gs.as<float>(), ld, r->info(), r->n(), width, kKeyRows, d_gates.as<float>(), nullptr);
        }
        out[fused] = bytes_of(d_kk), keys[fused] = bytes_of(d_keys), gates[fused] = bytes_of(d_gates);
      }
      expect_same(out[0], out[1], what + ": normalised keys");
      expect_same(keys[0], keys[1], what + ": key ring");
      expect_same(gates[0], gates[1], what + ": gate ring");
      EXPECT_NE(std::memcmp(out[1].data(), kk.data(), out[1].size()), 0) << what << ": the keys were not normalised";
      // Every row at its own place of the ring (no two rows of a slot 16 positions apart).
      EXPECT_EQ(keys[1].size() / 4 - poisoned_words(keys[1]), size_t{r->n()} * width) << what << ": key rows";
      EXPECT_EQ(gates[1].size() / 4 - poisoned_words(gates[1]), size_t{r->n()} * width) << what << ": gate rows";
    }
  }
}

// Segments (slot, first position, rows) of one step, with the rows' RowInfo.
struct Segments {
  std::vector<int32_t> slot, start, len, first;
  DeviceBuffer d_slot, d_start, d_len, d_first;
  Rows rows;
  static Rows rows_of(const std::vector<std::array<int32_t, 3>>& segs) {
    std::vector<int32_t> s, p;
    for (const auto& g : segs) {
      for (int32_t i = 0; i < g[2]; ++i) s.push_back(g[0]), p.push_back(g[1] + i);
    }
    return Rows(s, p);
  }
  explicit Segments(const std::vector<std::array<int32_t, 3>>& segs) : rows(rows_of(segs)) {
    int32_t at = 0;
    for (const auto& g : segs) {
      slot.push_back(g[0]), start.push_back(g[1]), len.push_back(g[2]), first.push_back(at);
      at += g[2];
    }
    d_slot = to_device(slot), d_start = to_device(start), d_len = to_device(len), d_first = to_device(first);
  }
  uint32_t count() const { return static_cast<uint32_t>(slot.size()); }
  uint32_t longest() const { return static_cast<uint32_t>(*std::max_element(len.begin(), len.end())); }
  SegInfo info() const {
    return {d_slot.as<int32_t>(), d_start.as<int32_t>(), d_len.as<int32_t>(), d_first.as<int32_t>()};
  }
};

TEST(DsaDecodeFusion, IndexerKeysAndPoolsGiveTheThreeLaunchesBits) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  constexpr uint32_t kSlots = 3, kKeyRows = 16, kCtx = 64, kPool = 4;
  // Pools completed by a lone row, by the second of three rows, by the last of four, and none.
  const Segments step({{1, 3, 1}, {0, 14, 3}, {2, 5, 4}});
  const Segments lone({{2, 62, 1}});
  for (const uint32_t width : {128u, 16u}) {
    for (const Segments* sg : {&step, &lone}) {
      const Rows& r = sg->rows;
      const std::string what = "width " + std::to_string(width) + ", " + std::to_string(sg->count()) + " segments";
      std::mt19937 rng(width * 3 + sg->count());
      const size_t ld = width + 4;
      const std::vector<float> kk = random_floats(r.n() * ld, rng), gs = random_floats(r.n() * ld, rng),
                               w = random_floats(width, rng), b = random_floats(width, rng),
                               ape = random_floats(size_t{kPool} * width, rng),
                               ring = random_floats(size_t{kSlots} * kKeyRows * width, rng),  // earlier rows' keys
                               gring = random_floats(size_t{kSlots} * kKeyRows * width, rng);
      const DeviceBuffer d_gs = to_device(gs), d_w = to_device(w), d_b = to_device(b), d_ape = to_device(ape);
      std::vector<uint8_t> out[2], keys[2], gates[2], pools[2];
      for (int fused = 0; fused < 2; ++fused) {
        DeviceBuffer d_kk = to_device(kk), d_keys = to_device(ring), d_gates = to_device(gring),
                     d_pools = poisoned(size_t{kSlots} * (kCtx / kPool) * width * 4);
        IndexerKeysArgs k;
        k.rows = r.n(), k.width = width, k.eps = 1e-6f;
        k.kk = d_kk.as<float>(), k.kk_stride = ld, k.w = d_w.as<float>(), k.b = d_b.as<float>();
        k.gs = d_gs.as<float>(), k.gs_stride = ld;
        k.row = r.info(), k.key_rows = kKeyRows, k.keys = d_keys.as<float>(), k.gates = d_gates.as<float>();
        IndexerArgs a;
        a.row = r.info(), a.seg = sg->info(), a.rows = r.n(), a.segments = sg->count();
        a.max_rows_per_segment = sg->longest();
        a.head_dim = width, a.kpool = kPool, a.ctx = kCtx, a.key_rows = kKeyRows;
        a.kk_cache = d_keys.as<float>(), a.gate_cache = d_gates.as<float>(), a.ape = d_ape.as<float>();
        a.pool_cache = d_pools.as<float>();
        if (fused == 1) {
          indexer_keys_and_pools(k, a, nullptr);
        } else {
          indexer_keys(k, nullptr);
          indexer_pool_keys(a, nullptr);
        }
        out[fused] = bytes_of(d_kk), keys[fused] = bytes_of(d_keys), gates[fused] = bytes_of(d_gates);
        pools[fused] = bytes_of(d_pools);
      }
      expect_same(out[0], out[1], what + ": normalised keys");
      expect_same(keys[0], keys[1], what + ": key ring");
      expect_same(gates[0], gates[1], what + ": gate ring");
      expect_same(pools[0], pools[1], what + ": pool keys");
      const size_t made = sg == &step ? 3 : 0;  // pools 0 (slot 1), 3 (slot 0), 1 (slot 2); 62 completes none
      EXPECT_EQ(pools[1].size() / 4 - poisoned_words(pools[1]), made * width) << what << ": pool keys written";
    }
  }
}

}  // namespace
}  // namespace ferry::gpu
#endif
