// The int8 tensor-core path of the grouped expert GEMMs for Q4_K, Q5_K and IQ3_S
// (gpu/moe_grouped_int8.hpp), checked twice for every sorted row:
// - against the decode int16 matvec (gpu/matvec_int16.cu; Q4_K on gpu/matvec_mma.cu) of the same expert on the same input row
//   (gate and up, whose SwiGLU is taken here; down on the device's own SwiGLU output): the same
//   int16 activations and the same integer sums, only the f32 order of the scale and minimum terms
//   differs, so within 1e-5 of the row's largest |product| (a wrong step, byte or sub-block factor is
//   off by far more: the int16 rounding alone is ~1e-5 of each term);
// - against a double-precision CPU product over the CPU's dequantisation, at the bound the decode
//   int16 tests hold (1e-5 of sum |w x|, plus each x's rounding to half a step of its block).
// Chunks of 1 to 2,048 rows, routes spread (two experts get none) or all to one expert, weights
// stacked or through tables (one expert in pinned host memory, odd experts 4 bytes off a 16-byte
// boundary: the 4-byte copies), row counts off the tiles' multiples; grouped_gemm's default path
// gives the same bits on such a device. Outputs are poisoned (NaN) first.
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

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

constexpr GgmlType kTypes[] = {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::IQ3_S};
constexpr double kTight = 1e-5;
constexpr float kLimit = 1.5f;

struct Case {
  uint32_t E, k, D, I, n;
  bool one_expert = false;  // every route to expert 3 (k 1)
  bool tables = false;
  bool down = true;  // I a multiple of 256
  bool up = true;    // false: the first projection alone (its products, no SwiGLU)
  GgmlType type = GgmlType::Q4_K;
  bool wide = false;  // inputs of 1e-16 to 1e16 a row, some zero, blocks 2^-20 of their row; d 0 in some blocks
};

// Expert e's matrix of part p (gate, up, down) as blocks and as the CPU's values.
struct Experts {
  std::vector<std::vector<uint8_t>> blocks[3];
  std::vector<std::vector<float>> w[3];
  DeviceBuffer stacked[3], slots, tables;
  PinnedBuffer host_slot;
  std::vector<const uint8_t*> where[3];  // [p][e] its stacked (16-byte aligned) copy: the decode reference's
  ExpertMatrices m[3];
};

DevMatrix shape(GgmlType type, uint32_t rows, uint32_t cols, const uint8_t* data) {
  return DevMatrix{type, data, rows, cols, *model::ggml_bytes(type, cols)};
}

// Random blocks of `type`: quantized from normal values (random_rows), but IQ3_S's (the CPU's
// quantizer searches its grid: seconds for these sizes) random bytes with a small d, IQ3_S blocks as
// well.
std::vector<uint8_t> test_rows(GgmlType type, uint32_t rows, uint32_t cols, std::mt19937& rng) {
  if (type != GgmlType::IQ3_S) return random_rows(type, rows, cols, rng);
  std::vector<uint8_t> out(*model::ggml_bytes(type, size_t{rows} * cols));
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : out) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(0.01f, 0.1f);
  const size_t block = model::ggml_type_traits(type).block_bytes;
  for (size_t b = 0; b < out.size() / block; ++b) {
    const uint16_t d = model::f32_to_fp16(scale(rng));
    std::memcpy(out.data() + b * block, &d, 2);
  }
  return out;
}

void make_experts(const Case& c, std::mt19937& rng, Experts& x) {
  const uint32_t rows[3] = {c.I, c.I, c.D}, cols[3] = {c.D, c.D, c.I};
  const int parts = c.down ? 3 : 2;
  for (int p = 0; p < parts; ++p) {
    for (uint32_t e = 0; e < c.E; ++e) {
      x.blocks[p].push_back(test_rows(c.type, rows[p], cols[p], rng));
      if (c.wide) {  // d (each type's first two bytes) 0 in every 7th block
        const size_t block = model::ggml_type_traits(c.type).block_bytes;
        std::vector<uint8_t>& bytes = x.blocks[p].back();
        for (size_t b = 0; b < bytes.size() / block; b += 7) std::memset(&bytes[b * block], 0, 2);
      }
      x.w[p].push_back(dequant(c.type, x.blocks[p].back(), size_t{rows[p]} * cols[p]));
    }
  }
  // Stacked: the kernel's weights without tables, and the decode reference's always (its kernel reads
  // K-quant blocks by 16-byte loads).
  for (int p = 0; p < parts; ++p) {
    const size_t bytes = x.blocks[p][0].size();
    x.stacked[p] = DeviceBuffer(bytes * c.E);
    for (uint32_t e = 0; e < c.E; ++e) {
      uint8_t* at = x.stacked[p].as<uint8_t>() + e * bytes;
      ASSERT_EQ(cudaMemcpy(at, x.blocks[p][e].data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
      x.where[p].push_back(at);
    }
    x.m[p] = {shape(c.type, rows[p], cols[p], x.stacked[p].as<uint8_t>()), bytes, nullptr};
  }
  if (!c.tables) return;
  // One slot an expert (reverse order; expert 1 in pinned host memory), parts 256 bytes apart plus
  // 4 for odd experts.
  size_t offset[4] = {0, 0, 0, 0};
  for (int p = 0; p < parts; ++p) offset[p + 1] = offset[p] + (x.blocks[p][0].size() + 4 + 255) / 256 * 256;
  const size_t slot = offset[parts];
  x.slots = DeviceBuffer(slot * c.E);
  x.host_slot = PinnedBuffer(slot);
  std::vector<const uint8_t*> table(3 * size_t{c.E}, nullptr);
  for (uint32_t e = 0; e < c.E; ++e) {
    uint8_t* base = e == 1 ? x.host_slot.as<uint8_t>() : x.slots.as<uint8_t>() + (c.E - 1 - e) * slot;
    for (int p = 0; p < parts; ++p) {
      uint8_t* at = base + offset[p] + (e % 2 == 1 ? 4 : 0);
      ASSERT_EQ(cudaMemcpy(at, x.blocks[p][e].data(), x.blocks[p][e].size(), cudaMemcpyDefault), cudaSuccess);
      table[p * size_t{c.E} + e] = at;
    }
  }
  x.tables = DeviceBuffer(table.size() * sizeof(uint8_t*));
  ASSERT_EQ(cudaMemcpy(x.tables.get(), table.data(), x.tables.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  for (int p = 0; p < parts; ++p) {
    x.m[p] = {shape(c.type, rows[p], cols[p], nullptr), 0, x.tables.as<const uint8_t*>() + p * size_t{c.E}};
  }
}

std::vector<int32_t> make_routes(const Case& c, std::mt19937& rng) {
  std::vector<int32_t> ids(size_t{c.n} * c.k);
  std::vector<int32_t> allowed;
  for (uint32_t e = 0; e < c.E; ++e) {
    if (e != 2 && e != c.E - 1) allowed.push_back(static_cast<int32_t>(e));
  }
  for (uint32_t r = 0; r < c.n; ++r) {
    if (c.one_expert) {
      ids[r] = 3;
      continue;
    }
    std::shuffle(allowed.begin(), allowed.end(), rng);
    for (uint32_t j = 0; j < c.k; ++j) ids[size_t{r} * c.k + j] = allowed[j];
  }
  return ids;
}

// The decode matvec of each expert over its sorted rows of x (`cols` apart), 8 rows a launch.
void decode_products(GgmlType type, const std::vector<const uint8_t*>& where, uint32_t rows, uint32_t cols,
                     const std::vector<uint32_t>& off, const float* x, float* y) {
  for (size_t e = 0; e + 1 < off.size(); ++e) {
    for (uint32_t p = off[e]; p < off[e + 1]; p += kMaxMatvecTokens) {
      MatvecArgs a;
      a.w = shape(type, rows, cols, where[e]);
      a.x = x + size_t{p} * cols;
      a.x_tok_stride = cols;
      a.y = y + size_t{p} * rows;
      a.y_tok_stride = rows;
      a.tokens = std::min(kMaxMatvecTokens, off[e + 1] - p);
      ASSERT_TRUE(matvec_quantizes_activations(a)) << "the decode reference is not the int16 path";
      matvec(a, nullptr);
    }
  }
}

double silu_clamped(double g, double u, double& dg, double& du) {
  const double gc = std::min(g, double(kLimit)), uc = std::min(std::max(u, -double(kLimit)), double(kLimit));
  const double s = 1.0 / (1.0 + std::exp(-gc));
  dg = std::abs(s * (1.0 + gc * (1.0 - s)) * uc);
  du = std::abs(gc * s);
  return gc * s * uc;
}

// The decode int16 tests' bound on W[r] . x (tests/gpu/matvec_test.cpp): f32 rounding, plus every x
// rounded by half a step of its block.
struct Cpu {
  double dot = 0, bound = 0;
};
Cpu cpu_dot(const float* w, const float* x, size_t cols) {
  Cpu c;
  double mag = 0;
  for (size_t b = 0; b < cols; b += 32) {
    float amax = 0;
    for (size_t t = b; t < b + 32; ++t) amax = std::max(amax, std::abs(x[t]));
    for (size_t t = b; t < b + 32; ++t) {
      c.dot += double(w[t]) * x[t];
      mag += std::abs(double(w[t]) * x[t]);
      c.bound += std::abs(double(w[t])) * amax / 32767.0 * 0.5;
    }
  }
  c.bound += 1e-5 * mag + 1e-6;
  return c;
}

double row_max(const float* v, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::abs(double(v[i])));
  return m;
}

// Runs c's chunk on experts made by make_experts for c's shape and type, and checks every sorted row.
void run_case(const Case& c, const Experts& ex, std::mt19937& rng) {
  const uint32_t D = c.D, I = c.I, routes = c.n * c.k;
  const std::vector<int32_t> ids = make_routes(c, rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(size_t{c.n} * D);
  for (float& v : x) v = normal(rng);
  for (uint32_t r = 0; r < c.n && c.wide; ++r) {
    const float scale = r % 11 == 3 ? 0.0f : std::pow(10.0f, 8.0f * static_cast<float>(r % 5) - 16.0f);
    for (uint32_t t = 0; t < D; ++t) x[size_t{r} * D + t] *= (t / 32) % 5 == 1 ? scale * 0x1p-20f : scale;
  }

  DeviceBuffer dids(routes * 4), dx(x.size() * 4), doff((c.E + 1) * 4), dtiles((c.E + 1) * 4), dgather(routes * 4),
      dwhere(routes * 4), deg(size_t{routes} * I * 4), deg_best(size_t{routes} * I * 4), deo(size_t{routes} * D * 4);
  ASSERT_EQ(cudaMemcpy(dids.get(), ids.data(), routes * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dx.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  for (DeviceBuffer* b : {&deg, &deg_best, &deo}) ASSERT_EQ(cudaMemset(b->get(), 0xff, b->bytes()), cudaSuccess);
  const size_t split_elems = std::max(size_t{c.n} * D, size_t{routes} * I);
  DeviceBuffer dsh(split_elems * 2), dsl(split_elems * 2);
  const SplitScratch split{dsh.get(), dsl.get(), split_elems};
  const RouteSort sort{doff.as<uint32_t>(), dtiles.as<uint32_t>(), dgather.as<int32_t>(), dwhere.as<int32_t>()};
  const ExpertMatrices* up = c.up ? &ex.m[1] : nullptr;
  if (!sm80_code_ready()) GTEST_SKIP() << "no sm80+ code for the int8 kernel on this device";
  ASSERT_TRUE(grouped_int8_takes(ex.m[0], up, dx.as<float>(), D, c.n, split)) << "sm80+ code, yet not the int8 path";
  sort_routes(dids.as<int32_t>(), routes, c.k, c.E, sort, RouteTally{}, nullptr);
  grouped_gemm_int8(ex.m[0], up, dx.as<float>(), D, c.n, sort.gather, sort, routes, c.E, kLimit, deg.as<float>(),
                    I, split, nullptr);
  if (c.down) {
    ASSERT_TRUE(grouped_int8_takes(ex.m[2], nullptr, deg.as<float>(), I, routes, split));
    grouped_gemm_int8(ex.m[2], nullptr, deg.as<float>(), I, routes, nullptr, sort, routes, c.E, 0.0f,
                      deo.as<float>(), D, split, nullptr);
  }
  grouped_gemm(ex.m[0], up, dx.as<float>(), D, c.n, sort.gather, sort, routes, c.E, kLimit, deg_best.as<float>(),
               I, nullptr, split, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  std::vector<uint32_t> off(c.E + 1);
  std::vector<int32_t> gather(routes);
  std::vector<float> eg(size_t{routes} * I), eg_best(eg.size()), eo(size_t{routes} * D);
  ASSERT_EQ(cudaMemcpy(off.data(), doff.get(), off.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(gather.data(), dgather.get(), routes * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(eg.data(), deg.get(), eg.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(eg_best.data(), deg_best.get(), eg.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(eo.data(), deo.get(), eo.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(std::memcmp(eg.data(), eg_best.data(), eg.size() * 4), 0) << "grouped_gemm did not take the int8 path";

  // The decode references: the sorted rows' inputs gathered here, gate and up of each expert on them;
  // down on the device's SwiGLU output.
  std::vector<float> xs(size_t{routes} * D);
  for (uint32_t p = 0; p < routes; ++p) std::copy_n(&x[size_t(gather[p]) * D], D, &xs[size_t{p} * D]);
  DeviceBuffer dxs(xs.size() * 4), drg(eg.size() * 4), dru(eg.size() * 4), dro(eo.size() * 4);
  ASSERT_EQ(cudaMemcpy(dxs.get(), xs.data(), xs.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  decode_products(c.type, ex.where[0], I, D, off, dxs.as<float>(), drg.as<float>());
  if (c.up) decode_products(c.type, ex.where[1], I, D, off, dxs.as<float>(), dru.as<float>());
  if (c.down) decode_products(c.type, ex.where[2], D, I, off, deg.as<float>(), dro.as<float>());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> rg(eg.size()), ru(eg.size()), ro(eo.size());
  ASSERT_EQ(cudaMemcpy(rg.data(), drg.get(), rg.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  if (c.up) {
    ASSERT_EQ(cudaMemcpy(ru.data(), dru.get(), ru.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  if (c.down) {
    ASSERT_EQ(cudaMemcpy(ro.data(), dro.get(), ro.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  }

  const uint32_t cpu_stride = routes > 128 ? 17 : 1;
  for (uint32_t e = 0; e < c.E; ++e) {
    for (uint32_t p = off[e]; p < off[e + 1]; ++p) {
      const size_t at = size_t{p} * I;
      const double mg = row_max(&rg[at], I), mu = c.up ? row_max(&ru[at], I) : 0.0;
      const bool cpu = p % cpu_stride == 0;
      for (uint32_t r = 0; r < I; ++r) {
        const float* xr = &xs[size_t{p} * D];
        if (!c.up) {
          ASSERT_NEAR(eg[at + r], rg[at + r], kTight * mg + 1e-7)
              << "sorted row " << p << " of " << routes << ", expert " << e << ", row " << r;
          if (!cpu) continue;
          const Cpu g = cpu_dot(&ex.w[0][e][size_t{r} * D], xr, D);
          ASSERT_NEAR(eg[at + r], g.dot, g.bound) << "sorted row " << p << ", row " << r << " against the CPU";
          continue;
        }
        double dg = 0, du = 0;
        const double want = silu_clamped(rg[at + r], ru[at + r], dg, du);
        const double tol = dg * kTight * mg + du * kTight * mu + 1e-6 * std::abs(want) + 1e-7;
        ASSERT_NEAR(eg[at + r], want, tol) << "sorted row " << p << " of " << routes << ", expert " << e << ", row "
                                            << r << ": int8 vs the decode matvec's gate " << rg[at + r] << ", up "
                                            << ru[at + r];
        if (!cpu) continue;
        const Cpu g = cpu_dot(&ex.w[0][e][size_t{r} * D], xr, D), u = cpu_dot(&ex.w[1][e][size_t{r} * D], xr, D);
        const double cw = silu_clamped(g.dot, u.dot, dg, du);
        ASSERT_NEAR(eg[at + r], cw, dg * g.bound + du * u.bound + 1e-6 * std::abs(cw) + 1e-7)
            << "sorted row " << p << ", expert " << e << ", row " << r << " against the CPU";
      }
      if (!c.down) continue;
      const size_t ot = size_t{p} * D;
      const double mo = row_max(&ro[ot], D);
      for (uint32_t r = 0; r < D; ++r) {
        ASSERT_NEAR(eo[ot + r], ro[ot + r], kTight * mo + 1e-7)
            << "down: sorted row " << p << " of " << routes << ", expert " << e << ", row " << r;
        if (!cpu) continue;
        const Cpu d = cpu_dot(&ex.w[2][e][size_t{r} * I], &eg[at], I);
        ASSERT_NEAR(eo[ot + r], d.dot, d.bound) << "down: sorted row " << p << ", expert " << e << ", row " << r
                                                << " against the CPU";
      }
    }
  }
}

class GroupedExpertsInt8 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
    upload_quant_tables();
  }
};

std::string name(GgmlType t) { return std::string(model::ggml_type_traits(t).name); }

// Makes c's experts and runs c on them (a fresh generator from seed).
void make_and_run(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  Experts ex;
  make_experts(c, rng, ex);
  if (::testing::Test::HasFatalFailure()) return;
  run_case(c, ex, rng);
}

TEST_F(GroupedExpertsInt8, MatchTheDecodeMatvecAndTheCpuForEveryChunkSize) {
  for (const GgmlType t : kTypes) {
    Case c{9, 2, 512, 256, 1};
    c.type = t;
    std::mt19937 rng(100);
    Experts ex;
    make_experts(c, rng, ex);
    if (HasFatalFailure()) return;
    for (const uint32_t n : {1u, 9u, 300u, 2048u}) {
      SCOPED_TRACE(name(t) + ", " + std::to_string(n) + " rows, spread");
      c.n = n;
      run_case(c, ex, rng);
      if (HasFatalFailure() || IsSkipped()) return;
    }
    SCOPED_TRACE(name(t) + ", 2048 rows, all to one expert");
    Case one{4, 1, 256, 512, 2048, true};
    one.type = t;
    make_and_run(one, 7);
    if (HasFatalFailure() || IsSkipped()) return;
  }
}

TEST_F(GroupedExpertsInt8, TablesHostMemoryAndUnalignedExperts) {
  for (const GgmlType t : kTypes) {
    SCOPED_TRACE(name(t));
    Case c{6, 2, 768, 256, 300, false, true};
    c.type = t;
    make_and_run(c, 21);
    if (HasFatalFailure() || IsSkipped()) return;
  }
}

// Inputs far from 1 and of a wide range within a row (a step per 32 values, so blocks 2^-20 of their
// row keep their precision), zero rows, and weight blocks of d 0.
TEST_F(GroupedExpertsInt8, RowsOfAnyScaleAndBlocksOfZeroD) {
  for (const GgmlType t : kTypes) {
    SCOPED_TRACE(name(t));
    Case c{6, 2, 512, 256, 200};
    c.type = t;
    c.wide = true;
    make_and_run(c, 51);
    if (HasFatalFailure() || IsSkipped()) return;
  }
}

// Gate and up rows off the 64-row tiles, and one projection of rows off the 128-row tiles (no down:
// its rows would not be whole blocks).
TEST_F(GroupedExpertsInt8, RowsOffTheTiles) {
  for (const GgmlType t : kTypes) {
    SCOPED_TRACE(name(t) + ": gate and up of 200 rows");
    Case c{5, 2, 512, 200, 150, false, false, false};
    c.type = t;
    make_and_run(c, 31);
    if (HasFatalFailure() || IsSkipped()) return;
    SCOPED_TRACE(name(t) + ": one projection of 328 rows");
    Case one{5, 2, 256, 328, 150, false, false, false, false};
    one.type = t;
    make_and_run(one, 33);
    if (HasFatalFailure()) return;
  }
}

// One expert's rows for the first n tokens of x (k 1, every route to expert 3): each token's SwiGLU
// row (gate and up) and its down row, by token.
struct TokenRows {
  std::vector<float> swiglu, down;
};
TokenRows one_expert_rows(const Case& c, const Experts& ex, const std::vector<float>& x, uint32_t n) {
  TokenRows out;
  const uint32_t D = c.D, I = c.I;
  const std::vector<int32_t> ids(n, 3);
  DeviceBuffer dids(n * 4), dx(size_t{n} * D * 4), doff((c.E + 1) * 4), dtiles((c.E + 1) * 4), dgather(n * 4),
      dwhere(n * 4), deg(size_t{n} * I * 4), deo(size_t{n} * D * 4);
  EXPECT_EQ(cudaMemcpy(dids.get(), ids.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(dx.get(), x.data(), size_t{n} * D * 4, cudaMemcpyHostToDevice), cudaSuccess);
  const size_t split_elems = size_t{n} * std::max(D, I);
  DeviceBuffer dsh(split_elems * 2), dsl(split_elems * 2);
  const SplitScratch split{dsh.get(), dsl.get(), split_elems};
  const RouteSort sort{doff.as<uint32_t>(), dtiles.as<uint32_t>(), dgather.as<int32_t>(), dwhere.as<int32_t>()};
  sort_routes(dids.as<int32_t>(), n, 1, c.E, sort, RouteTally{}, nullptr);
  grouped_gemm_int8(ex.m[0], &ex.m[1], dx.as<float>(), D, n, sort.gather, sort, n, c.E, kLimit, deg.as<float>(), I,
                    split, nullptr);
  grouped_gemm_int8(ex.m[2], nullptr, deg.as<float>(), I, n, nullptr, sort, n, c.E, 0.0f, deo.as<float>(), D, split,
                    nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<int32_t> gather(n);
  std::vector<float> eg(size_t{n} * I), eo(size_t{n} * D);
  EXPECT_EQ(cudaMemcpy(gather.data(), dgather.get(), n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(eg.data(), deg.get(), eg.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(eo.data(), deo.get(), eo.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  out.swiglu.resize(eg.size());
  out.down.resize(eo.size());
  for (uint32_t p = 0; p < n; ++p) {
    std::copy_n(&eg[size_t{p} * I], I, &out.swiglu[size_t(gather[p]) * I]);
    std::copy_n(&eo[size_t{p} * D], D, &out.down[size_t(gather[p]) * D]);
  }
  return out;
}

// A token's rows do not depend on the tokens beside it: its tile of 64 sorted rows may hold 1 to 64
// tokens, so a warp multiplies 0 to 4 8-token tiles of its 32 (the kernel's code for each count
// differs), and every count gives the same bits as a full tile.
TEST_F(GroupedExpertsInt8, ATokensRowsHaveTheSameBitsWhateverItsTileHolds) {
  if (!sm80_code_ready()) GTEST_SKIP() << "no sm80+ code for the int8 kernel on this device";
  for (const GgmlType t : kTypes) {
    SCOPED_TRACE(name(t));
    Case c{4, 1, 512, 256, 192, true};
    c.type = t;
    std::mt19937 rng(41);
    Experts ex;
    make_experts(c, rng, ex);
    if (HasFatalFailure()) return;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(size_t{c.n} * c.D);
    for (float& v : x) v = normal(rng);
    const TokenRows full = one_expert_rows(c, ex, x, c.n);
    for (const uint32_t n : {1u, 7u, 9u, 24u, 33u, 41u, 57u, 64u, 65u}) {
      SCOPED_TRACE(std::to_string(n) + " tokens");
      const TokenRows part = one_expert_rows(c, ex, x, n);
      if (HasFailure()) return;
      ASSERT_EQ(std::memcmp(part.swiglu.data(), full.swiglu.data(), part.swiglu.size() * 4), 0);
      ASSERT_EQ(std::memcmp(part.down.data(), full.down.data(), part.down.size() * 4), 0);
    }
  }
}

}  // namespace
}  // namespace ferry::gpu
#endif
