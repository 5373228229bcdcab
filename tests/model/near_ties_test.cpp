// The near-tie judge (tests/model/near_ties.hpp) on the CPU, where both runs can be made here: int8
// DSA rows against f32 ones flip choices only at near-ties by the f32 run's margins and differ by
// little on every other row; a router bias moved by a real amount is caught as no near-tie.
#include "tests/model/near_ties.hpp"

#include <gtest/gtest.h>

#include <random>

#include "model/cpu/sampler.hpp"
#include "tests/model/random_model.hpp"

namespace ferry::testing {
namespace {

constexpr float kEps = 2e-3f;

struct Fixture {
  model::Glm5Hparams hp;
  std::filesystem::path path;
  std::unique_ptr<model::Glm5Weights> weights;
  std::vector<int32_t> prompt;
  Fixture() {
    hp = five_layer_hparams();
    hp.hidden_size = 256;
    hp.n_nextn_layers = 0;
    path = temp_model_path("near_ties_test");
    EXPECT_TRUE(write_random_model(hp, model::GgmlType::Q4_K, path, 11));
    auto w = model::Glm5Weights::load(path);
    EXPECT_TRUE(w) << w.error().message;
    weights = std::move(w.value());
    std::mt19937 rng(5);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(hp.vocab_size) - 1);
    for (int i = 0; i < 150; ++i) prompt.push_back(tok(rng));
  }
  ~Fixture() { std::filesystem::remove(path); }

  std::vector<float> run(config::KvFormats kv, size_t chunk, std::vector<RefChoices>& choices) {
    model::ThreadPool pool(2);
    model::Glm5Forward f(*weights, pool);
    model::SequenceState state(hp, kv);
    return cpu_choices(*weights, f, state, prompt, chunk, choices);
  }
};

double row_delta(const std::vector<float>& a, const std::vector<float>& b, size_t r, size_t V) {
  double m = 0;
  for (size_t i = 0; i < V; ++i) m = std::max(m, std::abs(double(a[r * V + i]) - b[r * V + i]));
  return m;
}

// eps and the bar per row format: about half and 1.4x of the largest logit delta measured on rows
// without a flip (f16: 0.005, int8: 0.036); int8 flips a layer-1 selection here (before a KDA layer:
// every later row is downstream), f16 flips nothing.
TEST(NearTies, CompactLatentRowsFlipOnlyNearTiesAndAgreeElsewhere) {
  Fixture fx;
  ASSERT_TRUE(fx.weights);
  std::vector<RefChoices> ref;
  const std::vector<float> a = fx.run({}, 40, ref);
  struct Case {
    config::KvType type;
    float eps;
    double bar;
  };
  for (const Case& c : {Case{config::KvType::f16, kEps, 0.01}, Case{config::KvType::int8, 0.02f, 0.05}}) {
    const std::string name(config::kv_type_name(c.type));
    std::vector<RefChoices> other;
    const std::vector<float> b = fx.run({c.type, config::KvType::f32}, 1, other);
    const NearTieVerdict v = judge_near_ties(fx.hp, ref, std::vector<RowChoices>(other.begin(), other.end()), c.eps);
    EXPECT_EQ(v.failure, "") << name;
    EXPECT_LE(v.flipped.size(), 3u) << name;
    const size_t V = fx.hp.vocab_size;
    double tight = 0;
    size_t judged = 0;
    for (size_t r = 0; r < fx.prompt.size(); ++r) {
      if (v.flipped.count(r) || v.downstream.count(r)) continue;
      tight = std::max(tight, row_delta(a, b, r, V));
      ++judged;
    }
    std::cout << name << " rows: " << v.flipped.size() << " flipped, " << v.downstream.size()
              << " downstream, max|delta| " << tight << " on the other " << judged << "\n";
    EXPECT_LE(tight, c.bar) << name;
  }
}

TEST(NearTies, AMovedRouterBiasIsNoNearTie) {
  Fixture fx;
  ASSERT_TRUE(fx.weights);
  std::vector<RefChoices> ref, other;
  fx.run({}, 40, ref);
  // Expert 0 of layer 2 made 0.3 more attractive: rows where it was not chosen now choose it.
  fx.weights->layers[2].router_bias[0] += 0.3f;
  fx.run({}, 40, other);
  const NearTieVerdict v = judge_near_ties(fx.hp, ref, std::vector<RowChoices>(other.begin(), other.end()), kEps);
  EXPECT_NE(v.failure.find("routed experts"), std::string::npos) << v.failure;
}

TEST(NearTies, DownstreamRowsAreTheReadersOfAFlippedRow) {
  model::Glm5Hparams hp = five_layer_hparams();  // KDA 0, 2; DSA 1, 3 (full), 4 (shared); kpool 4
  std::vector<RefChoices> ref(12);
  std::vector<RowChoices> run(12);
  for (size_t r = 0; r < 12; ++r) {
    for (uint32_t il : {1u, 3u}) {
      ref[r].pools[il] = run[r].pools[il] = {0};
      ref[r].pool_margin[il] = 1.0f;
    }
  }
  // Row 5's layer-3 selection flips at a margin of 1e-4: layer 4 reads row 5's changed rows.
  run[5].pools[3] = {1};
  ref[5].pool_margin[3] = 1e-4f;
  run[9].pools[3] = {0, 1};  // reads pool 1 (rows 4..7) in layers 3 and 4, as row 5's agrees
  ref[9].pools[3] = {0, 1};
  const NearTieVerdict v = judge_near_ties(hp, ref, run, kEps);
  EXPECT_EQ(v.failure, "");
  EXPECT_EQ(v.flipped, (std::set<size_t>{5}));
  EXPECT_EQ(v.downstream, (std::set<size_t>{6, 9}));  // 6: row 5 is in its tail (4..6); 9: its pools
  // The same flip at a margin above eps is a failure naming the row and layer.
  ref[5].pool_margin[3] = 0.01f;
  EXPECT_NE(judge_near_ties(hp, ref, run, kEps).failure.find("row 5 layer 3"), std::string::npos);
  // A flip in layer 1 reaches every later row through the KDA layer after it.
  ref[5].pool_margin[3] = 1e-4f;
  run[5].pools[3] = {0};
  run[5].pools[1] = {1};
  ref[5].pool_margin[1] = 1e-4f;
  EXPECT_EQ(judge_near_ties(hp, ref, run, kEps).downstream.size(), 6u);
}

}  // namespace
}  // namespace ferry::testing
