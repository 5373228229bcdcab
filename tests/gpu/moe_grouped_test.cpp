// The grouped expert GEMMs of a prefill chunk (gpu/moe_grouped.hpp) against a double-precision CPU
// product over the CPU's dequantisation of the same blocks: for every type the device reads, chunks
// of 1 to 2,048 rows routed over experts of which some get no rows, or all to one expert; the route
// sort (offsets, gather, where), SwiGLU with the clamp, the down projection and moe_combine. Experts
// are read stacked or through per-expert tables (one of them in pinned host memory, as the host
// store's are), whose tally is checked too. Outputs are poisoned (NaN) before each run.
//
// These run the fp16 kernel (GroupedPath::fp16); tests/gpu/moe_grouped_int8_test.cpp checks the int8
// one. Tolerance: the kernels split every f32 input into fp16 hi + lo/2^12 (~22 significant bits; the
// activations by a pass before the products, into the scratch given, the weights as they are decoded) and
// accumulate in f32, so each product is within ~1e-6 of sum |w x|; 2e-5 of it leaves room for the
// tensor cores' f32 accumulation order over a few hundred columns, and fails plain fp16 inputs
// (~5e-4) or any misplaced row.
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu/cuda_check.hpp"
#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "gpu/moe_grouped.hpp"
#include "gpu/moe_grouped_int8.hpp"
#include "gpu/pdl.hpp"
#include "model/formats/quant.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/gpu/quant_rows.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::dequant;
using ferry::testing::have_device;
using ferry::testing::random_rows;
using model::GgmlType;

constexpr double kRel = 2e-5, kAbs = 1e-6;
constexpr float kLimit = 1.5f;

// One projection of E experts: blocks per expert, and their CPU dequantisation.
struct Part {
  GgmlType type = GgmlType::F32;
  uint32_t rows = 0, cols = 0;
  size_t row_bytes = 0;
  std::vector<std::vector<uint8_t>> blocks;  // [E]
  std::vector<std::vector<float>> w;         // [E] rows x cols
};

Part make_part(GgmlType type, uint32_t E, uint32_t rows, uint32_t cols, std::mt19937& rng) {
  Part p;
  p.type = type;
  p.rows = rows;
  p.cols = cols;
  p.row_bytes = *model::ggml_bytes(type, cols);
  for (uint32_t e = 0; e < E; ++e) {
    p.blocks.push_back(random_rows(type, rows, cols, rng));
    p.w.push_back(dequant(type, p.blocks.back(), size_t{rows} * cols));
  }
  return p;
}

DevMatrix shape_of(const Part& p, const uint8_t* data) {
  DevMatrix m;
  m.type = p.type;
  m.data = data;
  m.rows = p.rows;
  m.cols = p.cols;
  m.row_bytes = p.row_bytes;
  return m;
}

// The experts on the device: each part stacked (expert e at e * stride), or, with tables, each
// expert's three parts in one slot of a buffer in reverse expert order and expert 1 in pinned host
// memory, reached through a device table per part.
struct DeviceExperts {
  DeviceBuffer stacked[3], slots, tables;
  PinnedBuffer host_slot;
  ExpertMatrices m[3];
};

void upload_experts(const Part* parts, uint32_t E, bool tables, DeviceExperts& d) {
  if (!tables) {
    for (int p = 0; p < 3; ++p) {
      const size_t bytes = parts[p].blocks[0].size();
      d.stacked[p] = DeviceBuffer(bytes * E);
      for (uint32_t e = 0; e < E; ++e) {
        ASSERT_EQ(cudaMemcpy(d.stacked[p].as<uint8_t>() + e * bytes, parts[p].blocks[e].data(), bytes,
                             cudaMemcpyHostToDevice),
                  cudaSuccess);
      }
      d.m[p] = {shape_of(parts[p], d.stacked[p].as<uint8_t>()), bytes, nullptr};
    }
    return;
  }
  size_t offset[4] = {0, 0, 0, 0};
  for (int p = 0; p < 3; ++p) offset[p + 1] = offset[p] + (parts[p].blocks[0].size() + 255) / 256 * 256;
  const size_t slot = offset[3];
  d.slots = DeviceBuffer(slot * E);
  d.host_slot = PinnedBuffer(slot);
  std::vector<const uint8_t*> table(3 * size_t{E});
  for (uint32_t e = 0; e < E; ++e) {
    uint8_t* base = e == 1 ? d.host_slot.as<uint8_t>() : d.slots.as<uint8_t>() + (E - 1 - e) * slot;
    for (int p = 0; p < 3; ++p) {
      ASSERT_EQ(cudaMemcpy(base + offset[p], parts[p].blocks[e].data(), parts[p].blocks[e].size(), cudaMemcpyDefault),
                cudaSuccess);
      table[p * size_t{E} + e] = base + offset[p];
    }
  }
  d.tables = DeviceBuffer(table.size() * sizeof(uint8_t*));
  ASSERT_EQ(cudaMemcpy(d.tables.get(), table.data(), d.tables.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  for (int p = 0; p < 3; ++p) {
    d.m[p] = {shape_of(parts[p], nullptr), 0, d.tables.as<const uint8_t*>() + p * size_t{E}};
  }
}

enum class Routing { spread, one_expert };

// Routes of `n` rows, k per row, each row's experts distinct: spread over the experts but 2 and
// E - 1 (which get none), or every route to expert 3 (k = 1).
std::vector<int32_t> make_routes(Routing how, uint32_t n, uint32_t k, uint32_t E, std::mt19937& rng) {
  std::vector<int32_t> ids(size_t{n} * k);
  std::vector<int32_t> allowed;
  for (uint32_t e = 0; e < E; ++e) {
    if (e != 2 && e != E - 1) allowed.push_back(static_cast<int32_t>(e));
  }
  for (uint32_t r = 0; r < n; ++r) {
    if (how == Routing::one_expert) {
      ids[r] = 3;
      continue;
    }
    std::shuffle(allowed.begin(), allowed.end(), rng);
    for (uint32_t j = 0; j < k; ++j) ids[size_t{r} * k + j] = allowed[j];
  }
  return ids;
}

// The sort of `ids` (k a row over E experts): each expert's rows where its offsets say, tiles of 64
// rows, every route once in its expert's range, at a sorted row that gathers the route's token.
void expect_sorted(const std::vector<int32_t>& ids, uint32_t k, uint32_t E, const std::vector<uint32_t>& off,
                   const std::vector<uint32_t>& tiles, const std::vector<int32_t>& gather,
                   const std::vector<int32_t>& where) {
  const size_t routes = ids.size();
  std::vector<uint32_t> count(E, 0);
  for (int32_t id : ids) ++count[id];
  ASSERT_EQ(off[0], 0u);
  ASSERT_EQ(tiles[0], 0u);
  for (uint32_t e = 0; e < E; ++e) {
    ASSERT_EQ(off[e + 1] - off[e], count[e]) << "expert " << e;
    ASSERT_EQ(tiles[e + 1] - tiles[e], (count[e] + kGroupedTileTokens - 1) / kGroupedTileTokens) << "expert " << e;
  }
  std::vector<bool> used(routes, false);
  for (size_t i = 0; i < routes; ++i) {
    const int32_t at = where[i];
    ASSERT_GE(at, 0);
    ASSERT_LT(static_cast<size_t>(at), routes);
    ASSERT_FALSE(used[at]) << "sorted row " << at << " taken twice";
    used[at] = true;
    ASSERT_GE(static_cast<uint32_t>(at), off[ids[i]]);
    ASSERT_LT(static_cast<uint32_t>(at), off[ids[i] + 1]);
    ASSERT_EQ(gather[at], static_cast<int32_t>(i / k));
  }
}

double silu_clamped(double g, double u, double& dg, double& du) {
  const double gc = std::min(g, double(kLimit)), uc = std::min(std::max(u, -double(kLimit)), double(kLimit));
  const double s = 1.0 / (1.0 + std::exp(-gc));
  // |d out / d g| and |d out / d u| at the clamped point (an upper bound across the clamp too)
  dg = std::abs(s * (1.0 + gc * (1.0 - s)) * uc);
  du = std::abs(gc * s);
  return gc * s * uc;
}

// What int16 activations may add to W[r] . x (the int8 path; tests/gpu/matvec_test.cpp's bound): each
// x rounded by half a step of its 32-value block, times |w|.
double int16_rounding(const float* w, const float* x, size_t cols) {
  double bound = 0;
  for (size_t b = 0; b < cols; b += 32) {
    float amax = 0;
    for (size_t c = b; c < b + 32; ++c) amax = std::max(amax, std::abs(x[c]));
    for (size_t c = b; c < b + 32; ++c) bound += std::abs(double(w[c])) * amax / 32767.0 * 0.5;
  }
  return bound;
}

struct Outcome {
  std::vector<unsigned long long> tally;
};

// Runs the grouped path on `n` rows and checks every stage; rows of large chunks are sampled.
void run_and_check(const Part* parts, const DeviceExperts& d, uint32_t E, uint32_t k, uint32_t n, Routing how,
                   std::mt19937& rng, Outcome* outcome = nullptr, const std::vector<uint8_t>* category = nullptr,
                   bool odd_split = false) {
  const uint32_t D = parts[0].cols, I = parts[0].rows, routes = n * k;
  const std::vector<int32_t> ids = make_routes(how, n, k, E, rng);
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(D)));
  std::uniform_real_distribution<float> weight(0.1f, 1.0f);
  std::vector<float> x(size_t{n} * D), rw(routes);
  for (float& v : x) v = normal(rng);
  for (float& v : rw) v = weight(rng);

  DeviceBuffer dids(routes * 4), dx(x.size() * 4), drw(routes * 4), doff((E + 1) * 4), dtiles((E + 1) * 4),
      dgather(routes * 4), dwhere(routes * 4), deg(size_t{routes} * I * 4), deu(size_t{routes} * I * 4),
      deo(size_t{routes} * D * 4), dy(size_t{n} * D * 4), dtally(5 * 8), dcat(E);
  ASSERT_EQ(cudaMemcpy(dids.get(), ids.data(), routes * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dx.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(drw.get(), rw.data(), routes * 4, cudaMemcpyHostToDevice), cudaSuccess);
  for (DeviceBuffer* b : {&deg, &deu, &deo, &dy}) ASSERT_EQ(cudaMemset(b->get(), 0xff, b->bytes()), cudaSuccess);
  ASSERT_EQ(cudaMemset(dgather.get(), 0xff, dgather.bytes()), cudaSuccess);
  ASSERT_EQ(cudaMemset(dwhere.get(), 0xff, dwhere.bytes()), cudaSuccess);
  ASSERT_EQ(cudaMemset(dtally.get(), 0, dtally.bytes()), cudaSuccess);
  RouteTally tally;
  if (category != nullptr) {
    ASSERT_EQ(cudaMemcpy(dcat.get(), category->data(), E, cudaMemcpyHostToDevice), cudaSuccess);
    tally.category = dcat.as<uint8_t>();
    tally.expert_bytes = 1000;
    tally.counters = dtally.as<unsigned long long>();
  }

  // The inputs' splits in one buffer each: hi, then lo; with odd_split, lo one half past a 16-byte
  // boundary (the copies by element).
  const size_t split_elems = std::max(size_t{n} * D, size_t{routes} * I);
  DeviceBuffer dsplit((2 * split_elems + 1) * 2);
  const SplitScratch split{dsplit.get(), dsplit.as<uint16_t>() + split_elems + (odd_split ? 1 : 0), split_elems};
  ASSERT_EQ(cudaMemset(dsplit.get(), 0xff, dsplit.bytes()), cudaSuccess);

  const RouteSort sort{doff.as<uint32_t>(), dtiles.as<uint32_t>(), dgather.as<int32_t>(), dwhere.as<int32_t>()};
  sort_routes(dids.as<int32_t>(), routes, k, E, sort, tally, nullptr);
  grouped_gemm(d.m[0], &d.m[1], dx.as<float>(), D, n, sort.gather, sort, routes, E, kLimit, deg.as<float>(), I,
               deu.as<float>(), split, nullptr, GroupedPath::fp16);
  grouped_gemm(d.m[2], nullptr, deg.as<float>(), I, routes, nullptr, sort, routes, E, 0.0f, deo.as<float>(), D,
               nullptr, split, nullptr, GroupedPath::fp16);
  moe_combine(deo.as<float>(), sort.where, drw.as<float>(), nullptr, n, k, D, dy.as<float>(), nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  std::vector<uint32_t> off(E + 1), tiles(E + 1);
  std::vector<int32_t> gather(routes), where(routes);
  std::vector<float> eg(size_t{routes} * I), y(size_t{n} * D);
  ASSERT_EQ(cudaMemcpy(off.data(), doff.get(), off.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(tiles.data(), dtiles.get(), tiles.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(gather.data(), dgather.get(), routes * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(where.data(), dwhere.get(), routes * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(eg.data(), deg.get(), eg.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(y.data(), dy.get(), y.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);

  expect_sorted(ids, k, E, off, tiles, gather, where);
  if (::testing::Test::HasFatalFailure()) return;

  // SwiGLU of gate and up, per route; then y from the device's own SwiGLU output, so that each
  // projection is checked on its own.
  const uint32_t stride = n > 256 ? 13 : 1;
  const Part &pg = parts[0], &pu = parts[1], &pd = parts[2];
  for (uint32_t r = 0; r < n; r += stride) {
    for (uint32_t j = 0; j < k; ++j) {
      const uint32_t i = r * k + j, e = static_cast<uint32_t>(ids[i]);
      const float* xr = &x[size_t{r} * D];
      for (uint32_t c = 0; c < I; ++c) {
        double g = 0, u = 0, mg = 0, mu = 0;
        for (uint32_t t = 0; t < D; ++t) {
          g += double(pg.w[e][size_t{c} * D + t]) * xr[t];
          u += double(pu.w[e][size_t{c} * D + t]) * xr[t];
          mg += std::abs(double(pg.w[e][size_t{c} * D + t]) * xr[t]);
          mu += std::abs(double(pu.w[e][size_t{c} * D + t]) * xr[t]);
        }
        double dg = 0, du = 0;
        const double want = silu_clamped(g, u, dg, du);
        const double tol = dg * (kRel * mg + kAbs) + du * (kRel * mu + kAbs) + 1e-6 * std::abs(want) + kAbs;
        ASSERT_NEAR(eg[static_cast<size_t>(where[i]) * I + c], want, tol) << "row " << r << " route " << j << " expert " << e
                                                             << " column " << c << " of " << n;
      }
    }
    for (uint32_t c = 0; c < D; ++c) {
      double want = 0, mag = 0;
      for (uint32_t j = 0; j < k; ++j) {
        const uint32_t i = r * k + j, e = static_cast<uint32_t>(ids[i]);
        const float* h = &eg[static_cast<size_t>(where[i]) * I];
        double dot = 0, m = 0;
        for (uint32_t t = 0; t < I; ++t) {
          dot += double(pd.w[e][size_t{c} * I + t]) * h[t];
          m += std::abs(double(pd.w[e][size_t{c} * I + t]) * h[t]);
        }
        want += double(rw[i]) * dot;
        mag += double(rw[i]) * m;
      }
      ASSERT_NEAR(y[size_t{r} * D + c], want, kRel * mag + kAbs) << "row " << r << " column " << c << " of " << n;
    }
  }
  if (outcome != nullptr) {
    outcome->tally.assign(5, 0);
    ASSERT_EQ(cudaMemcpy(outcome->tally.data(), dtally.get(), 5 * 8, cudaMemcpyDeviceToHost), cudaSuccess);
  }
}

class GroupedExpertsTest : public ::testing::TestWithParam<GgmlType> {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
    upload_quant_tables();
  }
};

TEST_P(GroupedExpertsTest, MatchTheCpuForEveryChunkSizeAndRouting) {
  const GgmlType type = GetParam();
  std::mt19937 rng(77 + static_cast<int>(type));
  const uint32_t E = 9, k = 2, D = 256, I = 256;
  const Part parts[3] = {make_part(type, E, I, D, rng), make_part(type, E, I, D, rng), make_part(type, E, D, I, rng)};
  DeviceExperts d;
  upload_experts(parts, E, false, d);
  for (const uint32_t n : {1u, 9u, 130u, 2048u}) {
    SCOPED_TRACE(std::to_string(n) + " rows, spread");
    run_and_check(parts, d, E, k, n, Routing::spread, rng);
    if (HasFatalFailure()) return;
  }
  SCOPED_TRACE("2048 rows, all to one expert");
  run_and_check(parts, d, E, 1, 2048, Routing::one_expert, rng);
}

INSTANTIATE_TEST_SUITE_P(Types, GroupedExpertsTest,
                         ::testing::Values(GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0,
                                           GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS,
                                           GgmlType::IQ3_S),
                         [](const auto& info) { return std::string(model::ggml_type_traits(info.param).name); });

class GroupedExpertsShapes : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
    upload_quant_tables();
  }
  // One GLM MoE layer, timed on each path and checked against the CPU (below).
  void glm_layer_at_q4k(bool skewed);
};

// Matrices narrower and shorter than a tile, rows not a multiple of 8 (f32 read by element), a
// Q8_0 row that ends inside a k-tile: the fixtures' expert shapes are like these.
TEST_F(GroupedExpertsShapes, PartialTilesAndNarrowRows) {
  std::mt19937 rng(5);
  struct Case {
    GgmlType type;
    uint32_t D, I;
  };
  for (const Case c : {Case{GgmlType::F32, 64, 16}, Case{GgmlType::F32, 60, 20}, Case{GgmlType::Q8_0, 96, 160},
                       Case{GgmlType::Q4_K, 256, 80}}) {
    const GgmlType down = c.type == GgmlType::Q4_K ? GgmlType::F16 : c.type;  // Q4_K rows need 256 columns
    SCOPED_TRACE(std::string(model::ggml_type_traits(c.type).name) + " D " + std::to_string(c.D) + " I " +
                 std::to_string(c.I));
    const uint32_t E = 8, k = 3;
    const Part parts[3] = {make_part(c.type, E, c.I, c.D, rng), make_part(c.type, E, c.I, c.D, rng),
                           make_part(down, E, c.D, c.I, rng)};
    DeviceExperts d;
    upload_experts(parts, E, false, d);
    for (const uint32_t n : {5u, 203u}) {
      run_and_check(parts, d, E, k, n, Routing::spread, rng);
      if (HasFatalFailure()) return;
    }
  }
}

// Gate and up of different types (two launches and swiglu()), read through tables as the expert
// tiers give them, the inputs' low parts split to an unaligned address; the tally counts each
// class's routes and, per used staged or mapped expert, its bytes.
TEST_F(GroupedExpertsShapes, TablesMixedTypesAndTheTally) {
  std::mt19937 rng(9);
  const uint32_t E = 6, k = 2, D = 256, I = 256, n = 300;
  const Part parts[3] = {make_part(GgmlType::Q4_K, E, I, D, rng), make_part(GgmlType::Q6_K, E, I, D, rng),
                         make_part(GgmlType::Q5_K, E, D, I, rng)};
  DeviceExperts d;
  upload_experts(parts, E, true, d);
  const std::vector<uint8_t> category = {0, 2, 0, 1, 1, 2};  // experts 2 and 5 get no routes
  Outcome out;
  std::mt19937 routes_rng(11);
  run_and_check(parts, d, E, k, n, Routing::spread, routes_rng, &out, &category, true);
  if (HasFatalFailure()) return;
  std::mt19937 replay(11);
  const std::vector<int32_t> ids = make_routes(Routing::spread, n, k, E, replay);
  unsigned long long want[5] = {0, 0, 0, 0, 0};
  std::vector<bool> used(E, false);
  for (int32_t id : ids) {
    ++want[category[id]];
    used[id] = true;
  }
  for (uint32_t e = 0; e < E; ++e) {
    if (used[e] && category[e] > 0) want[2 + category[e]] += 1000;
  }
  for (int i = 0; i < 5; ++i) EXPECT_EQ(out.tally[i], want[i]) << "counter " << i;
  EXPECT_GT(want[1], 0u);
  EXPECT_GT(want[2], 0u);
}

// The 12-layer benchmark's MoE layer (glm-5.3-flash: 288 experts of 4096 x 2048, 8 a row) at Q4_K
// over a 2,048-row chunk, synthetic blocks as `ferry bench --synthetic` makes them: for the fp16
// kernel and (sm80+ code) the int8 one, checks one row's routes against the CPU and prints the time
// of each launch (median of 5, events) and the GEMM rate they reach (2 x rows x routes x columns a
// projection, counted alike for both). Not a speed assertion.
// 2,048 rows x 8 of 288 experts of 4096 x 2048 Q4_K. Uniform routes (each row 8 distinct experts at
// random: ~333 tiles of 64 rows), or skewed ones like the synthetic bench's router makes (~430 tiles:
// 283 experts used, 83 past 64 rows, the largest ~400-650): experts drawn by lognormal popularity
// (sigma 1.1), so that the timing sees the partly filled tiles a real chunk has.
void GroupedExpertsShapes::glm_layer_at_q4k(bool skewed) {
  const uint32_t E = 288, k = 8, D = 4096, I = 2048, n = 2048, routes = n * k;
  const GgmlType type = GgmlType::Q4_K;
  const size_t gu_row = *model::ggml_bytes(type, D), d_row = *model::ggml_bytes(type, I);
  const size_t gu_bytes = gu_row * I, d_bytes = d_row * D;
  DeviceBuffer w[3] = {DeviceBuffer(gu_bytes * E), DeviceBuffer(gu_bytes * E), DeviceBuffer(d_bytes * E)};
  for (int p = 0; p < 3; ++p) {
    synth_fill(type, w[p].as<uint8_t>(), size_t{E} * (p < 2 ? I : D), p < 2 ? D : I, p < 2 ? gu_row : d_row, 7,
               synthetic_tensor_id(static_cast<uint8_t>(p), 3, 0), 0.05f, nullptr);
  }
  DevMatrix gm{type, w[0].as<uint8_t>(), I, D, gu_row}, um{type, w[1].as<uint8_t>(), I, D, gu_row},
      dm{type, w[2].as<uint8_t>(), D, I, d_row};
  const ExpertMatrices gate{gm, gu_bytes, nullptr}, up{um, gu_bytes, nullptr}, down{dm, d_bytes, nullptr};
  std::mt19937 rng(3);
  std::vector<int32_t> ids(routes);
  std::vector<int32_t> all(E);
  std::iota(all.begin(), all.end(), 0);
  std::normal_distribution<double> popularity(0.0, 1.1);
  std::vector<double> weight(E);
  for (double& v : weight) v = std::exp(popularity(rng));
  std::discrete_distribution<int32_t> pick(weight.begin(), weight.end());
  for (uint32_t r = 0; r < n; ++r) {
    int32_t* row = ids.data() + size_t{r} * k;
    if (!skewed) {
      std::shuffle(all.begin(), all.end(), rng);
      std::copy(all.begin(), all.begin() + k, row);
      continue;
    }
    for (uint32_t j = 0; j < k;) {  // k distinct experts
      const int32_t e = pick(rng);
      if (std::find(row, row + j, e) == row + j) row[j++] = e;
    }
  }
  uint32_t tiles = 0;
  {
    std::vector<uint32_t> count(E, 0);
    for (int32_t id : ids) ++count[id];
    for (uint32_t c : count) tiles += (c + kGroupedTileTokens - 1) / kGroupedTileTokens;
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(size_t{n} * D), rw(routes, 0.125f);
  for (float& v : x) v = normal(rng);
  DeviceBuffer dids(routes * 4), dx(x.size() * 4), drw(routes * 4), doff((E + 1) * 4), dtiles((E + 1) * 4),
      dgather(routes * 4), dwhere(routes * 4), deg(size_t{routes} * I * 4), deo(size_t{routes} * D * 4),
      dy(size_t{n} * D * 4);
  ASSERT_EQ(cudaMemcpy(dids.get(), ids.data(), routes * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dx.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(drw.get(), rw.data(), routes * 4, cudaMemcpyHostToDevice), cudaSuccess);
  const RouteSort sort{doff.as<uint32_t>(), dtiles.as<uint32_t>(), dgather.as<int32_t>(), dwhere.as<int32_t>()};
  const size_t split_elems = std::max(size_t{n} * D, size_t{routes} * I);
  DeviceBuffer dsh(split_elems * 2), dsl(split_elems * 2);
  const SplitScratch split{dsh.get(), dsl.get(), split_elems};
  auto median = [](std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double flops_gu = 2.0 * routes * 2.0 * I * D, flops_d = 2.0 * routes * double(D) * I;
  std::vector<int32_t> where(routes);
  std::vector<uint8_t> gb(gu_bytes), ub(gu_bytes), db(64 * d_row);
  // Each path in turn: the fp16 kernel, then grouped_gemm's default (the int8 kernel where the device
  // has it: its SwiGLU rows and y then have the decode matvec's int16 numerics, checked at the bound
  // the decode int16 tests hold).
  for (const GroupedPath path : {GroupedPath::fp16, GroupedPath::best}) {
    const bool int8 = path == GroupedPath::best && grouped_int8_takes(gate, &up, dx.as<float>(), D, n, split);
    if (path == GroupedPath::best && !int8) {
      ASSERT_FALSE(sm80_code_ready()) << "sm80+ code, yet the GLM layer does not take the int8 path";
      continue;
    }
    // Rows a path leaves unwritten must not pass with the other path's values.
    for (DeviceBuffer* b : {&deg, &deo, &dy}) ASSERT_EQ(cudaMemset(b->get(), 0xff, b->bytes()), cudaSuccess);
    const char* name = int8 ? "int8 (int16 activations)" : "fp16 hi/lo";
    SCOPED_TRACE(name);
    Event ev[5];
    std::vector<float> ms[4];
    for (int rep = 0; rep < 6; ++rep) {
      ev[0].record(nullptr);
      sort_routes(dids.as<int32_t>(), routes, k, E, sort, RouteTally{}, nullptr);
      ev[1].record(nullptr);
      grouped_gemm(gate, &up, dx.as<float>(), D, n, sort.gather, sort, routes, E, kLimit, deg.as<float>(), I, nullptr,
                   split, nullptr, path);
      ev[2].record(nullptr);
      grouped_gemm(down, nullptr, deg.as<float>(), I, routes, nullptr, sort, routes, E, 0.0f, deo.as<float>(), D,
                   nullptr, split, nullptr, path);
      ev[3].record(nullptr);
      moe_combine(deo.as<float>(), sort.where, drw.as<float>(), nullptr, n, k, D, dy.as<float>(), nullptr);
      ev[4].record(nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      if (rep == 0) continue;  // warm-up
      for (int i = 0; i < 4; ++i) ms[i].push_back(ev[i + 1].since(ev[i]));
    }
    const float t_sort = median(ms[0]), t_gu = median(ms[1]), t_d = median(ms[2]), t_c = median(ms[3]);
    std::printf("grouped MoE %s, %u rows x %u of %u experts (%s routes, %u tiles), Q4_K %ux%u: sort %.3f ms, "
                "gate+up %.3f ms (%.1f TFLOPS), down %.3f ms (%.1f TFLOPS), combine %.3f ms; layer %.3f ms\n",
                name, n, k, E, skewed ? "skewed" : "uniform", tiles, D, I, t_sort, t_gu, flops_gu / t_gu * 1e-9, t_d,
                flops_d / t_d * 1e-9, t_c, t_sort + t_gu + t_d + t_c);

    // Row 0's routes against the CPU: the SwiGLU output of each, and y over its first 64 columns.
    ASSERT_EQ(cudaMemcpy(where.data(), dwhere.get(), routes * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<float> y(64);
    ASSERT_EQ(cudaMemcpy(y.data(), dy.get(), 64 * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<double> want_y(64, 0.0), mag_y(64, 0.0), round_y(64, 0.0);
    for (uint32_t j = 0; j < k; ++j) {
      const uint32_t e = static_cast<uint32_t>(ids[j]);
      ASSERT_EQ(cudaMemcpy(gb.data(), w[0].as<uint8_t>() + e * gu_bytes, gu_bytes, cudaMemcpyDeviceToHost),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy(ub.data(), w[1].as<uint8_t>() + e * gu_bytes, gu_bytes, cudaMemcpyDeviceToHost),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy(db.data(), w[2].as<uint8_t>() + e * d_bytes, db.size(), cudaMemcpyDeviceToHost),
                cudaSuccess);
      const std::vector<float> g = dequant(type, gb, size_t{I} * D), u = dequant(type, ub, size_t{I} * D),
                               dd = dequant(type, db, size_t{64} * I);
      std::vector<float> h(I);
      ASSERT_EQ(cudaMemcpy(h.data(), deg.as<float>() + static_cast<size_t>(where[j]) * I, I * 4,
                           cudaMemcpyDeviceToHost),
                cudaSuccess);
      for (uint32_t c = 0; c < I; ++c) {
        double gs = 0, us = 0, mg = 0, mu = 0;
        for (uint32_t t = 0; t < D; ++t) {
          gs += double(g[size_t{c} * D + t]) * x[t];
          us += double(u[size_t{c} * D + t]) * x[t];
          mg += std::abs(double(g[size_t{c} * D + t]) * x[t]);
          mu += std::abs(double(u[size_t{c} * D + t]) * x[t]);
        }
        const double rg = int8 ? int16_rounding(&g[size_t{c} * D], x.data(), D) : 0.0;
        const double ru = int8 ? int16_rounding(&u[size_t{c} * D], x.data(), D) : 0.0;
        double dg = 0, du = 0;
        const double want = silu_clamped(gs, us, dg, du);
        ASSERT_NEAR(h[c], want,
                    dg * (kRel * mg + kAbs + rg) + du * (kRel * mu + kAbs + ru) + 1e-6 * std::abs(want) + kAbs)
            << "route " << j << " expert " << e << " column " << c;
      }
      for (uint32_t c = 0; c < 64; ++c) {
        for (uint32_t t = 0; t < I; ++t) {
          want_y[c] += double(rw[j]) * dd[size_t{c} * I + t] * h[t];
          mag_y[c] += std::abs(double(rw[j]) * dd[size_t{c} * I + t] * h[t]);
        }
        if (int8) round_y[c] += double(rw[j]) * int16_rounding(&dd[size_t{c} * I], h.data(), I);
      }
    }
    for (uint32_t c = 0; c < 64; ++c) {
      ASSERT_NEAR(y[c], want_y[c], kRel * mag_y[c] + kAbs + round_y[c]) << "column " << c;
    }
  }
}

TEST_F(GroupedExpertsShapes, GlmLayerAtQ4KMatchesTheCpuAndReportsItsTime) { glm_layer_at_q4k(false); }

TEST_F(GroupedExpertsShapes, GlmLayerAtQ4KWithSkewedRoutesMatchesTheCpuAndReportsItsTime) { glm_layer_at_q4k(true); }

// The sort alone past one pass of its block (16 ids a thread: 16,384 routes) and at its most experts
// (one a thread), with the tally: each expert's rows where its offsets say, every route once.
TEST_F(GroupedExpertsShapes, SortCoversRoutesPastOnePassAndTheMostExperts) {
  std::mt19937 rng(11);
  for (const uint32_t E : {288u, kMaxGroupedExperts}) {
    const uint32_t n = 2500, k = 8, routes = n * k;
    SCOPED_TRACE("experts " + std::to_string(E));
    const std::vector<int32_t> ids = make_routes(Routing::spread, n, k, E, rng);
    std::vector<uint8_t> category(E);
    for (uint32_t e = 0; e < E; ++e) category[e] = static_cast<uint8_t>(e % 3);
    DeviceBuffer dids(routes * 4), doff((E + 1) * 4), dtiles((E + 1) * 4), dgather(routes * 4), dwhere(routes * 4),
        dtally(5 * 8), dcat(E);
    ASSERT_EQ(cudaMemcpy(dids.get(), ids.data(), routes * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dcat.get(), category.data(), E, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemset(dtally.get(), 0, dtally.bytes()), cudaSuccess);
    const RouteSort sort{doff.as<uint32_t>(), dtiles.as<uint32_t>(), dgather.as<int32_t>(), dwhere.as<int32_t>()};
    const RouteTally tally{dcat.as<uint8_t>(), 1000, dtally.as<unsigned long long>()};
    sort_routes(dids.as<int32_t>(), routes, k, E, sort, tally, nullptr);
    std::vector<uint32_t> off(E + 1), tiles(E + 1);
    std::vector<int32_t> gather(routes), where(routes);
    std::vector<unsigned long long> counters(5);
    ASSERT_EQ(cudaMemcpy(off.data(), doff.get(), off.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(tiles.data(), dtiles.get(), tiles.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(gather.data(), dgather.get(), routes * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(where.data(), dwhere.get(), routes * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(counters.data(), dtally.get(), 5 * 8, cudaMemcpyDeviceToHost), cudaSuccess);
    expect_sorted(ids, k, E, off, tiles, gather, where);
    if (HasFatalFailure()) return;
    std::vector<uint32_t> count(E, 0);
    for (int32_t id : ids) ++count[id];
    std::vector<unsigned long long> want(5, 0);
    for (uint32_t e = 0; e < E; ++e) {
      if (count[e] == 0) continue;
      want[category[e]] += count[e];
      if (category[e] > 0) want[2 + category[e]] += 1000;
    }
    EXPECT_EQ(counters, want);
  }
}

TEST_F(GroupedExpertsShapes, TooManyExpertsIsRefused) {
  RouteSort sort;
  EXPECT_THROW(sort_routes(nullptr, 1, 1, kMaxGroupedExperts + 1, sort, RouteTally{}, nullptr), CudaError);
}

// A split scratch smaller than the input, none, or an input of fewer rows than routes (no gather)
// is refused before anything runs (no device needed), with the sizes named.
TEST(GroupedExpertsArgs, TooSmallASplitScratchIsRefused) {
  DevMatrix m{GgmlType::F32, reinterpret_cast<const uint8_t*>(16), 8, 64, 64 * 4};
  const ExpertMatrices w{m, 8 * 64 * 4, nullptr};
  const RouteSort sort;
  int dummy[2];
  const SplitScratch small{&dummy[0], &dummy[1], 10 * 64 - 1};
  try {
    grouped_gemm(w, nullptr, reinterpret_cast<const float*>(16), 64, 10, nullptr, sort, 10, 1, 0.0f, nullptr, 8,
                 nullptr, small, nullptr);
    FAIL() << "a scratch of 639 halves for 640 taken";
  } catch (const CudaError& e) {
    EXPECT_NE(std::string(e.what()).find("needs 640 halves"), std::string::npos) << e.what();
  }
  EXPECT_THROW(grouped_gemm(w, nullptr, reinterpret_cast<const float*>(16), 64, 10, nullptr, sort, 10, 1, 0.0f,
                            nullptr, 8, nullptr, SplitScratch{}, nullptr),
               CudaError);
  const SplitScratch enough{&dummy[0], &dummy[1], 10 * 64};
  EXPECT_THROW(grouped_gemm(w, nullptr, reinterpret_cast<const float*>(16), 64, 9, nullptr, sort, 10, 1, 0.0f,
                            nullptr, 8, nullptr, enough, nullptr),
               CudaError);
}

}  // namespace
}  // namespace ferry::gpu
#endif
