#include "actors/checkpoint_planner.hpp"

#include <algorithm>

namespace ferry::actors {

CheckpointPlanner::CheckpointPlanner(CheckpointLimits limits)
    : limits_(limits), cache_(limits.budget_bytes, limits.block_tokens) {
  limits_.every = std::max<uint32_t>(1, limits_.every);
}

std::optional<kv::CheckpointMatch> CheckpointPlanner::match(std::span<const int32_t> prompt) const {
  if (!enabled() || prompt.size() < 2) return std::nullopt;
  return cache_.longest_match(prompt, static_cast<uint32_t>(prompt.size() - 1));
}

void CheckpointPlanner::restore(uint32_t slot, const kv::CheckpointMatch& m) {
  cache_.acquire(m.id);
  cache_.touch(m.id);
  queued_restores_.push_back(CheckpointOp{m.id, slot});
}

uint32_t CheckpointPlanner::chunk_end(uint32_t at, uint32_t n, uint32_t chunk) const {
  uint32_t end = std::min(n, at + chunk);
  if (!enabled()) return end;
  const uint32_t next_every = (at / limits_.every + 1) * limits_.every;
  if (next_every < end) end = next_every;
  if (at < n - 1 && n - 1 >= limits_.block_tokens && n - 1 < end) end = n - 1;
  return end;
}

bool CheckpointPlanner::boundary(uint32_t tokens, uint32_t n) const {
  return enabled() && tokens >= limits_.block_tokens && tokens < n && (tokens % limits_.every == 0 || tokens == n - 1);
}

void CheckpointPlanner::want(uint32_t slot, std::vector<int32_t> tokens) {
  if (!enabled() || tokens.size() < limits_.block_tokens) return;
  forget_queued(slot);  // a later state of the slot supersedes an unsent one
  queued_saves_.emplace_back(slot, std::move(tokens));
}

void CheckpointPlanner::forget_queued(uint32_t slot) {
  std::erase_if(queued_saves_, [slot](const auto& q) { return q.first == slot; });
}

void CheckpointPlanner::release_slot(uint32_t slot) {
  forget_queued(slot);
  for (kv::CheckpointId id : cache_.erase_slot(slot)) queued_drops_.push_back(id);
}

void CheckpointPlanner::fill(StepPlan& plan) {
  Carried carried;
  for (auto& [slot, tokens] : queued_saves_) {
    const uint64_t bytes = limits_.fixed_bytes + limits_.token_bytes * tokens.size();
    auto in = cache_.insert(std::move(tokens), slot, bytes);
    if (!in) continue;  // already cached, or no room: the allocator answers, nothing is taken
    queued_drops_.insert(queued_drops_.end(), in->evicted.begin(), in->evicted.end());
    plan.save_checkpoints.push_back(CheckpointOp{in->id, slot});
    carried.saves.push_back(in->id);
  }
  queued_saves_.clear();
  for (const CheckpointOp& op : queued_restores_) carried.restores.push_back(op.id);
  plan.restore_checkpoints = std::move(queued_restores_);
  queued_restores_.clear();
  plan.drop_checkpoints = std::move(queued_drops_);
  queued_drops_.clear();
  if (!carried.saves.empty() || !carried.restores.empty()) carried_.emplace(plan.step, std::move(carried));
}

void CheckpointPlanner::landed(uint64_t step, bool ok) {
  auto it = carried_.find(step);
  if (it == carried_.end()) return;
  for (kv::CheckpointId id : it->second.saves) {
    if (ok) {
      cache_.ready(id);
    } else if (cache_.erase(id)) {
      queued_drops_.push_back(id);  // the stages before the failing one may hold it
    }
  }
  for (kv::CheckpointId id : it->second.restores) cache_.release(id);
  carried_.erase(it);
}

}  // namespace ferry::actors
