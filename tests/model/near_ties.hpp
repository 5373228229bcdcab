#pragma once
// Two runs of one model that differ by rounding (another backend, another KV row format) agree on
// every row's logits within a bound, except where the rounding flips one of the model's discrete
// choices: a DSA indexer's pool selection or a MoE router's experts. Such a flip is legitimate only
// at a near-tie by the reference's own scores; the row that flips then differs by a lot, and rows
// that read its changed KV rows by more than the rounding. This header finds the flips of a run
// against the reference, checks that each is a near-tie, and names the rows downstream of one, so
// that a test can judge every other row by the tight bound (and fail on a real regression).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "model/cpu/glm5_forward.hpp"
#include "model/cpu/moe.hpp"
#include "model/glm5/glm5_hparams.hpp"

namespace ferry::testing {

// One row's choices, by layer: pools of each full-indexer DSA layer, experts of each MoE layer.
struct RowChoices {
  std::map<uint32_t, std::set<uint32_t>> pools, experts;
};

// The reference's choices with the margins that decided them (the deciding gap; infinite: no cut).
struct RefChoices : RowChoices {
  std::map<uint32_t, float> pool_margin, expert_margin;
};

// How close a token's routing is to choosing other experts by model::route_token's rule: the smaller
// of the gaps between the last kept group and the first dropped one (group scores) and between the
// k-th and (k+1)-th expert of the kept groups (choice scores).
inline float route_margin(const model::RouterConfig& c, const float* logits, const float* bias) {
  auto cut_gap = [](std::vector<float> v, uint32_t n) {
    if (n == 0 || n >= v.size()) return std::numeric_limits<float>::infinity();
    std::sort(v.begin(), v.end(), [](float a, float b) { return a > b; });
    return std::isfinite(v[n]) ? v[n - 1] - v[n] : std::numeric_limits<float>::infinity();
  };
  const uint32_t n = c.n_experts;
  std::vector<float> choice(n);
  for (uint32_t e = 0; e < n; ++e) choice[e] = model::sigmoid(logits[e]) + bias[e];
  float margin = std::numeric_limits<float>::infinity();
  if (c.n_group > 1 && c.topk_group < c.n_group) {
    const uint32_t per = n / c.n_group;
    std::vector<float> score(c.n_group);
    for (uint32_t g = 0; g < c.n_group; ++g) {
      std::vector<float> in(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      std::sort(in.begin(), in.end(), [](float a, float b) { return a > b; });
      score[g] = in[0] + (per > 1 ? in[1] : -INFINITY);
    }
    margin = cut_gap(score, c.topk_group);
    std::vector<uint32_t> order(c.n_group);
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return score[a] > score[b]; });
    std::vector<bool> kept(c.n_group, false);
    for (uint32_t i = 0; i < c.topk_group; ++i) kept[order[i]] = true;
    for (uint32_t e = 0; e < n; ++e) {
      if (!kept[e / per]) choice[e] = -INFINITY;
    }
  }
  return std::min(margin, cut_gap(choice, c.n_used));
}

struct NearTieVerdict {
  std::set<size_t> flipped;     // rows whose own choice flipped at a near-tie
  std::set<size_t> downstream;  // later rows that read a changed row's state (they may flip too)
  std::string failure;          // a flip that is no near-tie (empty: none)
};

// Row r's choices in `run` against `ref` (both indexed by position), layer by layer in the order the
// model makes them (a layer's selection, then its routes). A row's first differing choice must have
// a reference margin below `eps` unless the row is downstream; its later choices follow from it and
// are not compared. A changed row's state differs from its flip's layer on, so a later row is
// downstream when it attends to a changed row in a later DSA layer (its pools, a shared layer's its
// indexer layer's; the tail), or when a KDA layer (recurrent: every later row) comes after the flip.
inline NearTieVerdict judge_near_ties(const model::Glm5Hparams& hp, const std::vector<RefChoices>& ref,
                                      const std::vector<RowChoices>& run, float eps) {
  NearTieVerdict v;
  const uint32_t kp = hp.index_kpool;
  std::vector<std::pair<size_t, uint32_t>> changed;  // (row, the layer of its first differing choice)
  auto reads = [&](size_t r, size_t f, uint32_t layer) {
    bool kda_after = false, dsa_after = false;
    for (uint32_t il = layer + 1; il < hp.n_layers; ++il) {
      kda_after |= hp.layer_kinds[il] == model::LayerKind::kda;
      dsa_after |= hp.layer_kinds[il] == model::LayerKind::dsa;
    }
    if (kda_after || (dsa_after && hp.index_select_tail && f >= (r + 1) / kp * kp)) return true;
    const std::set<uint32_t>* pools = nullptr;  // the selection a DSA layer uses (a shared layer's inherited)
    for (uint32_t il = 0; il < hp.n_layers; ++il) {
      if (hp.layer_kinds[il] != model::LayerKind::dsa) continue;
      const auto p = run[r].pools.find(il);
      if (p != run[r].pools.end()) pools = &p->second;
      if (il > layer && pools != nullptr && pools->count(static_cast<uint32_t>(f / kp)) > 0) return true;
    }
    return false;
  };
  for (size_t r = 0; r < ref.size() && r < run.size() && v.failure.empty(); ++r) {
    bool down = false;
    for (const auto& [f, layer] : changed) down = down || reads(r, f, layer);
    if (down) v.downstream.insert(r);
    for (uint32_t il = 0; il < hp.n_layers; ++il) {
      auto differs = [&](const std::map<uint32_t, std::set<uint32_t>>& a, const std::map<uint32_t, std::set<uint32_t>>& b,
                         const std::map<uint32_t, float>& margins, const char* what) {
        const auto ia = a.find(il), ib = b.find(il);
        if (ia == a.end() && ib == b.end()) return false;
        if (ia != a.end() && ib != b.end() && ia->second == ib->second) return false;
        const auto m = margins.find(il);
        if (!down && (ia == a.end() || ib == b.end() || m == margins.end() || !(m->second < eps))) {
          std::ostringstream o;
          o << "row " << r << " layer " << il << ": the " << what << " differ at a reference margin of "
            << (m == margins.end() ? std::string("(none)") : std::to_string(m->second)) << " (a near-tie is below "
            << eps << ")";
          v.failure = o.str();
        }
        return true;
      };
      if (differs(ref[r].pools, run[r].pools, ref[r].pool_margin, "selected pools") ||
          differs(ref[r].experts, run[r].experts, ref[r].expert_margin, "routed experts")) {
        if (!down) v.flipped.insert(r);
        changed.emplace_back(r, il);
        break;
      }
    }
  }
  return v;
}

// The CPU's logits [rows][vocab] and choices with their margins for `tokens` run in chunks of
// `chunk` from position 0 of `state`: the reference the judge above compares against.
inline std::vector<float> cpu_choices(const model::Glm5Weights& w, model::Glm5Forward& f, model::SequenceState& state,
                                      const std::vector<int32_t>& tokens, size_t chunk, std::vector<RefChoices>& out) {
  const model::Glm5Hparams& hp = f.hparams();
  const model::RouterConfig rc{hp.n_experts, hp.n_experts_used, hp.n_group, hp.topk_group, hp.norm_topk_prob,
                               hp.routed_scaling};
  out.assign(tokens.size(), {});
  std::vector<float> logits(tokens.size() * hp.vocab_size), hidden;
  size_t start = 0;
  const model::SelectionObserver sel = [&](uint32_t layer, size_t, uint32_t pos, std::span<const uint32_t> pools,
                                           float margin) {
    if (layer >= hp.n_layers || !w.layers[layer].has_indexer) return;  // a shared layer: its indexer layer's
    out[pos].pools[layer] = std::set<uint32_t>(pools.begin(), pools.end());
    out[pos].pool_margin[layer] = margin;
  };
  const model::RouteObserver routes = [&](uint32_t layer, std::span<const float> lg) {
    const float* bias = w.layers[layer].router_bias.data();
    for (size_t r = 0; r * hp.n_experts < lg.size(); ++r) {
      std::vector<uint32_t> ids(hp.n_experts_used);
      std::vector<float> weights(hp.n_experts_used);
      model::route_token(rc, lg.data() + r * hp.n_experts, bias, ids.data(), weights.data());
      out[start + r].experts[layer] = std::set<uint32_t>(ids.begin(), ids.end());
      out[start + r].expert_margin[layer] = route_margin(rc, lg.data() + r * hp.n_experts, bias);
    }
  };
  model::ForwardOptions opt;
  opt.selections = &sel;
  opt.routes = &routes;
  for (; start < tokens.size(); start += chunk) {
    const size_t n = std::min(chunk, tokens.size() - start);
    const model::ForwardRows rows{&state, std::span<const int32_t>(tokens.data() + start, n)};
    f.forward(std::span<const model::ForwardRows>(&rows, 1), hidden, opt);
    f.logits(hidden.data(), n, logits.data() + start * hp.vocab_size);
  }
  return logits;
}

}  // namespace ferry::testing
