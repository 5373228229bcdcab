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
  const auto it = unspilled_.find(m.id);
  const bool rows_here = it != unspilled_.end() && it->second == slot;
  if (it != unspilled_.end() && !rows_here) {
    queued_changes_.push_back(RowChange{it->second, 0, true});  // copied out; that slot keeps its rows
  }
  queued_changes_.push_back(rows_here ? RowChange{slot, m.tokens, false} : RowChange{slot, 0, true});
  cache_.acquire(m.id);
  cache_.touch(m.id);
  queued_restores_.push_back(CheckpointOp{m.id, slot});
}

void CheckpointPlanner::replace_rows(uint32_t slot) {
  if (enabled()) queued_changes_.push_back(RowChange{slot, 0, true});
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

void CheckpointPlanner::erase(kv::CheckpointId id, StepPlan* plan) {
  unspilled_.erase(id);
  if (!cache_.erase(id)) return;
  // One saved in this very plan is simply not saved (its drop would run before the save).
  if (plan != nullptr) {
    auto& saves = plan->save_checkpoints;
    const auto at = std::find_if(saves.begin(), saves.end(), [id](const CheckpointOp& op) { return op.id == id; });
    if (at != saves.end()) {
      saves.erase(at);
      return;
    }
  }
  queued_drops_.push_back(id);
}

void CheckpointPlanner::lost_rows(uint32_t slot) {
  forget_queued(slot);
  std::vector<kv::CheckpointId> lost;
  for (const auto& [id, s] : unspilled_) {
    if (s == slot) lost.push_back(id);
  }
  for (kv::CheckpointId id : lost) erase(id, nullptr);
}

void CheckpointPlanner::release_slot(uint32_t slot) {
  forget_queued(slot);
  std::erase_if(queued_changes_, [slot](const RowChange& c) { return c.slot == slot; });
  for (kv::CheckpointId id : cache_.erase_slot(slot)) {
    unspilled_.erase(id);
    queued_drops_.push_back(id);
  }
}

void CheckpointPlanner::apply(const RowChange& change, StepPlan& plan, Carried& carried) {
  std::vector<kv::CheckpointId> past;
  for (const auto& [id, s] : unspilled_) {
    const kv::CheckpointInfo* info = cache_.find(id);
    if (s == change.slot && info != nullptr && info->tokens > change.keep) past.push_back(id);
  }
  if (!change.spill) {
    // Dropped past the cut, but for those a restore holds (in this plan or in flight): their rows are
    // copied out instead. A save not yet landed holds one reference of its own and is dropped (the
    // drop reaches each stage after the save).
    std::vector<kv::CheckpointId> held;
    for (kv::CheckpointId id : past) {
      const kv::CheckpointInfo* info = cache_.find(id);
      if (info->refs > (info->ready ? 0u : 1u)) {
        held.push_back(id);
      } else {
        erase(id, &plan);
      }
    }
    past = std::move(held);
  }
  if (past.empty()) return;
  for (kv::CheckpointId id : past) unspilled_.erase(id);
  carried.spills.insert(carried.spills.end(), past.begin(), past.end());
  plan.spill_checkpoints.push_back(CheckpointSpill{change.slot, std::move(past)});
}

void CheckpointPlanner::fill(StepPlan& plan) {
  Carried carried;
  for (auto& [slot, tokens] : queued_saves_) {
    const uint64_t bytes = limits_.fixed_bytes + limits_.token_bytes * tokens.size();
    const auto count = static_cast<uint32_t>(tokens.size());
    auto in = cache_.insert(std::move(tokens), slot, bytes);
    if (!in) continue;  // already cached, or no room: the allocator answers, nothing is taken
    for (kv::CheckpointId id : in->evicted) {
      unspilled_.erase(id);
      queued_drops_.push_back(id);
    }
    unspilled_[in->id] = slot;
    plan.save_checkpoints.push_back(CheckpointOp{in->id, slot, count});
  }
  queued_saves_.clear();
  for (const RowChange& change : queued_changes_) apply(change, plan, carried);
  queued_changes_.clear();
  for (const CheckpointOp& op : plan.save_checkpoints) carried.saves.push_back(op.id);
  for (const CheckpointOp& op : queued_restores_) carried.restores.push_back(op.id);
  plan.restore_checkpoints = std::move(queued_restores_);
  queued_restores_.clear();
  plan.drop_checkpoints = std::move(queued_drops_);
  queued_drops_.clear();
  if (!carried.saves.empty() || !carried.restores.empty() || !carried.spills.empty()) {
    carried_.emplace(plan.step, std::move(carried));
  }
}

void CheckpointPlanner::landed(uint64_t step, bool ok, std::span<const uint64_t> unsaved) {
  auto it = carried_.find(step);
  if (it == carried_.end()) return;
  for (kv::CheckpointId id : it->second.saves) {
    if (ok && std::find(unsaved.begin(), unsaved.end(), id) == unsaved.end()) {
      cache_.ready(id);
    } else {
      erase(id, nullptr);  // the stages before the failing one may hold it
    }
  }
  if (!ok) {
    for (kv::CheckpointId id : it->second.spills) erase(id, nullptr);  // rows on some stages only
  }
  for (kv::CheckpointId id : it->second.restores) cache_.release(id);
  carried_.erase(it);
}

}  // namespace ferry::actors
