#include "model/expert_policy.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace ferry::model {
namespace {

constexpr const char* kCountsHeader = "ferry expert route counts v1";

}  // namespace

ExpertPolicy::ExpertPolicy(uint32_t n_layers, uint32_t experts, std::vector<std::vector<uint32_t>> stage_layers,
                           std::vector<uint32_t> pool_slots, uint32_t host_slots, ExpertPolicyOptions options)
    : n_layers_(n_layers),
      experts_(experts),
      stage_layers_(std::move(stage_layers)),
      pool_slots_(std::move(pool_slots)),
      host_slots_(host_slots),
      opt_(options),
      score_(size_t{n_layers} * experts, 0.0),
      pool_of_(score_.size(), -1),
      host_of_(score_.size(), -1),
      pooled_at_(score_.size(), 0),
      moving_(stage_layers_.size(), 0) {}

Status ExpertPolicy::save_counts(const std::filesystem::path& file) const {
  std::ofstream out(file, std::ios::trunc);
  out << kCountsHeader << ' ' << n_layers_ << ' ' << experts_ << '\n';
  for (uint32_t l = 0; l < n_layers_; ++l) {
    for (uint32_t e = 0; e < experts_; ++e) out << (e ? " " : "") << score_[size_t{l} * experts_ + e];
    out << '\n';
  }
  if (!out) return Error(ErrorCode::io, "cannot write the expert route counts to " + file.string());
  return std::nullopt;
}

Status ExpertPolicy::load_counts(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) return Error(ErrorCode::io, "cannot read the expert route counts in " + file.string());
  std::string header;
  std::getline(in, header);
  std::istringstream h(header);
  std::string a, b, c, d, v;
  uint32_t layers = 0, experts = 0;
  h >> a >> b >> c >> d >> v >> layers >> experts;
  if (a + ' ' + b + ' ' + c + ' ' + d + ' ' + v != kCountsHeader || layers != n_layers_ || experts != experts_) {
    return Error(file.string() + ": not route counts of this model (expected '" + kCountsHeader + " " +
                 std::to_string(n_layers_) + " " + std::to_string(experts_) + "', found '" + header + "')");
  }
  std::vector<double> scores(score_.size());
  for (double& x : scores) {
    if (!(in >> x) || !(x >= 0)) return Error(file.string() + ": a count is missing or not a non-negative number");
  }
  score_ = std::move(scores);
  return std::nullopt;
}

ExpertPlacement ExpertPolicy::place() {
  ExpertPlacement p;
  p.pooled.resize(stage_layers_.size());
  std::fill(pool_of_.begin(), pool_of_.end(), -1);
  std::fill(host_of_.begin(), host_of_.end(), -1);
  std::vector<size_t> shadow_candidates;  // pooled experts, least likely to stay first
  for (size_t s = 0; s < stage_layers_.size(); ++s) {
    std::vector<size_t> mine;
    for (uint32_t l : stage_layers_[s]) {
      for (uint32_t e = 0; e < experts_; ++e) mine.push_back(size_t{l} * experts_ + e);
    }
    // Most routed first; among equals, expert e of every layer before expert e + 1: an even spread.
    std::sort(mine.begin(), mine.end(), [&](size_t x, size_t y) {
      if (score_[x] != score_[y]) return score_[x] > score_[y];
      return std::pair(x % experts_, x / experts_) < std::pair(y % experts_, y / experts_);
    });
    const size_t n = std::min<size_t>(pool_slots_[s], mine.size());
    for (size_t i = 0; i < mine.size(); ++i) {
      if (i < n) {
        pool_of_[mine[i]] = static_cast<int32_t>(s);
        pooled_at_[mine[i]] = ++clock_;
        p.pooled[s].push_back(id_of(mine[i]));
      }
    }
    for (size_t i = n; i-- > 0;) shadow_candidates.push_back(mine[i]);
  }
  // Host slots: first every expert no pool holds (of the pooled stages), then shadow copies.
  int64_t next = 0;
  for (size_t s = 0; s < stage_layers_.size(); ++s) {
    for (uint32_t l : stage_layers_[s]) {
      for (uint32_t e = 0; e < experts_; ++e) {
        const size_t i = size_t{l} * experts_ + e;
        if (pool_of_[i] < 0 && next < host_slots_) host_of_[i] = next++;
      }
    }
  }
  // Keep one slot free so that a first eviction always has somewhere to go.
  for (size_t i : shadow_candidates) {
    if (next + 1 >= host_slots_) break;
    host_of_[i] = next++;
  }
  free_host_.clear();
  for (int64_t slot = host_slots_; slot-- > next;) free_host_.push_back(slot);
  p.host_slot = host_of_;
  return p;
}

void ExpertPolicy::observe(uint32_t stage, const RouteCounts& counts) {
  for (uint32_t l : stage_layers_.at(stage)) {
    for (uint32_t e = 0; e < experts_; ++e) score_[size_t{l} * experts_ + e] *= opt_.decay;
  }
  for (size_t i = 0; i < counts.layers.size(); ++i) {
    const uint32_t l = counts.layers[i];
    if (l >= n_layers_) continue;
    for (uint32_t e = 0; e < std::min(experts_, counts.experts); ++e) {
      score_[size_t{l} * experts_ + e] += counts.counts[i * counts.experts + e];
    }
  }
}

std::optional<int64_t> ExpertPolicy::take_host_slot(const std::vector<ExpertMove>& planned) {
  if (!free_host_.empty()) {
    const int64_t slot = free_host_.back();
    free_host_.pop_back();
    return slot;
  }
  // The shadow copy of the expert pooled longest ago, of no move in progress.
  std::optional<size_t> oldest;
  for (size_t i = 0; i < score_.size(); ++i) {
    if (pool_of_[i] < 0 || host_of_[i] < 0 || moving_[static_cast<size_t>(pool_of_[i])] > 0) continue;
    const ExpertId id = id_of(i);
    const bool in_plan = std::any_of(planned.begin(), planned.end(),
                                     [&](const ExpertMove& m) { return m.promote == id || m.evict == id; });
    if (!in_plan && (!oldest || pooled_at_[i] < pooled_at_[*oldest])) oldest = i;
  }
  if (!oldest) return std::nullopt;
  const int64_t slot = host_of_[*oldest];
  host_of_[*oldest] = -1;
  return slot;
}

std::vector<ExpertMove> ExpertPolicy::propose(uint32_t stage) {
  std::vector<ExpertMove> moves;
  if (moving_.at(stage) > 0) return moves;
  std::vector<size_t> outside, inside;
  for (uint32_t l : stage_layers_[stage]) {
    for (uint32_t e = 0; e < experts_; ++e) {
      const size_t i = size_t{l} * experts_ + e;
      (pool_of_[i] == static_cast<int32_t>(stage) ? inside : outside).push_back(i);
    }
  }
  std::sort(outside.begin(), outside.end(), [&](size_t a, size_t b) { return score_[a] > score_[b]; });
  std::sort(inside.begin(), inside.end(), [&](size_t a, size_t b) { return score_[a] < score_[b]; });
  for (size_t k = 0; k < std::min({outside.size(), inside.size(), size_t{opt_.moves_per_report}}); ++k) {
    const double hot = score_[outside[k]], cold = score_[inside[k]];
    if (hot < opt_.min_score || hot <= cold * (1.0 + opt_.margin)) break;
    ExpertMove m;
    m.promote = id_of(outside[k]);
    m.promote_host = static_cast<uint32_t>(host_of_[outside[k]]);
    m.evict = id_of(inside[k]);
    if (host_of_[inside[k]] < 0) {
      const std::optional<int64_t> slot = take_host_slot(moves);
      if (!slot) break;
      m.evict_host = static_cast<uint32_t>(*slot);
      m.copy_evicted = true;
    } else {
      m.evict_host = static_cast<uint32_t>(host_of_[inside[k]]);
    }
    moves.push_back(m);
  }
  moving_[stage] = static_cast<uint32_t>(moves.size());
  return moves;
}

void ExpertPolicy::finished(uint32_t stage, const std::vector<ExpertMove>& moves) {
  for (const ExpertMove& m : moves) {
    const size_t in = index(m.promote), out = index(m.evict);
    pool_of_[in] = static_cast<int32_t>(stage);
    pooled_at_[in] = ++clock_;
    pool_of_[out] = -1;
    host_of_[out] = m.evict_host;
  }
  moving_.at(stage) -= std::min<uint32_t>(moving_.at(stage), static_cast<uint32_t>(moves.size()));
}

}  // namespace ferry::model
