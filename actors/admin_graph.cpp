#include "actors/admin_graph.hpp"

namespace ferry::actors {

void AdminGraph::note_actor(const ActorReport& report) {
  if (report.ended) {
    if (report.kind == ActorKind::bridge) {
      finished_.emplace_back(++rev_, report);
      if (finished_.size() > limits_.finished) finished_.pop_front();
    }
    forget(report.name);
    return;
  }
  auto it = actors_.find(report.name);
  if (it != actors_.end() && it->second.report == report) return;  // nothing new
  Entry& e = actors_[report.name];
  e.report = report;
  e.rev = ++rev_;
}

void AdminGraph::forget(const std::string& name) {
  if (actors_.erase(name) == 0) return;
  removed_.emplace_back(++rev_, name);
  if (removed_.size() > limits_.removed) {
    removed_floor_ = removed_.front().first;
    removed_.pop_front();
  }
}

void AdminGraph::note(const ActorReport& report, Clock::time_point) { note_actor(report); }

void AdminGraph::note(const ActorReport& report, const EngineSnapshot& engine, Clock::time_point now) {
  note_actor(report);
  if (!(engine == engine_)) {
    engine_ = engine;
    engine_rev_ = ++rev_;
  }
  samples_.push_back(Sample{now, engine.generated_tokens, engine.prompt_tokens});
  // Keep one sample at or before the start of the window: the rate's base.
  while (samples_.size() > 2 && samples_[1].at <= now - limits_.throughput_window) samples_.pop_front();
}

void AdminGraph::note(const ActorReport& report, const StageStatus& stage, Clock::time_point) {
  note_actor(report);
  auto it = stage_entries_.find(stage.index);
  if (it != stage_entries_.end() && it->second.view.status == stage) return;
  StageEntry& e = stage_entries_[stage.index];
  const StageStatus& prev = e.view.status;
  if (it != stage_entries_.end() && stage.steps > prev.steps) {
    e.view.step_ms = (stage.compute_ms - prev.compute_ms) / static_cast<double>(stage.steps - prev.steps);
  }
  e.view.status = stage;
  e.rev = ++rev_;
}

ThroughputSample AdminGraph::throughput(Clock::time_point now) const {
  ThroughputSample t;
  if (samples_.empty()) return t;
  const Sample& latest = samples_.back();
  // The counters as a step function of time: their value a window ago is the last sample at or
  // before then; with no sample that old, the oldest one, over the time since it.
  const Clock::time_point from = now - limits_.throughput_window;
  const Sample* base = &samples_.front();
  for (const Sample& s : samples_) {
    if (s.at <= from) base = &s;
  }
  const Clock::time_point base_at = base->at <= from ? from : base->at;
  const double seconds = std::chrono::duration<double>(now - base_at).count();
  if (seconds <= 0) return t;
  t.generated_per_s = static_cast<double>(latest.generated - base->generated) / seconds;
  t.prompt_per_s = static_cast<double>(latest.prompt - base->prompt) / seconds;
  return t;
}

AdminView AdminGraph::view(uint64_t since, Clock::time_point now) const {
  AdminView v;
  v.rev = rev_;
  v.full = since == 0 || since < removed_floor_ || since > rev_;
  v.since = v.full ? 0 : since;
  const uint64_t after = v.since;
  for (const auto& [name, e] : actors_) {
    if (e.rev > after) v.actors.push_back(e.report);
  }
  if (!v.full) {
    for (const auto& [rev, name] : removed_) {
      if (rev > after) v.removed.push_back(name);
    }
  }
  v.engine_changed = engine_rev_ > after || (v.full && engine_rev_ > 0);
  if (v.engine_changed) v.engine = engine_;
  for (const auto& [index, e] : stage_entries_) {
    if (e.rev > after) v.stages.push_back(e.view);
  }
  for (const auto& [rev, report] : finished_) {
    if (rev > after) v.finished.push_back(report);
  }
  v.throughput = throughput(now);
  return v;
}

}  // namespace ferry::actors
