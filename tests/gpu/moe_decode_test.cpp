// The decode step's routed experts with shared experts read once (gpu/moe_decode.hpp) against the
// per-route path: share_routes marks every route single or in one group of its expert (as few
// groups as the token cap allows); each route's output and the combined rows are the per-route
// path's bits, with rows sharing some experts, all of them or none, more rows of one expert than a
// group takes, and the experts read by offset or through tables that point into device memory (pool
// hits) and mapped host memory (misses). One row: the shared expert inside the routed experts'
// launches gives the bits of its launches apart, also at the model's shape. Outputs are poisoned
// (NaN) before each run.
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/decode_fusion.hpp"
#include "gpu/kernels.hpp"
#include "gpu/matvec_mma.hpp"
#include "gpu/moe_decode.hpp"
#include "model/formats/quant.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/gpu/quant_rows.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::have_device;
using ferry::testing::random_rows;
using model::GgmlType;

template <class V>
DeviceBuffer to_device(const std::vector<V>& v) {
  DeviceBuffer b(std::max<size_t>(v.size() * sizeof(V), 16));
  EXPECT_EQ(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(V), cudaMemcpyHostToDevice), cudaSuccess);
  return b;
}
DeviceBuffer poisoned(size_t floats) {
  DeviceBuffer b(floats * 4);
  EXPECT_EQ(cudaMemset(b.get(), 0xff, floats * 4), cudaSuccess);
  return b;
}
template <class V>
std::vector<V> to_host(const DeviceBuffer& b, size_t n) {
  std::vector<V> v(n);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(v.data(), b.get(), n * sizeof(V), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// Mapped host memory (the host expert store's kind): the kernels read it over the bus.
class MappedHost {
 public:
  explicit MappedHost(const std::vector<uint8_t>& bytes) {
    EXPECT_EQ(cudaHostAlloc(&host_, bytes.size(), cudaHostAllocMapped), cudaSuccess);
    std::memcpy(host_, bytes.data(), bytes.size());
    EXPECT_EQ(cudaHostGetDevicePointer(&device_, host_, 0), cudaSuccess);
  }
  ~MappedHost() { cudaFreeHost(host_); }
  MappedHost(const MappedHost&) = delete;
  MappedHost& operator=(const MappedHost&) = delete;
  const uint8_t* device() const { return static_cast<const uint8_t*>(device_); }

 private:
  void* host_ = nullptr;
  void* device_ = nullptr;
};

// E experts' gate, up (rows I x cols D) and down (D x I) of one type, on the device and as mapped
// host copies.
struct Experts {
  std::vector<uint8_t> bytes[3];
  std::vector<DeviceBuffer> dev;
  std::vector<std::unique_ptr<MappedHost>> host;
  DevMatrix m[3];
  Experts(GgmlType type, uint32_t E, uint32_t D, uint32_t I, std::mt19937& rng) {
    const uint32_t rows[3] = {I, I, D}, cols[3] = {D, D, I};
    for (int p = 0; p < 3; ++p) {
      bytes[p] = random_rows(type, size_t{E} * rows[p], cols[p], rng);
      dev.push_back(to_device(bytes[p]));
      host.push_back(std::make_unique<MappedHost>(bytes[p]));
      m[p].type = type;
      m[p].data = dev.back().as<uint8_t>();
      m[p].rows = rows[p];
      m[p].cols = cols[p];
      m[p].row_bytes = *model::ggml_bytes(type, cols[p]);
    }
  }
  // Per part a table of E pointers: the experts `hit` picks in device memory, the others mapped.
  std::vector<const uint8_t*> table(int p, const std::vector<bool>& hit) const {
    std::vector<const uint8_t*> t(hit.size());
    for (size_t e = 0; e < hit.size(); ++e) {
      t[e] = (hit[e] ? m[p].data : host[p]->device()) + e * m[p].bytes();
    }
    return t;
  }
};

std::vector<float> normal(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Routes of `rows` rows, k distinct experts each, out of E: "none" (no expert shared, where E
// allows), "all" (every row the same k), "some" (random).
std::vector<int32_t> routes(const std::string& kind, uint32_t rows, uint32_t k, uint32_t E, std::mt19937& rng) {
  std::vector<int32_t> ids(size_t{rows} * k);
  std::vector<int32_t> all(E);
  for (uint32_t e = 0; e < E; ++e) all[e] = static_cast<int32_t>(e);
  std::shuffle(all.begin(), all.end(), rng);
  for (uint32_t r = 0; r < rows; ++r) {
    std::vector<int32_t> pick = all;
    if (kind == "some") std::shuffle(pick.begin(), pick.end(), rng);
    for (uint32_t j = 0; j < k; ++j) {
      ids[r * k + j] = kind == "none" ? all[(r * k + j) % E] : pick[j];
    }
  }
  return ids;
}

class MoeDecodeTest : public ::testing::TestWithParam<GgmlType> {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
    upload_quant_tables();
  }
};

// share_routes against the routes: a route is single exactly when no other route chose its expert;
// every other route in exactly one group of its expert, from its row, into its own row; an expert's
// routes in ceil(routes / tokens) groups.
TEST(MoeDecodeShares, SingleOrInOneGroupOfItsExpert) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(14);
  for (const char* kind : {"none", "all", "some"}) {
    for (uint32_t rows : {2u, 3u, 5u, 8u}) {
      for (uint32_t tokens : {2u, 4u}) {
        const uint32_t k = 8, E = kind == std::string("none") ? 64 : 40, n = rows * k;
        const std::vector<int32_t> ids = routes(kind, rows, k, E, rng);
        DeviceBuffer dids = to_device(ids), scratch(shared_route_ints(n, tokens) * 4);
        EXPECT_EQ(cudaMemset(scratch.get(), 0x7f, scratch.bytes()), cudaSuccess);
        share_routes(dids.as<int32_t>(), rows, k, tokens, scratch.as<int32_t>(), nullptr);
        auto s = to_host<int32_t>(scratch, shared_route_ints(n, tokens));
        const SharedRoutes r = shared_routes(s.data(), n, tokens);
        const std::string at = std::string(kind) + " rows " + std::to_string(rows) + " tokens " + std::to_string(tokens);
        std::map<int32_t, uint32_t> per_expert, groups_of;
        for (int32_t e : ids) ++per_expert[e];
        uint32_t want_groups = 0;
        for (const auto& [e, c] : per_expert) want_groups += c >= 2 ? (c + tokens - 1) / tokens : 0;
        ASSERT_EQ(*r.count, static_cast<int32_t>(want_groups)) << at;
        std::vector<int> seen(n, 0);
        for (uint32_t i = 0; i < n; ++i) {
          ASSERT_EQ(r.single[i], per_expert[ids[i]] == 1 ? ids[i] : -1) << at << ": route " << i;
          if (r.single[i] >= 0) ++seen[i];
        }
        for (int32_t g = 0; g < *r.count; ++g) {
          ASSERT_GE(r.tokens[g], 1) << at;
          ASSERT_LE(r.tokens[g], static_cast<int32_t>(tokens)) << at;
          ++groups_of[r.expert[g]];
          for (int32_t t = 0; t < r.tokens[g]; ++t) {
            const int32_t route = r.tok_y[g * tokens + t];
            ASSERT_GE(route, 0) << at;
            ASSERT_LT(route, static_cast<int32_t>(n)) << at;
            ++seen[route];
            ASSERT_EQ(ids[route], r.expert[g]) << at << ": route " << route;
            ASSERT_EQ(r.tok_x[g * tokens + t], route / static_cast<int32_t>(k)) << at << ": route " << route;
          }
        }
        for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], 1) << at << ": route " << i;
        for (const auto& [e, c] : per_expert) {
          if (c < 2) continue;
          ASSERT_EQ(groups_of[e], (c + tokens - 1) / tokens) << at << ": expert " << e;
        }
      }
    }
  }
}

// The tokens a group takes at the GLM shape (D 4096, I 2048, Q4_K): 2 for 2 rows, else the 4 that the
// gate's shared memory holds at 4096 columns; none for one row or for weights int16 does not read.
TEST(MoeDecodeShares, TokensAGroupTakes) {
  DecodeExperts a;
  for (DevMatrix* m : {&a.gate, &a.up}) *m = {GgmlType::Q4_K, nullptr, 2048, 4096, *model::ggml_bytes(GgmlType::Q4_K, 4096)};
  a.down = {GgmlType::Q4_K, nullptr, 4096, 2048, *model::ggml_bytes(GgmlType::Q4_K, 2048)};
  a.k = 8;
  const uint32_t want[9] = {0, 0, 2, 4, 4, 4, 4, 4, 4};
  for (uint32_t rows = 0; rows <= 8; ++rows) {
    a.rows = rows;
    EXPECT_EQ(shared_expert_tokens(a), want[rows]) << rows << " rows";
  }
  a.rows = 2;
  a.down.type = GgmlType::Q8_0;
  a.down.row_bytes = *model::ggml_bytes(GgmlType::Q8_0, 2048);
  EXPECT_EQ(shared_expert_tokens(a), 0u);
}

TEST_P(MoeDecodeTest, SharedGivesThePerRouteBits) {
  const GgmlType type = GetParam();
  std::mt19937 rng(1400 + static_cast<int>(type));
  const uint32_t E = 12, D = 512, I = 256, k = 3;
  const Experts ex(type, E, D, I, rng);
  std::vector<bool> hit(E);
  for (uint32_t e = 0; e < E; ++e) hit[e] = e % 3 != 1;  // a third of them misses
  DeviceBuffer tables[3];
  for (int p = 0; p < 3; ++p) tables[p] = to_device(ex.table(p, hit));
  for (bool through_tables : {false, true}) {
    for (const char* kind : {"none", "all", "some"}) {
      for (uint32_t rows : {2u, 3u, 4u, 8u}) {
        const uint32_t n = rows * k;
        const std::vector<int32_t> ids = routes(kind, rows, k, E, rng);
        const auto x = normal(size_t{rows} * D, rng);
        const auto weights = normal(n, rng), shared = normal(size_t{rows} * D, rng);
        DeviceBuffer dids = to_device(ids), dx = to_device(x), dw = to_device(weights), dsh = to_device(shared);
        DecodeExperts a;
        a.gate = ex.m[0].slice_rows(0, I);
        a.up = ex.m[1].slice_rows(0, I);
        a.down = ex.m[2].slice_rows(0, D);
        if (through_tables) {
          for (int p = 0; p < 3; ++p) a.tables[p] = reinterpret_cast<const uint8_t* const*>(tables[p].get());
        }
        a.ids = dids.as<int32_t>();
        a.x = dx.as<float>();
        a.rows = rows;
        a.k = k;
        a.swiglu_limit = 1.5f;
        const uint32_t fit = shared_expert_tokens(a);
        ASSERT_EQ(fit, rows == 2 ? 2u : 4u);
        DeviceBuffer eg = poisoned(size_t{n} * I), eu = poisoned(size_t{n} * I), eo = poisoned(size_t{n} * D);
        a.eg = eg.as<float>(), a.eu = eu.as<float>(), a.eo = eo.as<float>();
        decode_experts_per_route(a, nullptr);
        DeviceBuffer y_route = poisoned(size_t{rows} * D);
        moe_combine(a.eo, nullptr, dw.as<float>(), dsh.as<float>(), rows, k, D, y_route.as<float>(), nullptr);
        const auto per_route = to_host<float>(eo, size_t{n} * D);
        const auto y_want = to_host<float>(y_route, size_t{rows} * D);
        // The fitted token count, and 2 a group (an expert of more rows splits).
        for (uint32_t tokens : {fit, 2u}) {
          if (tokens == 2 && fit == 2) continue;
          const std::string at = std::string(kind) + " rows " + std::to_string(rows) + " tokens " +
                                 std::to_string(tokens) + (through_tables ? " through tables" : " by offset");
          DeviceBuffer g_eg = poisoned(size_t{n} * I), g_eu = poisoned(size_t{n} * I), g_eo = poisoned(size_t{n} * D);
          DeviceBuffer scratch(shared_route_ints(n, tokens) * 4), y = poisoned(size_t{rows} * D);
          DecodeExperts b = a;
          b.eg = g_eg.as<float>(), b.eu = g_eu.as<float>(), b.eo = g_eo.as<float>();
          decode_experts_shared(b, tokens, scratch.as<int32_t>(), nullptr);
          moe_combine(b.eo, nullptr, dw.as<float>(), dsh.as<float>(), rows, k, D, y.as<float>(), nullptr);
          const auto shared_eo = to_host<float>(g_eo, size_t{n} * D);
          const auto y_got = to_host<float>(y, size_t{rows} * D);
          for (size_t i = 0; i < shared_eo.size(); ++i) {
            ASSERT_FALSE(std::isnan(per_route[i])) << at << ": route " << i / D << " not written";
            ASSERT_EQ(std::memcmp(&shared_eo[i], &per_route[i], 4), 0)
                << at << ": route " << i / D << " (expert " << ids[i / D] << ") column " << i % D << ": "
                << shared_eo[i] << " vs " << per_route[i];
          }
          for (size_t i = 0; i < y_want.size(); ++i) ASSERT_EQ(y_got[i], y_want[i]) << at << ": combined " << i;
        }
      }
    }
  }
}

// One row, the shared expert (of type `shared`) as further parts of the routed experts' (of type
// `type`) gate/up and down launches, where shared_expert_fused holds (`fused`): the routes' outputs
// and the shared expert's are the bits of the launches apart (the shared expert as
// LayerRunner::dense_ffn runs it: gate and up as one launch, then down over their SwiGLU), experts by
// offset and through tables. Not fused for two rows or a shared down of a format the kernel does not
// mix.
void one_row_takes_the_shared_expert(GgmlType type, GgmlType shared, bool fused) {
  std::mt19937 rng(1500 + static_cast<int>(type) + 100 * static_cast<int>(shared));
  const uint32_t E = 12, D = 512, I = 256, k = 3;
  const Experts ex(type, E, D, I, rng), sx(shared, 1, D, I, rng);
  std::vector<bool> hit(E);
  for (uint32_t e = 0; e < E; ++e) hit[e] = e % 3 != 1;
  DeviceBuffer tables[3];
  for (int p = 0; p < 3; ++p) tables[p] = to_device(ex.table(p, hit));
  for (bool through_tables : {false, true}) {
    const std::string at = std::string(model::ggml_type_traits(type).name) + " with a shared " +
                           std::string(model::ggml_type_traits(shared).name) +
                           (through_tables ? " through tables" : " by offset");
    const std::vector<int32_t> ids = routes("some", 1, k, E, rng);
    const auto x = normal(D, rng);
    DeviceBuffer dids = to_device(ids), dx = to_device(x);
    DecodeExperts a;
    a.gate = ex.m[0].slice_rows(0, I);
    a.up = ex.m[1].slice_rows(0, I);
    a.down = ex.m[2].slice_rows(0, D);
    if (through_tables) {
      for (int p = 0; p < 3; ++p) a.tables[p] = reinterpret_cast<const uint8_t* const*>(tables[p].get());
    }
    a.ids = dids.as<int32_t>();
    a.x = dx.as<float>();
    a.rows = 1;
    a.k = k;
    a.swiglu_limit = 1.5f;
    const size_t scratch = size_t{k + 1} * I;
    DeviceBuffer eg = poisoned(scratch), eu = poisoned(scratch), eo = poisoned(size_t{k} * D), sh = poisoned(D);
    a.eg = eg.as<float>(), a.eu = eu.as<float>(), a.eo = eo.as<float>();
    ASSERT_FALSE(shared_expert_fused(a)) << at << ": no shared expert given";
    decode_experts_per_route(a, nullptr);
    float* const sg = a.eg + size_t{k} * I;
    float* const su = a.eu + size_t{k} * I;
    const MatvecProduct gate_up[] = {{&sx.m[0], sg}, {&sx.m[1], su}};
    ASSERT_TRUE(matvec_products(gate_up, 2, a.x, D, 1, I, nullptr)) << at;
    MatvecArgs d;
    d.w = sx.m[2];
    d.x_tok_stride = I;
    d.y = sh.as<float>();
    d.y_tok_stride = D;
    matvec_swiglu(d, sg, su, I, 1, I, a.swiglu_limit, nullptr);
    const auto want_eo = to_host<float>(eo, size_t{k} * D), want_sh = to_host<float>(sh, D);

    DeviceBuffer f_eg = poisoned(scratch), f_eu = poisoned(scratch), f_eo = poisoned(size_t{k} * D), f_sh = poisoned(D);
    DecodeExperts b = a;
    b.eg = f_eg.as<float>(), b.eu = f_eu.as<float>(), b.eo = f_eo.as<float>();
    b.shared_gate = sx.m[0], b.shared_up = sx.m[1], b.shared_down = sx.m[2];
    b.sg = b.eg + size_t{k} * I, b.su = b.eu + size_t{k} * I, b.sh = f_sh.as<float>();
    ASSERT_EQ(shared_expert_fused(b), fused) << at;
    if (!fused) return;
    decode_experts_per_route(b, nullptr);
    const auto got_eo = to_host<float>(f_eo, size_t{k} * D), got_sh = to_host<float>(f_sh, D);
    for (size_t i = 0; i < want_eo.size(); ++i) {
      ASSERT_FALSE(std::isnan(want_eo[i])) << at << ": route " << i / D << " not written";
      ASSERT_EQ(std::memcmp(&got_eo[i], &want_eo[i], 4), 0)
          << at << ": route " << i / D << " column " << i % D << ": " << got_eo[i] << " vs " << want_eo[i];
    }
    for (size_t i = 0; i < want_sh.size(); ++i) {
      ASSERT_FALSE(std::isnan(want_sh[i])) << at << ": shared expert row " << i << " not written";
      ASSERT_EQ(std::memcmp(&got_sh[i], &want_sh[i], 4), 0)
          << at << ": shared expert row " << i << ": " << got_sh[i] << " vs " << want_sh[i];
    }

    DecodeExperts two = b;
    two.rows = 2;
    EXPECT_FALSE(shared_expert_fused(two)) << at << ": two rows";
    DecodeExperts other = b;
    other.shared_down.type = GgmlType::F32;
    other.shared_down.row_bytes = size_t{I} * 4;
    EXPECT_FALSE(shared_expert_fused(other)) << at << ": a shared down of another row format";
  }
}

TEST_P(MoeDecodeTest, OneRowTakesTheSharedExpertInItsLaunches) { one_row_takes_the_shared_expert(GetParam(), GetParam(), true); }

// A shared expert of another type than the routed experts' (IQ3_S routes, a Q5_K shared expert): in
// their launches where the dp2a kernel reads both types, apart where one of them is a type of the
// tensor-core kernel (Q4_K; Q5_K where that kernel is built).
TEST(MoeDecodeMixedTypes, OneRowTakesASharedExpertOfAnotherType) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  upload_quant_tables();
  const bool q5k_mixed = !matvec_mma_takes(GgmlType::Q5_K);
  const struct {
    GgmlType routed, shared;
    bool fused;
  } cases[] = {{GgmlType::IQ3_S, GgmlType::Q5_K, q5k_mixed}, {GgmlType::Q5_K, GgmlType::IQ3_S, q5k_mixed},
               {GgmlType::IQ4_XS, GgmlType::Q6_K, true},  {GgmlType::Q6_K, GgmlType::IQ4_XS, true},
               {GgmlType::IQ3_S, GgmlType::IQ4_XS, true}, {GgmlType::Q4_K, GgmlType::Q5_K, false},
               {GgmlType::Q5_K, GgmlType::Q4_K, false}};
  for (const auto& c : cases) one_row_takes_the_shared_expert(c.routed, c.shared, c.fused);
}

// One row at the 12-layer shape (D 4,096, I 2,048, 8 routed experts of 16 and the shared one; gate /
// up of type `gu`, down `dn`, the shared expert `sx`): the fused launches (on the tensor-core kernel
// the gate/up walked flat and the down shared out by steps, gpu/matvec_mma.cu) give the bits of the
// per-route launches and the shared expert's apart (3-D grids).
void one_row_fused_at_the_model_shape(GgmlType gu, GgmlType dn, GgmlType sx) {
  constexpr uint32_t D = 4096, I = 2048, E = 16, k = 8;
  const DeviceBuffer gate = to_device(ferry::testing::random_blocks(gu, size_t{E} * I, D)),
                     up = to_device(ferry::testing::random_blocks(gu, size_t{E} * I, D)),
                     down = to_device(ferry::testing::random_blocks(dn, size_t{E} * D, I)),
                     sgate = to_device(ferry::testing::random_blocks(sx, I, D)),
                     sup = to_device(ferry::testing::random_blocks(sx, I, D)),
                     sdown = to_device(ferry::testing::random_blocks(sx, D, I));
  auto matrix = [](GgmlType type, const DeviceBuffer& b, uint32_t rows, uint32_t cols) {
    return DevMatrix{type, b.as<uint8_t>(), rows, cols, *model::ggml_bytes(type, cols)};
  };
  std::mt19937 rng(61);
  const std::vector<int32_t> ids = routes("some", 1, k, E, rng);
  const auto x = normal(D, rng);
  DeviceBuffer dids = to_device(ids), dx = to_device(x);
  DecodeExperts a;
  a.gate = matrix(gu, gate, I, D), a.up = matrix(gu, up, I, D), a.down = matrix(dn, down, D, I);
  a.ids = dids.as<int32_t>(), a.x = dx.as<float>(), a.rows = 1, a.k = k, a.swiglu_limit = 7.0f;
  const DevMatrix sg = matrix(sx, sgate, I, D), su = matrix(sx, sup, I, D), sd = matrix(sx, sdown, D, I);
  const std::string at = std::string(model::ggml_type_traits(gu).name) + " / " +
                         std::string(model::ggml_type_traits(dn).name) + ", shared " +
                         std::string(model::ggml_type_traits(sx).name);
  const size_t scratch = size_t{k + 1} * I;
  DeviceBuffer eg = poisoned(scratch), eu = poisoned(scratch), eo = poisoned(size_t{k} * D), sh = poisoned(D);
  a.eg = eg.as<float>(), a.eu = eu.as<float>(), a.eo = eo.as<float>();
  decode_experts_per_route(a, nullptr);
  const MatvecProduct gate_up[] = {{&sg, a.eg + size_t{k} * I}, {&su, a.eu + size_t{k} * I}};
  ASSERT_TRUE(matvec_products(gate_up, 2, a.x, D, 1, I, nullptr));
  MatvecArgs d;
  d.w = sd, d.x_tok_stride = I, d.y = sh.as<float>(), d.y_tok_stride = D;
  matvec_swiglu(d, a.eg + size_t{k} * I, a.eu + size_t{k} * I, I, 1, I, a.swiglu_limit, nullptr);
  const auto want_eo = to_host<float>(eo, size_t{k} * D), want_sh = to_host<float>(sh, D);

  DeviceBuffer f_eg = poisoned(scratch), f_eu = poisoned(scratch), f_eo = poisoned(size_t{k} * D), f_sh = poisoned(D);
  DecodeExperts b = a;
  b.eg = f_eg.as<float>(), b.eu = f_eu.as<float>(), b.eo = f_eo.as<float>();
  b.shared_gate = sg, b.shared_up = su, b.shared_down = sd;
  b.sg = b.eg + size_t{k} * I, b.su = b.eu + size_t{k} * I, b.sh = f_sh.as<float>();
  ASSERT_TRUE(shared_expert_fused(b)) << at;
  decode_experts_per_route(b, nullptr);
  const auto got_eo = to_host<float>(f_eo, size_t{k} * D), got_sh = to_host<float>(f_sh, D);
  for (size_t i = 0; i < want_eo.size(); ++i) {
    ASSERT_FALSE(std::isnan(want_eo[i])) << at << ": route " << i / D << " not written";
    ASSERT_EQ(std::memcmp(&got_eo[i], &want_eo[i], 4), 0)
        << at << ": route " << i / D << " row " << i % D << ": " << got_eo[i] << " vs " << want_eo[i];
  }
  for (size_t i = 0; i < want_sh.size(); ++i) {
    ASSERT_FALSE(std::isnan(want_sh[i])) << at << ": shared expert row " << i << " not written";
    ASSERT_EQ(std::memcmp(&got_sh[i], &want_sh[i], 4), 0) << at << ": shared expert row " << i << ": " << got_sh[i] << " vs "
                                                          << want_sh[i];
  }
}

TEST(MoeDecodeModelShape, OneRowFusedGivesTheLaunchesApartBits) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  one_row_fused_at_the_model_shape(GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q4_K);
}

// The user's mix (maya-l.recipe): IQ3_S gate and up (the dp2a kernel), Q5_K down and shared expert
// (the tensor-core kernel where it is built: the shared gate and up then a launch of their own).
TEST(MoeDecodeModelShape, OneRowFusedOfTheUsersMixGivesTheLaunchesApartBits) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  upload_quant_tables();
  one_row_fused_at_the_model_shape(GgmlType::IQ3_S, GgmlType::Q5_K, GgmlType::Q5_K);
}

INSTANTIATE_TEST_SUITE_P(Types, MoeDecodeTest,
                         ::testing::Values(GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS,
                                           GgmlType::IQ3_S),
                         [](const auto& info) { return std::string(model::ggml_type_traits(info.param).name); });

}  // namespace
}  // namespace ferry::gpu
#endif
