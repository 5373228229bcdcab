#include "actors/step_planner.hpp"

#include <algorithm>

namespace ferry::actors {
namespace {

double ms_between(TimePoint from, TimePoint to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

bool is_prefix(const std::vector<int32_t>& prefix, const std::vector<int32_t>& of) {
  return prefix.size() <= of.size() && std::equal(prefix.begin(), prefix.end(), of.begin());
}

}  // namespace

RequestId event_request(const EngineEvent& e) {
  return std::visit([](const auto& x) { return x.id; }, e);
}

StepPlanner::StepPlanner(PlannerLimits limits)
    : limits_(limits), slots_(limits.slots), checkpoints_(limits.checkpoints) {}

EngineEvents StepPlanner::reject(const GenerateRequest& request, EndCause cause, std::string message,
                                 TimePoint now) {
  Live live;  // never stored: a rejected request was not live
  live.request.id = request.id;
  live.request.prompt.resize(request.prompt.size());  // usage reports the prompt's length only
  live.submitted = now;
  return {finish(live, RequestStatus::rejected, cause, std::move(message), now)};
}

EngineEvents StepPlanner::submit(GenerateRequest request, TimePoint now) {
  const size_t prompt = request.prompt.size();
  if (failed_) return reject(request, EndCause::backend_failed, "the backend failed: " + failure_, now);
  if (draining_) return reject(request, EndCause::draining, "the server is shutting down", now);
  if (request.id == 0 || live_.count(request.id) != 0) {
    return reject(request, EndCause::invalid_request, "request id 0 or already in use", now);
  }
  if (prompt == 0) return reject(request, EndCause::invalid_request, "the prompt has no tokens", now);
  if (limits_.vocab_size != 0) {
    for (size_t i = 0; i < prompt; ++i) {
      const int32_t t = request.prompt[i];
      if (t < 0 || static_cast<uint32_t>(t) >= limits_.vocab_size) {
        return reject(request, EndCause::invalid_request,
                      "prompt token " + std::to_string(i) + " = " + std::to_string(t) +
                          " is outside the vocabulary [0, " + std::to_string(limits_.vocab_size) + ")",
                      now);
      }
    }
  }
  if (request.max_tokens == 0) request.max_tokens = 1;
  if (prompt + request.max_tokens > limits_.ctx) {
    return reject(request, EndCause::too_long,
                  "prompt of " + std::to_string(prompt) + " tokens + max_tokens " +
                      std::to_string(request.max_tokens) + " exceeds the context of " +
                      std::to_string(limits_.ctx) + " tokens",
                  now);
  }
  // Idle slots count as room: while a step is in flight nothing is admitted, and a burst must not
  // find the queue full with slots still free (slots + queue_limit requests get in, no fewer).
  const auto idle = static_cast<size_t>(std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.request == 0; }));
  if (queue_.size() >= limits_.queue_limit + idle) {
    return reject(request, EndCause::queue_full,
                  "the queue is full (" + std::to_string(queue_.size() - std::min(queue_.size(), idle)) +
                      " requests waiting)",
                  now);
  }
  const RequestId id = request.id;
  Live& live = live_[id];
  live.request = std::move(request);
  live.submitted = now;
  queue_.push_back(id);
  return {};
}

EngineEvents StepPlanner::cancel(const CancelRequest& cancel, TimePoint now) {
  auto it = live_.find(cancel.id);
  if (it == live_.end()) return {};  // unknown or already ended: a no-op (STYLE rule 9)
  Live& live = it->second;
  if (live.status == RequestStatus::queued) {
    queue_.erase(std::find(queue_.begin(), queue_.end(), cancel.id));
  }
  std::string message;
  switch (cancel.cause) {
    case EndCause::client_cancelled: message = "cancelled by the client"; break;
    case EndCause::admin_cancelled: message = "cancelled by an administrator"; break;
    case EndCause::drain_deadline: message = "the server shut down before the request finished"; break;
    default: break;
  }
  // A stop string matched by the bridge is a normal stop; the engine only learns it late.
  const RequestStatus status =
      cancel.cause == EndCause::stop_string ? RequestStatus::finished_stop : RequestStatus::cancelled;
  return {end(cancel.id, status, cancel.cause, std::move(message), now)};
}

std::pair<ReleaseResult, EngineEvents> StepPlanner::release(uint32_t slot, TimePoint now) {
  ReleaseResult result;
  EngineEvents events;
  if (slot >= slots_.size()) {
    result.message = "slot " + std::to_string(slot) + " does not exist (slots are 0.." +
                     std::to_string(slots_.size() - 1) + ")";
    return {result, events};
  }
  if (const RequestId running = slots_[slot].request; running != 0) {
    events = cancel(CancelRequest{running, EndCause::admin_cancelled}, now);
    result.cancelled = running;
  }
  slots_[slot].held.clear();
  slots_[slot].needs_reset = false;
  pending_resets_.push_back(slot);
  checkpoints_.release_slot(slot);
  result.ok = true;
  return {result, events};
}

uint32_t StepPlanner::choose_slot(const std::vector<int32_t>& prompt, bool reuse_prefix) const {
  // Longest held sequence that the prompt extends (at least one prompt token must remain to compute
  // the first token's logits); else an empty slot; else the least recently used idle one.
  int best = -1;
  size_t best_len = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (!reuse_prefix) break;
    if (s.request != 0 || s.needs_reset || s.held.empty() || s.held.size() >= prompt.size()) continue;
    if (s.held.size() > best_len && is_prefix(s.held, prompt)) {
      best = static_cast<int>(i);
      best_len = s.held.size();
    }
  }
  if (best >= 0) return static_cast<uint32_t>(best);
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].request == 0 && slots_[i].held.empty()) return static_cast<uint32_t>(i);
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].request != 0) continue;
    if (best < 0 || slots_[i].last_used < slots_[static_cast<size_t>(best)].last_used) best = static_cast<int>(i);
  }
  return static_cast<uint32_t>(best);
}

uint32_t StepPlanner::restore_checkpoint(Live& live, uint32_t chosen) {
  const std::vector<int32_t>& prompt = live.request.prompt;
  const Slot& c = slots_[chosen];
  const size_t held = !c.needs_reset && c.held.size() < prompt.size() && is_prefix(c.held, prompt) ? c.held.size() : 0;
  const std::optional<kv::CheckpointMatch> m = checkpoints_.match(prompt);
  if (!m || m->tokens <= held) return chosen;
  // Into the slot it was taken in when that one is idle (a later step may find its rows there),
  // else into the chosen one; its rows come with it either way.
  const uint32_t index = m->slot < slots_.size() && slots_[m->slot].request == 0 ? m->slot : chosen;
  Slot& slot = slots_[index];
  slot.held.assign(prompt.begin(), prompt.begin() + m->tokens);
  slot.needs_reset = false;
  checkpoints_.restore(index, *m);
  return index;
}

void StepPlanner::admit_queued(TimePoint now, EngineEvents& events) {
  auto has_idle = [&] {
    return std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.request == 0; });
  };
  while (!queue_.empty() && has_idle()) {
    Live& live = live_.at(queue_.front());
    queue_.pop_front();
    uint32_t index = choose_slot(live.request.prompt, live.request.reuse_prefix);
    if (live.request.reuse_prefix) index = restore_checkpoint(live, index);
    Slot& slot = slots_[index];
    if (slot.needs_reset || !live.request.reuse_prefix || !is_prefix(slot.held, live.request.prompt) ||
        slot.held.size() >= live.request.prompt.size()) {
        checkpoints_.replace_rows(index);
      slot.held.clear();
      slot.needs_reset = false;
      pending_resets_.push_back(index);
    }
    slot.request = live.request.id;
    slot.last_used = ++use_counter_;
    live.slot = static_cast<int>(index);
    live.status = RequestStatus::prefilling;
    live.prefilled = live.cached = static_cast<uint32_t>(slot.held.size());
    live.admitted_seq = next_admitted_seq_++;
    live.started = now;
    metrics_.queue_seconds.observe(ms_between(live.submitted, now) / 1000.0);
    metrics_.cached_tokens += live.cached;
    events.emplace_back(std::in_place_type<RequestStarted>, live.request.id, index, live.cached);
  }
}

std::optional<StepPlan> StepPlanner::plan(TimePoint now, EngineEvents& events) {
  if (failed_ || in_flight_.size() >= std::max<uint32_t>(1, limits_.max_in_flight)) return std::nullopt;
  admit_queued(now, events);
  StepPlan plan;
  plan.step = next_step_;
  std::sort(pending_resets_.begin(), pending_resets_.end());
  pending_resets_.erase(std::unique(pending_resets_.begin(), pending_resets_.end()), pending_resets_.end());
  plan.reset_slots = std::move(pending_resets_);
  pending_resets_.clear();

  // The decoding slots free to go, those that waited longest first; a group is at most
  // ceil(decoding / micro_batches) of them.
  Live* prefill = nullptr;
  std::vector<std::pair<uint64_t, uint32_t>> ready;  // (last step, slot)
  size_t decoding = 0;
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].request == 0) continue;
    Live& live = live_.at(slots_[i].request);
    if (live.status == RequestStatus::prefilling) {
      if (!live.in_flight && (prefill == nullptr || live.admitted_seq < prefill->admitted_seq)) prefill = &live;
      continue;
    }
    ++decoding;
    if (!live.in_flight) ready.emplace_back(live.last_step, i);
  }
  const uint32_t groups = std::max<uint32_t>(1, limits_.micro_batches);
  const size_t group = (decoding + groups - 1) / groups;
  std::sort(ready.begin(), ready.end());
  if (ready.size() > group) ready.resize(group);
  std::sort(ready.begin(), ready.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  InFlightStep step;
  step.planned = now;
  step.alone = in_flight_.empty();
  for (const auto& [last, i] : ready) {
    Slot& slot = slots_[i];
    Live& live = live_.at(slot.request);
    if (live.spec) {
      model::SlotRows row = live.spec->rows(i, live.request.sampling, drafts_for(limits_.mtp, live.spec->counts(), decoding, measured_costs()));
      slot.held.resize(row.start);
      slot.held.insert(slot.held.end(), row.tokens.begin(), row.tokens.end());
      step.rows.push_back(InFlightRow{i, live.request.id, 0, true, row});
      plan.rows.push_back(std::move(row));
      continue;
    }
    model::SlotRows row;
    row.slot = i;
    row.start = static_cast<uint32_t>(slot.held.size());
    row.tokens = {live.generated.back()};
    row.sampling = live.request.sampling;
    slot.held.push_back(live.generated.back());
    plan.rows.push_back(std::move(row));
    step.rows.push_back(InFlightRow{i, live.request.id, 0, true, std::nullopt});
  }
  if (prefill != nullptr) {
    const auto index = static_cast<uint32_t>(prefill->slot);
    Slot& slot = slots_[index];
    const auto& prompt = prefill->request.prompt;
    const uint32_t n = checkpoints_.chunk_end(prefill->prefilled, static_cast<uint32_t>(prompt.size()),
                                              limits_.prefill_chunk) -
                       prefill->prefilled;
    model::SlotRows row;
    row.slot = index;
    row.start = prefill->prefilled;
    row.tokens.assign(prompt.begin() + prefill->prefilled, prompt.begin() + prefill->prefilled + n);
    row.sample = prefill->prefilled + n == prompt.size();
    row.sampling = prefill->request.sampling;
    // The prompt's last chunk asks for the first drafts.
    if (row.sample) row.draft = drafts_for(limits_.mtp, {}, decoding + 1, measured_costs());
    slot.held.insert(slot.held.end(), row.tokens.begin(), row.tokens.end());
    step.rows.push_back(InFlightRow{index, prefill->request.id, n, row.sample, std::nullopt});
    plan.rows.push_back(std::move(row));
  }
  checkpoints_.fill(plan);
  if (plan.rows.empty() && plan.reset_slots.empty() && plan.save_checkpoints.empty() &&
      plan.restore_checkpoints.empty() && plan.drop_checkpoints.empty()) {
    return std::nullopt;
  }
  for (const InFlightRow& row : step.rows) {
    Live& live = live_.at(row.request);
    live.in_flight = true;
    live.last_step = plan.step;
  }
  in_flight_.emplace(plan.step, std::move(step));
  ++next_step_;
  return plan;
}

void StepPlanner::mark_landed(const std::vector<InFlightRow>& rows) {
  for (const InFlightRow& row : rows) {
    auto it = live_.find(row.request);
    if (it != live_.end()) it->second.in_flight = false;
  }
}

// A decode-only step that ran alone: its time by its rows (a verify set's drafts included), what
// --mtp auto weighs drafts by.
void StepPlanner::record_cost(const InFlightStep& step, TimePoint now) {
  if (!step.alone || step.rows.empty()) return;
  uint32_t rows = 0;
  for (const InFlightRow& row : step.rows) {
    if (row.prompt_tokens > 0) return;
    rows += row.spec ? static_cast<uint32_t>(row.spec->tokens.size()) : 1;
  }
  costs_.record(rows, ms_between(step.planned, now));
}

EngineEvents StepPlanner::apply(const StepOutcome& outcome, TimePoint now) {
  auto found = in_flight_.find(outcome.step);
  if (found == in_flight_.end()) return {};  // not ours: ignore
  const InFlightStep step = std::move(found->second);
  in_flight_.erase(found);
  mark_landed(step.rows);
  if (!outcome.error.empty()) return fail_step(outcome.step, step.rows, outcome.error, outcome.stage_dead, now);
  size_t expected = 0;
  for (const InFlightRow& row : step.rows) expected += row.sample ? 1 : 0;
  if (outcome.sampled.size() != expected) {
    return fail_step(outcome.step, step.rows,
                     "the backend returned " + std::to_string(outcome.sampled.size()) + " tokens for " +
                         std::to_string(expected) + " sampling rows",
                     true, now);
  }
  size_t k = 0;
  for (const InFlightRow& row : step.rows) {
    if (row.sample && outcome.sampled[k++].slot != row.slot) {
      return fail_step(outcome.step, step.rows, "the backend returned tokens out of row order", true, now);
    }
  }
  checkpoints_.landed(outcome.step, true, outcome.unsaved_checkpoints);
  ++metrics_.steps;
  metrics_.step_seconds.observe(ms_between(step.planned, now) / 1000.0);
  record_cost(step, now);
  EngineEvents events;
  k = 0;
  for (const InFlightRow& row : step.rows) {
    const SampledToken* result = row.sample ? &outcome.sampled[k++] : nullptr;
    if (row.spec && result->accepted < row.spec->verify) {
      slots_[row.slot].held.resize(row.spec->start);  // the stages go back there with the next rows
    }
    auto it = live_.find(row.request);
    if (it == live_.end() || it->second.slot != static_cast<int>(row.slot)) continue;  // cancelled meanwhile
    Live& live = it->second;
    if (row.prompt_tokens > 0) {
      live.prefilled += row.prompt_tokens;
      metrics_.prompt_tokens += row.prompt_tokens;
      if (live.prefilled == live.request.prompt.size()) live.status = RequestStatus::decoding;
      const auto& prompt = live.request.prompt;
      if (live.request.reuse_prefix && checkpoints_.boundary(live.prefilled, static_cast<uint32_t>(prompt.size()))) {
        checkpoints_.want(row.slot, {prompt.begin(), prompt.begin() + live.prefilled});
      }
    }
    if (row.spec) {
      take_spec(live, row, *result, now, events);
    } else if (row.sample) {
      const bool first = live.generated.empty();
      take_token(live, result->token, now, events);
      if (first && limits_.mtp.enabled && live_.count(row.request) != 0) {
        live.spec.emplace(live.prefilled, result->token, result->drafts);
      }
    }
  }
  return events;
}

void StepPlanner::take_spec(Live& live, const InFlightRow& row, const SampledToken& result, TimePoint now,
                            EngineEvents& events) {
  model::SlotResult r;
  r.slot = result.slot;
  r.sampled = result.token;
  r.accepted = result.accepted;
  r.drafts = result.drafts;
  const model::SpecCounts before = live.spec->counts();
  const std::vector<int32_t> tokens = live.spec->apply(*row.spec, r);
  metrics_.draft_tokens += live.spec->counts().drafted - before.drafted;
  metrics_.accepted_tokens += live.spec->counts().accepted - before.accepted;
  const RequestId id = live.request.id;
  for (int32_t t : tokens) {
    take_token(live, t, now, events);
    if (live_.count(id) == 0) return;  // it ended: the rest are not its tokens
  }
}

void StepPlanner::take_token(Live& live, int32_t token, TimePoint now, EngineEvents& events) {
  if (token < 0 || (limits_.vocab_size != 0 && static_cast<uint32_t>(token) >= limits_.vocab_size)) {
    events.push_back(end(live.request.id, RequestStatus::failed, EndCause::backend_failed,
                         "the backend drew token id " + std::to_string(token) + " outside the vocabulary", now));
    return;
  }
  if (live.generated.empty()) {
    live.first_token = now;
    metrics_.ttft_seconds.observe(ms_between(live.submitted, now) / 1000.0);
  } else {
    metrics_.itl_seconds.observe(ms_between(live.last_token, now) / 1000.0);
  }
  live.last_token = now;
  live.generated.push_back(token);
  ++metrics_.generated_tokens;
  events.push_back(TokensGenerated{live.request.id, {token}});
  const auto& stops = live.request.stop_token_ids;
  const size_t n = live.generated.size();
  const bool stop = n >= live.request.min_tokens && std::find(stops.begin(), stops.end(), token) != stops.end();
  const bool length = n >= live.request.max_tokens || live.request.prompt.size() + n >= limits_.ctx;
  // The end of generation: the slot holds prompt + answer but its last token, which the next turn
  // (the answer appended) extends.
  if ((stop || length) && live.request.reuse_prefix) {
    checkpoints_.want(static_cast<uint32_t>(live.slot), slots_[static_cast<size_t>(live.slot)].held);
  }
  if (stop) {
    events.push_back(end(live.request.id, RequestStatus::finished_stop, EndCause::none, {}, now));
  } else if (length) {
    events.push_back(end(live.request.id, RequestStatus::finished_length, EndCause::none, {}, now));
  }
}

EngineEvents StepPlanner::fail_step(uint64_t step, const std::vector<InFlightRow>& rows, const std::string& error,
                                    bool fatal, TimePoint now) {
  EngineEvents events;
  checkpoints_.landed(step, false);
  // The stages that ran the step advanced these slots and the others did not: their state is unknown.
  for (const InFlightRow& row : rows) {
    slots_[row.slot].needs_reset = true;
    checkpoints_.lost_rows(row.slot);
    if (live_.count(row.request) == 0) continue;
    events.push_back(end(row.request, RequestStatus::failed, EndCause::backend_failed, "the backend failed: " + error, now));
  }
  if (!fatal) return events;
  failed_ = true;
  failure_ = error;
  // Nothing else can run on a failed stage: end the waiting and the running requests too.
  std::vector<RequestId> rest;
  for (const auto& [id, live] : live_) rest.push_back(id);
  std::sort(rest.begin(), rest.end());
  for (RequestId id : rest) {
    Live& live = live_.at(id);
    const RequestStatus status =
        live.status == RequestStatus::queued ? RequestStatus::rejected : RequestStatus::failed;
    if (live.status == RequestStatus::queued) queue_.erase(std::find(queue_.begin(), queue_.end(), id));
    events.push_back(end(id, status, EndCause::backend_failed, "the backend failed: " + error, now));
  }
  return events;
}

EngineEvents StepPlanner::cancel_all(EndCause cause, TimePoint now) {
  std::vector<RequestId> ids;
  for (const auto& [id, live] : live_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  EngineEvents events;
  for (RequestId id : ids) {
    EngineEvents one = cancel(CancelRequest{id, cause}, now);
    events.insert(events.end(), one.begin(), one.end());
  }
  return events;
}

RequestFinished StepPlanner::finish(Live& live, RequestStatus status, EndCause cause, std::string message,
                                    TimePoint now) {
  RequestFinished done;
  done.id = live.request.id;
  done.status = status;
  done.cause = cause;
  done.message = std::move(message);
  done.usage.prompt_tokens = static_cast<uint32_t>(live.request.prompt.size());
  done.usage.cached_tokens = live.cached;
  done.usage.completion_tokens = static_cast<uint32_t>(live.generated.size());
  if (live.slot >= 0) {
    done.timings.queue_ms = ms_between(live.submitted, live.started);
    if (!live.generated.empty()) {
      done.timings.prompt_ms = ms_between(live.started, live.first_token);
      done.timings.predicted_ms = ms_between(live.first_token, live.last_token);
      done.timings.ttft_ms = ms_between(live.submitted, live.first_token);
      if (live.spec) {
        done.timings.draft_n = static_cast<uint32_t>(live.spec->counts().drafted);
        done.timings.draft_n_accepted = static_cast<uint32_t>(live.spec->counts().accepted);
      }
    } else {
      done.timings.prompt_ms = ms_between(live.started, now);
    }
    Slot& slot = slots_[static_cast<size_t>(live.slot)];
    slot.request = 0;
    slot.last_used = ++use_counter_;
  } else {
    done.timings.queue_ms = ms_between(live.submitted, now);
  }
  ++metrics_.finished_by_status[static_cast<size_t>(status)];
  return done;
}

RequestFinished StepPlanner::end(RequestId id, RequestStatus status, EndCause cause, std::string message,
                                 TimePoint now) {
  auto it = live_.find(id);
  RequestFinished done = finish(it->second, status, cause, std::move(message), now);
  live_.erase(it);
  return done;
}

std::optional<RequestStatus> StepPlanner::status(RequestId id) const {
  const auto it = live_.find(id);
  if (it == live_.end()) return std::nullopt;
  return it->second.status;
}

EngineSnapshot StepPlanner::snapshot() const {
  EngineSnapshot s;
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    const Slot& slot = slots_[i];
    SlotSnapshot out;
    out.index = i;
    out.held_tokens = static_cast<uint32_t>(slot.held.size());
    if (slot.request != 0) {
      const Live& live = live_.at(slot.request);
      out.busy = true;
      out.status = live.status;
      out.request = slot.request;
      out.prompt_tokens = static_cast<uint32_t>(live.request.prompt.size());
      out.prefilled_tokens = live.prefilled;
      out.cached_tokens = live.cached;
      out.generated_tokens = static_cast<uint32_t>(live.generated.size());
      if (!live.generated.empty()) out.decode_ms = ms_between(live.first_token, live.last_token);
    }
    s.slots.push_back(out);
  }
  s.queued = static_cast<uint32_t>(queue_.size());
  s.queued_requests.assign(queue_.begin(), queue_.end());
  s.queue_limit = limits_.queue_limit;
  s.draining = draining_;
  s.failed = failed_;
  s.failure = failure_;
  s.steps = metrics_.steps;
  s.prompt_tokens = metrics_.prompt_tokens;
  s.cached_tokens = metrics_.cached_tokens;
  s.generated_tokens = metrics_.generated_tokens;
  s.draft_tokens = metrics_.draft_tokens;
  s.accepted_tokens = metrics_.accepted_tokens;
  s.finished_by_status = metrics_.finished_by_status;
  s.step_seconds = metrics_.step_seconds.snapshot();
  s.ttft_seconds = metrics_.ttft_seconds.snapshot();
  s.itl_seconds = metrics_.itl_seconds.snapshot();
  s.queue_seconds = metrics_.queue_seconds.snapshot();
  return s;
}

}  // namespace ferry::actors
