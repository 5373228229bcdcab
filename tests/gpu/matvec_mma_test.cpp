// The decode matvec on int8 tensor cores (gpu/matvec_mma.cu, Q4_K and Q5_K) against the dp2a kernel it
// replaces (launch_matvec_dp2a: the same int16 activations and integer sums, so only the
// f32 order of the scale and minimum terms differs: 1e-5 of the largest |y| of the launch) on every
// MatvecArgs feature, and against a double-precision CPU dot product at matvec_test's int16 bounds;
// Q4_K's one-token products against the general kernel's tokens, bit for bit.
// Timing lines (printed, not asserted) for an output-head-sized matrix, 8192 x 4096 and 4096 x 2048. Outputs
// are poisoned (NaN) before each run; a value one kernel writes and the other does not fails.
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gpu/bandwidth.hpp"
#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "gpu/matvec_int16.hpp"
#include "gpu/matvec_mma.hpp"
#include "gpu/pdl.hpp"
#include "model/formats/quant.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/gpu/quant_rows.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::dequant;
using ferry::testing::have_device;
using ferry::testing::random_q4k_blocks;
using ferry::testing::random_rows;
using model::GgmlType;
constexpr GgmlType kTypes[] = {GgmlType::Q4_K, GgmlType::Q5_K};

DeviceBuffer to_device(const void* p, size_t bytes) {
  DeviceBuffer b(bytes);
  EXPECT_EQ(cudaMemcpy(b.get(), p, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  return b;
}
template <class V>
DeviceBuffer to_device(const std::vector<V>& v) {
  return to_device(v.data(), v.size() * sizeof(V));
}
std::vector<float> normal(size_t n, std::mt19937& rng, float sd = 1.0f) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

struct Matrix {
  std::vector<uint8_t> data;
  DeviceBuffer buf;
  DevMatrix m;
};
Matrix random_matrix(GgmlType type, size_t rows, size_t cols, std::mt19937& rng) {
  Matrix r{random_rows(type, rows, cols, rng), DeviceBuffer(1), {}};
  r.buf = to_device(r.data);
  r.m.type = type;
  r.m.data = r.buf.as<uint8_t>();
  r.m.rows = static_cast<uint32_t>(rows);
  r.m.cols = static_cast<uint32_t>(cols);
  r.m.row_bytes = *model::ggml_bytes(type, cols);
  return r;
}

// The launch's outputs all lie in one arena: the arguments' y pointers are set into a host vector of
// its size, and a run gets a fresh poisoned device copy of it with every y pointer moved into that.
struct Outputs {
  std::vector<float> host;
  explicit Outputs(size_t floats) : host(floats) {}
  float* base() { return host.data(); }
  size_t floats() const { return host.size(); }
};
MatvecArgs rebased(const MatvecArgs& a, Outputs& o, float* to) {
  MatvecArgs r = a;
  r.y = to + (a.y - o.base());
  for (uint32_t p = 1; p < a.parts; ++p) r.more[p - 1].y = to + (a.more[p - 1].y - o.base());
  return r;
}
enum class Kernel { mma, dp2a };
void launch(const MatvecArgs& a, Kernel k) {
  if (k == Kernel::mma) {
    launch_matvec_mma(a, nullptr);
  } else {
    launch_matvec_dp2a(a, nullptr, nullptr);
  }
}
std::vector<float> run(const MatvecArgs& a, Outputs& o, Kernel k) {
  DeviceBuffer y(o.floats() * 4);
  EXPECT_EQ(cudaMemset(y.get(), 0xff, o.floats() * 4), cudaSuccess);
  const MatvecArgs r = rebased(a, o, y.as<float>());
  launch(r, k);
  std::vector<float> out(o.floats());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(out.data(), y.get(), o.floats() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

// Both kernels' outputs: the same values written (NaN where neither writes), within 1e-5 of the
// largest |y| of the dp2a kernel. Returns "" or the first mismatches.
std::string compare(const std::vector<float>& mma, const std::vector<float>& ref) {
  double top = 0;
  for (float v : ref) {
    if (!std::isnan(v)) top = std::max(top, double(std::abs(v)));
  }
  const double bound = 1e-5 * top + 1e-6;
  std::ostringstream bad;
  size_t n = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const bool ok = std::isnan(ref[i]) ? std::isnan(mma[i]) : std::abs(double(mma[i]) - ref[i]) <= bound;
    if (!ok && n++ < 6) bad << " [" << i << "] mma " << mma[i] << " dp2a " << ref[i] << ";";
  }
  if (n == 0) return "";
  bad << " " << n << " of " << ref.size() << " outside " << bound;
  return bad.str();
}

std::string diff_kernels(const MatvecArgs& a, Outputs& o) {
  EXPECT_TRUE(matvec_mma_applies(a));
  return compare(run(a, o, Kernel::mma), run(a, o, Kernel::dp2a));
}

class MatvecMmaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
    upload_quant_tables();
    if (!sm80_code_ready()) GTEST_SKIP() << "no sm80+ code of the tensor-core kernel on this device";
    for (const GgmlType type : kTypes) {
      MatvecArgs probe;
      probe.w.type = type;
      probe.w.cols = 256;
      probe.w.rows = 16;
      ASSERT_TRUE(matvec_mma_applies(probe))
          << "sm80+ code, yet a " << model::ggml_type_traits(type).name << " call does not take the tensor-core kernel";
    }
  }
};

// Plain launches of every token count that takes the int16 path: rows off the 16-row tiles, rows of
// 1..16 superblocks (1, 2, 4 and 8 warps a tile, some warps with one superblock more than others).
TEST_F(MatvecMmaTest, MatchesTheDp2aKernelAndTheCpu) {
  for (const GgmlType type : kTypes) {
    std::mt19937 rng(515 + static_cast<int>(type));
    const std::pair<size_t, size_t> shapes[] = {{5, 256},    {301, 256},  {301, 512}, {301, 768},
                                                {301, 1536}, {140, 2048}, {70, 2560}, {77, 4096}};
    for (const auto& [rows, cols] : shapes) {
      Matrix w = random_matrix(type, rows, cols, rng);
      const auto wf = dequant(type, w.data, rows * cols);
      for (uint32_t tokens = 1; tokens <= kMaxMatvecTokens; ++tokens) {
        const auto x = normal(tokens * cols, rng);
        DeviceBuffer dx = to_device(x);
        MatvecArgs a;
        a.w = w.m;
        a.x = dx.as<float>();
        a.x_tok_stride = cols;
        Outputs o(tokens * rows);
        a.y = o.base();
        a.y_tok_stride = rows;
        a.tokens = tokens;
        if (!matvec_quantizes_activations(a)) continue;  // x no longer fits shared memory
        const auto y = run(a, o, Kernel::mma);
        const std::string d = compare(y, run(a, o, Kernel::dp2a));
        ASSERT_EQ(d, "") << rows << " x " << cols << ", " << tokens << " tokens";
        for (uint32_t t = 0; t < tokens; ++t) {
          for (size_t r = 0; r < rows; ++r) {
            double ref = 0, mag = 0, rounding = 0;
            for (size_t c0 = 0; c0 < cols; c0 += 32) {
              float amax = 0;
              for (size_t c = c0; c < c0 + 32; ++c) amax = std::max(amax, std::abs(x[t * cols + c]));
              for (size_t c = c0; c < c0 + 32; ++c) {
                const double p = double(wf[r * cols + c]) * x[t * cols + c];
                ref += p;
                mag += std::abs(p);
                rounding += std::abs(double(wf[r * cols + c])) * amax / 32767.0 * 0.5;
              }
            }
            ASSERT_NEAR(y[t * rows + r], ref, 1e-5 * mag + 1e-6 + rounding)
                << rows << " x " << cols << ", token " << t << " row " << r << " of " << tokens;
          }
        }
      }
    }
  }
}

// Matrices of more tiles than the blocks of one wave: blocks loop over their steps (and the partial
// sums' two buffers alternate).
TEST_F(MatvecMmaTest, BlocksLoopOverManyTiles) {
  for (const GgmlType type : kTypes) {
    std::mt19937 rng(61 + static_cast<int>(type));
    for (const auto& [rows, cols] : {std::pair<size_t, size_t>{40000, 256}, {9001, 1024}, {5000, 4096}}) {
      DeviceBuffer dw = to_device(ferry::testing::random_blocks(type, rows, cols));
      const size_t row_bytes = *model::ggml_bytes(type, cols);
      for (uint32_t tokens : {1u, 3u, 8u}) {
        const auto x = normal(tokens * cols, rng);
        DeviceBuffer dx = to_device(x);
        MatvecArgs a;
        a.w = {type, dw.as<uint8_t>(), static_cast<uint32_t>(rows), static_cast<uint32_t>(cols), row_bytes};
        a.x = dx.as<float>();
        a.x_tok_stride = cols;
        Outputs o(tokens * rows);
        a.y = o.base();
        a.y_tok_stride = rows;
        a.tokens = tokens;
        if (!matvec_quantizes_activations(a)) continue;
        ASSERT_EQ(diff_kernels(a, o), "") << rows << " x " << cols << ", " << tokens << " tokens";
      }
    }
  }
}

// Experts by index (x per token, two experts a token), a skipped group, SwiGLU inputs, parts with
// their own rows, inputs and strides, a single part, pointer tables, tokens named on the device.
TEST_F(MatvecMmaTest, EveryMatvecArgsFeatureMatchesTheDp2aKernel) {
  for (const GgmlType type : kTypes) {
    std::mt19937 rng(8 + static_cast<int>(type));
    const size_t rows = 40, cols = 1024, mats = 5;
    Matrix w = random_matrix(type, rows * mats, cols, rng);
    Matrix w2 = random_matrix(type, rows * mats, cols, rng);
    const std::vector<int32_t> ids = {4, 1, 0, 4, -1, 3};
    const uint32_t k = 2, groups = 6;
    std::vector<const uint8_t*> ptrs(mats);
    for (size_t e = 0; e < mats; ++e) ptrs[e] = w2.m.data + e * rows * w2.m.row_bytes;
    DeviceBuffer dids = to_device(ids), dptrs = to_device(ptrs);
    const auto x = normal(8 * groups * cols, rng), up = normal(8 * groups * cols, rng, 2.0f);
    DeviceBuffer dx = to_device(x), dup = to_device(up);
    Outputs o(8 * (3 * rows + 37 + 3 * rows) + 2 * groups * 8 * rows);
    float* const arena = o.base();
    for (uint32_t tokens : {1u, 2u, 5u}) {
      MatvecArgs a;
      a.w = w.m.slice_rows(0, rows);
      a.w_group_bytes = w.m.row_bytes * rows;
      a.w_group_index = dids.as<int32_t>();
      a.skip_negative_index = true;
      a.x = dx.as<float>();
      a.x_tok_stride = cols;
      a.x_group_stride = 8 * cols;
      a.x_group_div = k;
      a.y = arena;
      a.y_tok_stride = rows;
      a.y_group_stride = 8 * rows;
      a.groups = groups;
      a.tokens = tokens;
      ASSERT_EQ(diff_kernels(a, o), "") << "experts by index, " << tokens << " tokens";

      MatvecArgs s = a;
      s.x_up = dup.as<float>();
      s.swiglu_limit = 2.5f;
      ASSERT_EQ(diff_kernels(s, o), "") << "SwiGLU input, " << tokens << " tokens";

      // gate by index, up through the pointer table, into an output of its own.
      MatvecArgs gu = a;
      gu.parts = 2;
      gu.more[0] = {nullptr, reinterpret_cast<const uint8_t* const*>(dptrs.get()), arena + groups * 8 * rows, nullptr,
                    0, 0};
      ASSERT_EQ(diff_kernels(gu, o), "") << "gate and up, " << tokens << " tokens";

      // Experts by index over SwiGLU inputs beside one matrix over the blocks of every group (a shared
      // expert: its own rows, x and up input): on both kernels the bits of a plain launch of it.
      MatvecArgs sp = s;
      sp.parts = 2;
      MatvecPart& one = sp.more[0];
      one.data = w2.m.data, one.y = arena + groups * 8 * rows, one.x = dx.as<float>() + 8 * cols, one.rows = 3 * rows;
      one.y_tok_stride = 3 * rows, one.x_up = dup.as<float>() + 8 * cols, one.single = true;
      ASSERT_EQ(diff_kernels(sp, o), "") << "a single part, " << tokens << " tokens";
      MatvecArgs plain;
      plain.w = w2.m.slice_rows(0, 3 * rows);
      plain.x = one.x, plain.x_tok_stride = cols, plain.x_up = one.x_up, plain.swiglu_limit = s.swiglu_limit;
      plain.y = one.y, plain.y_tok_stride = 3 * rows, plain.tokens = tokens;
      for (Kernel k : {Kernel::mma, Kernel::dp2a}) {
        const std::vector<float> got = run(sp, o, k), want = run(plain, o, k);
        for (size_t i = groups * 8 * rows; i < groups * 8 * rows + tokens * 3 * rows; ++i) {
          ASSERT_FALSE(std::isnan(want[i])) << i;
          ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0) << (k == Kernel::mma ? "mma" : "dp2a") << " single part, "
                                                          << tokens << " tokens, [" << i << "]: " << got[i] << " vs " << want[i];
        }
      }

      // q/k/v-like parts of one input and of their own, other row counts and token strides.
      MatvecArgs p;
      p.w = w.m.slice_rows(0, 3 * rows);
      p.x = dx.as<float>();
      p.x_tok_stride = cols;
      p.y = arena;
      p.y_tok_stride = 3 * rows;
      p.tokens = tokens;
      p.parts = 3;
      p.more[0] = {w.m.data + 3 * rows * w.m.row_bytes, nullptr, arena + 8 * 3 * rows, nullptr, 37, 37};
      p.more[1] = {w2.m.data, nullptr, arena + 8 * 3 * rows + 8 * 37, dx.as<float>() + 8 * cols, 2 * rows, 0};
      ASSERT_EQ(diff_kernels(p, o), "") << "parts, " << tokens << " tokens";
    }

    // Tokens named on the device: 4 of 5 groups live, each over its own rows of x and y.
    const uint32_t tokens = 3;
    const std::vector<int32_t> count = {4}, tok_count = {2, 1, 3, 0, 3};
    const std::vector<int32_t> tok_x = {5, 1, 0, 0, 7, 2, 3, 0, 0, 0, 6, 4, 1, 1, 1};
    const std::vector<int32_t> tok_y = {0, 1, 0, 2, 3, 4, 5, 6, 7, 0, 0, 0, 1, 2, 3};
    const std::vector<int32_t> named_ids = {2, 0, 4, 1, 3};
    DeviceBuffer dcount = to_device(count), dtc = to_device(tok_count), dtx = to_device(tok_x), dty = to_device(tok_y),
                 dnid = to_device(named_ids);
    MatvecArgs n;
    n.w = w.m.slice_rows(0, rows);
    n.w_group_bytes = w.m.row_bytes * rows;
    n.w_group_index = dnid.as<int32_t>();
    n.x = dx.as<float>();
    n.x_tok_stride = cols;
    n.y = arena;
    n.y_tok_stride = rows;
    n.tokens = tokens;
    n.groups = 5;
    n.group_count = dcount.as<int32_t>();
    n.tok_count = dtc.as<int32_t>();
    n.tok_x = dtx.as<int32_t>();
    n.tok_y = dty.as<int32_t>();
    ASSERT_EQ(diff_kernels(n, o), "") << "tokens named on the device";
  }
}

// Token t of a launch as a launch of its own (x, SwiGLU input and y moved to token t).
MatvecArgs token_of(const MatvecArgs& a, uint32_t t) {
  MatvecArgs one = a;
  one.tokens = 1;
  one.x += t * a.x_tok_stride;
  if (one.x_up != nullptr) one.x_up += t * a.x_tok_stride;
  one.y += t * a.y_tok_stride;
  for (uint32_t p = 1; p < a.parts; ++p) {
    MatvecPart& m = one.more[p - 1];
    if (m.x != nullptr) m.x += t * a.x_tok_stride;
    if (m.x_up != nullptr) m.x_up += t * a.x_tok_stride;
    m.y += t * (m.y_tok_stride != 0 ? m.y_tok_stride : a.y_tok_stride);
  }
  return one;
}
// Every output of a launch of `a.tokens` tokens has the bits of its token's one-token launch (Q4_K's
// one-token products, gpu/matvec_mma_readers.cuh K4One, against the general kernel's), and nothing
// else is written.
std::string one_token_bits(const MatvecArgs& a, Outputs& o) {
  const std::vector<float> all = run(a, o, Kernel::mma);
  std::vector<float> ones(all.size(), std::nanf(""));
  for (uint32_t t = 0; t < a.tokens; ++t) {
    const std::vector<float> one = run(token_of(a, t), o, Kernel::mma);
    for (size_t i = 0; i < one.size(); ++i) {
      if (!std::isnan(one[i])) ones[i] = one[i];
    }
  }
  std::ostringstream bad;
  size_t n = 0, written = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    written += std::isnan(all[i]) ? 0 : 1;
    if (std::memcmp(&all[i], &ones[i], 4) != 0 && !(std::isnan(all[i]) && std::isnan(ones[i])) && n++ < 6) {
      bad << " [" << i << "] " << all[i] << " vs one token " << ones[i] << ";";
    }
  }
  if (written == 0) return "nothing written";
  if (n > 0) bad << " " << n << " of " << written << " differ";
  return bad.str();
}

// Q4_K at one token takes products of its own (K4One): the bits of the general kernel's tokens, over
// rows of 1..48 superblocks, blocks that loop, SwiGLU inputs, experts by index, parts, single parts,
// one x for every group.
TEST_F(MatvecMmaTest, OneTokenProductsGiveTheBitsOfTheGeneralKernel) {
  const GgmlType type = GgmlType::Q4_K;
  std::mt19937 rng(1011);
  const std::pair<size_t, size_t> shapes[] = {{5, 256}, {301, 512}, {301, 1536}, {140, 2048}, {77, 4096},
                                              {5000, 4096}, {300, 8192}, {200, 12288}};
  for (const auto& [rows, cols] : shapes) {
    Matrix w = random_matrix(type, rows, cols, rng);
    const auto x = normal(2 * cols, rng), up = normal(2 * cols, rng, 2.0f);
    DeviceBuffer dx = to_device(x), dup = to_device(up);
    for (bool swiglu : {false, true}) {
      MatvecArgs a;
      a.w = w.m;
      a.x = dx.as<float>();
      a.x_tok_stride = cols;
      Outputs o(2 * rows);
      a.y = o.base();
      a.y_tok_stride = rows;
      a.tokens = 2;
      if (swiglu) a.x_up = dup.as<float>(), a.swiglu_limit = 2.5f;
      if (!matvec_quantizes_activations(a)) continue;
      ASSERT_EQ(one_token_bits(a, o), "") << rows << " x " << cols << (swiglu ? " over a SwiGLU" : "");
    }
  }
  const size_t rows = 40, cols = 1024, mats = 5;
  Matrix w = random_matrix(type, rows * mats, cols, rng), w2 = random_matrix(type, rows * mats, cols, rng);
  const std::vector<int32_t> ids = {4, 1, 0, 4, -1, 3};
  const uint32_t k = 2, groups = 6;
  DeviceBuffer dids = to_device(ids);
  const auto x = normal(8 * groups * cols, rng), up = normal(8 * groups * cols, rng, 2.0f);
  DeviceBuffer dx = to_device(x), dup = to_device(up);
  Outputs o(8 * (3 * rows + 37 + 3 * rows) + 2 * groups * 8 * rows);
  float* const arena = o.base();
  MatvecArgs a;
  a.w = w.m.slice_rows(0, rows);
  a.w_group_bytes = w.m.row_bytes * rows;
  a.w_group_index = dids.as<int32_t>();
  a.skip_negative_index = true;
  a.x = dx.as<float>();
  a.x_tok_stride = cols;
  a.x_group_stride = 8 * cols;
  a.x_group_div = k;
  a.y = arena;
  a.y_tok_stride = rows;
  a.y_group_stride = 8 * rows;
  a.groups = groups;
  a.tokens = 2;
  ASSERT_EQ(one_token_bits(a, o), "") << "experts by index";
  MatvecArgs s = a;
  s.x_up = dup.as<float>();
  s.swiglu_limit = 2.5f;
  ASSERT_EQ(one_token_bits(s, o), "") << "experts by index over a SwiGLU";
  MatvecArgs sp = s;
  sp.parts = 2;
  sp.more[0] = {w2.m.data, nullptr, arena + groups * 8 * rows, dx.as<float>() + 8 * cols, 3 * rows, 3 * rows,
                dup.as<float>() + 8 * cols, true};
  ASSERT_EQ(one_token_bits(sp, o), "") << "a single part beside experts";
  // Every group of one x (one row's routed gate and up, walked flat), a second part of its own rows.
  MatvecArgs fl = a;
  fl.x_group_stride = 0;
  fl.skip_negative_index = false;
  fl.w_group_index = nullptr;
  fl.groups = mats;
  fl.parts = 2;
  fl.more[0] = {w2.m.data, nullptr, arena + groups * 8 * rows, nullptr, 0, 0};
  ASSERT_EQ(one_token_bits(fl, o), "") << "one x for every group";
  MatvecArgs gu;
  gu.w = w.m.slice_rows(0, 3 * rows);
  gu.x = dx.as<float>();
  gu.x_tok_stride = cols;
  gu.y = arena;
  gu.y_tok_stride = 3 * rows;
  gu.tokens = 2;
  gu.parts = 3;
  gu.more[0] = {w.m.data + 3 * rows * w.m.row_bytes, nullptr, arena + 8 * 3 * rows, nullptr, 37, 37};
  gu.more[1] = {w2.m.data, nullptr, arena + 8 * 3 * rows + 8 * 37, dx.as<float>() + 8 * cols, 2 * rows, 0};
  ASSERT_EQ(one_token_bits(gu, o), "") << "parts";
}

// Timing lines: an output-head-sized matrix (154,880 x 4,096, 357 MB), a KDA projection's 8,192 x
// 4,096 (18.9 MB) and 4,096 x 2,048 (an expert's down, 4.7 MB); 1 and 2 tokens, both kernels; GB/s of weights read against the copy bandwidth (read + write).
// Printed, not asserted; the outputs of the two kernels are compared as above.
TEST_F(MatvecMmaTest, TimingLines) {
  const GgmlType type = GgmlType::Q4_K;
  int dev = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  const double copy = measure_copy_bandwidth(dev, 256ull << 20, 5);
  std::printf("[ timing ] copy bandwidth %.0f GB/s\n", copy / 1e9);
  auto time_us = [](const MatvecArgs& r, Kernel k, int reps) {
    for (int i = 0; i < 3; ++i) launch(r, k);
    cudaEvent_t e0, e1;
    EXPECT_EQ(cudaEventCreate(&e0), cudaSuccess);
    EXPECT_EQ(cudaEventCreate(&e1), cudaSuccess);
    EXPECT_EQ(cudaEventRecord(e0), cudaSuccess);
    for (int i = 0; i < reps; ++i) launch(r, k);
    EXPECT_EQ(cudaEventRecord(e1), cudaSuccess);
    EXPECT_EQ(cudaEventSynchronize(e1), cudaSuccess);
    float ms = 0;
    EXPECT_EQ(cudaEventElapsedTime(&ms, e0, e1), cudaSuccess);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return 1e3 * ms / reps;
  };
  for (const auto& [rows, cols] : {std::pair<size_t, size_t>{154880, 4096}, {8192, 4096}, {4096, 2048}}) {
    const size_t row_bytes = *model::ggml_bytes(type, cols), bytes = rows * row_bytes;
    DeviceBuffer dw = to_device(random_q4k_blocks(rows, cols));
    std::mt19937 rng(3);
    const auto x = normal(2 * cols, rng);
    DeviceBuffer dx = to_device(x);
    for (uint32_t tokens : {1u, 2u}) {
      MatvecArgs a;
      a.w = {type, dw.as<uint8_t>(), static_cast<uint32_t>(rows), static_cast<uint32_t>(cols), row_bytes};
      a.x = dx.as<float>();
      a.x_tok_stride = cols;
      Outputs o(tokens * rows);
      a.y = o.base();
      a.y_tok_stride = rows;
      a.tokens = tokens;
      ASSERT_EQ(diff_kernels(a, o), "") << rows << " x " << cols << ", " << tokens << " tokens";
      DeviceBuffer y(o.floats() * 4);
      const MatvecArgs r = rebased(a, o, y.as<float>());
      const int reps = rows > 100000 ? 20 : 200;
      const double us[2] = {time_us(r, Kernel::mma, reps), time_us(r, Kernel::dp2a, reps)};
      const double gbs_mma = bytes / us[0] / 1e3, gbs_dp2a = bytes / us[1] / 1e3;
      const std::string name(model::ggml_type_traits(type).name);
      std::printf("[ timing ] %s %zu x %zu, %u tok: mma %.1f us %.0f GB/s %.0f%% of copy; dp2a %.1f us %.0f GB/s %.0f%%\n",
                  name.c_str(), rows, cols, tokens, us[0], gbs_mma, 100.0 * gbs_mma / (copy / 1e9),
                  us[1], gbs_dp2a, 100.0 * gbs_dp2a / (copy / 1e9));
    }
  }
}

}  // namespace
}  // namespace ferry::gpu
#endif
