// Programmatic Dependent Launch in the decode graphs (gpu/pdl.hpp): a CUDA stage on a random Q4_K
// model decodes two slots at depth > 0 with PDL on and off (and with the decode branches on and off:
// gpu/stream_branch.hpp), and every step's logits are the same bits; where the build and device have
// PDL the captured graphs hold programmatic edges, elsewhere (the Volta build's PTX, pre-sm90
// devices) none. A captured chain of norms and int16 matvecs, each
// reading the previous kernel's output and overwriting what the one before read, gives the same bits
// both ways, and prints its replay time both ways (not asserted).
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/cuda_stage.hpp"
#include "gpu/kernels.hpp"
#include "gpu/pdl.hpp"
#include "model/glm5/glm5_weights.hpp"
#include "model/pipeline.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/gpu/quant_rows.hpp"
#include "tests/model/random_model.hpp"

namespace ferry::gpu {
namespace {

using ferry::testing::have_device;
using model::GgmlType;
using model::Pipeline;
using model::SlotRows;

// PDL edges are expected exactly where this build and device have the instructions.
bool pdl_expected() { return pdl_env_allows() && pdl_device_ready(); }

std::unique_ptr<Pipeline> stage(const model::Glm5Weights& w, bool pdl, bool branches) {
  CudaStageOptions o;
  o.max_slots = 2;
  o.max_context = 256;
  o.max_step_rows = 64;
  o.pdl = pdl;
  o.decode_branches = branches;
  auto s = CudaStage::from_weights(w, {0, w.hparams().n_layers}, o);
  EXPECT_TRUE(s) << (s ? "" : s.error().message);
  if (!s) return nullptr;
  std::vector<std::shared_ptr<model::Stage>> stages{std::move(s.value())};
  auto p = Pipeline::make(std::move(stages));
  EXPECT_TRUE(p) << (p ? "" : p.error().message);
  return p ? std::move(p.value()) : nullptr;
}

int32_t argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// What a pipeline gave: the greedy tokens of its graphed steps, the logits of a last eager step
// after them, its decode graphs and their programmatic edges (all, and the two-row graph's).
struct Decoded {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
  size_t graphs = 0, edges = 0, two_row_edges = 0;
};

// The prompt's two parts (20 and 21 tokens) prefilled into slots 0 and 1, then 10 greedy steps of
// both slots' rows (eager, captured, then replayed: a graphed step returns its tokens only), then 6
// of slot 0 alone (a second shape), then one step of both that returns logits (eager): its logits
// read the KV and state every graphed step wrote, so they hold those steps to the bit.
Decoded decode(const model::Glm5Weights& w, const std::vector<int32_t>& prompt, bool pdl, bool branches) {
  Decoded d;
  auto p = stage(w, pdl, branches);
  if (!p) return d;
  int32_t next[2];
  uint32_t pos[2];
  for (uint32_t s = 0; s < 2; ++s) {
    const std::vector<int32_t> half(prompt.begin() + 20 * s, prompt.begin() + 20 * s + 20 + s);
    auto r = p->step({SlotRows{s, 0, half, false, false, {}}});
    EXPECT_TRUE(r) << r.error().message;
    if (!r) return d;
    next[s] = argmax(r.value()[0].logits);
    pos[s] = static_cast<uint32_t>(half.size());
  }
  auto step = [&](uint32_t slots) {
    std::vector<SlotRows> rows;
    for (uint32_t s = 0; s < slots; ++s) rows.push_back(SlotRows{s, pos[s]++, {next[s]}, false, true, {}});
    auto r = p->step(rows);
    EXPECT_TRUE(r) << r.error().message;
    for (uint32_t s = 0; s < slots && r; ++s) {
      next[s] = r.value()[s].sampled;
      d.tokens.push_back(next[s]);
    }
  };
  for (int i = 0; i < 10; ++i) step(2);
  auto* cs = dynamic_cast<CudaStage*>(p->stages()[0].get());
  EXPECT_NE(cs, nullptr);
  if (cs == nullptr) return d;
  d.two_row_edges = cs->decode_graph_pdl_edges();
  for (int i = 0; i < 6; ++i) step(1);
  auto r = p->step({SlotRows{0, pos[0], {next[0]}, false, false, {}}, SlotRows{1, pos[1], {next[1]}, false, false, {}}});
  EXPECT_TRUE(r) << r.error().message;
  if (!r) return d;
  for (uint32_t s = 0; s < 2; ++s) d.logits.push_back(r.value()[s].logits);
  d.graphs = cs->decode_graphs();
  d.edges = cs->decode_graph_pdl_edges();
  return d;
}

// The same tokens, and the same logits bit for bit.
void expect_same(const Decoded& a, const Decoded& b, uint32_t vocab, const char* what) {
  EXPECT_EQ(b.tokens, a.tokens) << what << " changed the greedy tokens of the graphed steps";
  ASSERT_EQ(a.logits.size(), 2u);
  ASSERT_EQ(b.logits.size(), 2u);
  for (uint32_t s = 0; s < 2; ++s) {
    ASSERT_EQ(a.logits[s].size(), vocab) << "slot " << s;
    ASSERT_EQ(b.logits[s].size(), vocab) << "slot " << s;
    EXPECT_EQ(std::memcmp(a.logits[s].data(), b.logits[s].data(), vocab * sizeof(float)), 0)
        << "slot " << s << ": the logits after the graphed steps differ with " << what;
  }
}

// The random Q4_K model of the tests below, its file removed with it, and a prompt.
struct RandomModel {
  model::Glm5Hparams hp = ferry::testing::tiny_gpu_shape(256);  // rows of 256: the int16 matvecs
  std::string path;
  std::unique_ptr<model::Glm5Weights> w;
  std::vector<int32_t> prompt = std::vector<int32_t>(41);

  explicit RandomModel(const char* name) : path(testing::temp_model_path(name)) {
    hp.kda_head_dim = 32;  // a warp a head: the recurrence and its norm in one launch where built for sm90
    EXPECT_TRUE(hp.validate().empty());
    EXPECT_TRUE(testing::write_random_model(hp, GgmlType::Q4_K, path, 23));
    auto loaded = model::Glm5Weights::load(path);
    EXPECT_TRUE(loaded) << (loaded ? "" : loaded.error().message);
    if (loaded) w = std::move(loaded.value());
    std::mt19937 rng(3);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(hp.vocab_size) - 1);
    for (int32_t& t : prompt) t = tok(rng);
  }
  ~RandomModel() { std::filesystem::remove(path); }
};

TEST(PdlTest, DecodeGraphsGiveTheSameLogitsWithAndWithout) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  RandomModel m("pdl_test_q4_k");
  ASSERT_TRUE(m.w);
  const Decoded off = decode(*m.w, m.prompt, false, true), on = decode(*m.w, m.prompt, true, true);
  expect_same(off, on, m.hp.vocab_size, "PDL");
  EXPECT_EQ(off.graphs, 2u);  // two shapes: two rows in two segments, then one row
  EXPECT_EQ(on.graphs, 2u);
  EXPECT_EQ(off.edges, 0u);
  if (pdl_expected()) {
    EXPECT_GT(on.edges, 0u) << "PDL is available but the captured graph has no programmatic edges";
  } else {
    EXPECT_EQ(on.edges, 0u) << "programmatic edges where the build or device has no PDL";
  }
  std::cout << "decode graphs: " << on.edges << " programmatic edges with PDL (" << on.two_row_edges
            << " in the two-row graph; " << (pdl_expected() ? "" : "not ") << "available here)\n";
}

// The decode steps' branches (CudaStageOptions::decode_branches: the sites' comb, KDA's q/k/v and
// convolution, the DSA indexer beside the chain) change no bit, with PDL as the stages have it.
TEST(PdlTest, DecodeBranchesGiveTheSameLogitsAsOneChain) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  RandomModel m("branch_test_q4_k");
  ASSERT_TRUE(m.w);
  const Decoded chain = decode(*m.w, m.prompt, true, false), branches = decode(*m.w, m.prompt, true, true);
  expect_same(chain, branches, m.hp.vocab_size, "the decode branches");
  EXPECT_EQ(branches.graphs, 2u);
}

// `links` times: an int16 Q4_K matvec of x into y, then y's RMS norm back into x.
struct Chain {
  static constexpr uint32_t kN = 2048, kLinks = 32;
  DeviceBuffer w, x, y;
  DevMatrix m;
  std::vector<float> x0;

  Chain() {
    std::mt19937 rng(9);
    const std::vector<uint8_t> q = ferry::testing::random_rows(GgmlType::Q4_K, kN, kN, rng);
    w = DeviceBuffer(q.size());
    EXPECT_EQ(cudaMemcpy(w.get(), q.data(), q.size(), cudaMemcpyHostToDevice), cudaSuccess);
    m.type = GgmlType::Q4_K;
    m.rows = kN;
    m.cols = kN;
    m.row_bytes = q.size() / kN;
    m.data = static_cast<const uint8_t*>(w.get());
    std::normal_distribution<float> n(0.0f, 1.0f);
    x0.resize(kN);
    for (float& v : x0) v = n(rng);
    x = DeviceBuffer(kN * 4);
    y = DeviceBuffer(kN * 4);
  }
  void reset() { EXPECT_EQ(cudaMemcpy(x.get(), x0.data(), kN * 4, cudaMemcpyHostToDevice), cudaSuccess); }
  void enqueue(cudaStream_t s) {
    for (uint32_t i = 0; i < kLinks; ++i) {
      MatvecArgs a;
      a.w = m;
      a.x = x.as<float>();
      a.x_tok_stride = kN;
      a.y = y.as<float>();
      a.y_tok_stride = kN;
      matvec(a, s);
      rms_norm(y.as<float>(), kN, nullptr, 1, kN, 1e-6f, x.as<float>(), kN, s);
    }
  }
  std::vector<float> result() const {
    std::vector<float> v(kN);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(v.data(), x.get(), kN * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};

TEST(PdlTest, CapturedMatvecChainGivesTheSameBitsAndTimingLine) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  Chain c;
  Stream stream;
  c.reset();
  c.enqueue(stream.get());  // eager: settles the kernels' attributes before any capture
  const std::vector<float> eager = c.result();
  std::vector<float> out[2];
  float us[2] = {};
  size_t edges[2] = {};
  for (int on = 0; on < 2; ++on) {
    GraphExec g;
    ASSERT_EQ(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
    {
      PdlScope pdl(on == 1);
      c.enqueue(stream.get());
    }
    g.end_capture(stream.get(), &edges[on]);
    c.reset();
    g.launch(stream.get());
    out[on] = c.result();
    // The median of 20 event-timed replays (each replay starts from the previous one's x: the
    // timing does not need the first input).
    Event e0, e1;
    std::vector<float> times;
    for (int r = 0; r < 20; ++r) {
      e0.record(stream.get());
      g.launch(stream.get());
      e1.record(stream.get());
      ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
      float ms = 0;
      ASSERT_EQ(cudaEventElapsedTime(&ms, e0.get(), e1.get()), cudaSuccess);
      times.push_back(1000.0f * ms);
    }
    std::nth_element(times.begin(), times.begin() + 10, times.end());
    us[on] = times[10];
  }
  for (int on = 0; on < 2; ++on) {
    ASSERT_EQ(out[on].size(), eager.size());
    EXPECT_EQ(std::memcmp(out[on].data(), eager.data(), eager.size() * sizeof(float)), 0)
        << (on ? "with" : "without") << " PDL: the chain's result differs from the eager run";
  }
  EXPECT_EQ(edges[0], 0u);
  if (pdl_device_ready()) {  // a PdlScope of its own: FERRY_PDL is the stages' switch
    EXPECT_EQ(edges[1], size_t{Chain::kLinks - 1});  // into every matvec after a norm (norms launch plainly)
  } else {
    EXPECT_EQ(edges[1], 0u);
  }
  std::cout << "graph replay of " << Chain::kLinks << " x (Q4_K int16 matvec " << Chain::kN << "x" << Chain::kN
            << " + rms_norm): " << us[0] << " us without PDL, " << us[1] << " us with (" << edges[1]
            << " programmatic edges), " << us[0] / Chain::kLinks << " / " << us[1] / Chain::kLinks
            << " us a link\n";
}

}  // namespace
}  // namespace ferry::gpu
#endif
