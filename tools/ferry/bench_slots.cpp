#include "tools/ferry/bench_slots.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <chrono>
#include <random>

#include "actors/bootstrap.hpp"

namespace ferry::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct Arrivals {
  std::vector<double> times;  // seconds since `base`, one per token, in order
  std::string failure;
};

// The sink of one request: notes when each token arrives, then hands the list to `done`.
actors::request_sink_actor::behavior_type sink(actors::request_sink_actor::stateful_pointer<Arrivals> self,
                                               caf::actor done, uint32_t index, Clock::time_point base) {
  return {
      [](const actors::RequestStarted&) {},
      [self, base](const actors::TokensGenerated& t) {
        const double now = std::chrono::duration<double>(Clock::now() - base).count();
        for (size_t i = 0; i < t.tokens.size(); ++i) self->state.times.push_back(now);
      },
      [self, done, index](const actors::RequestFinished& f) {
        if (f.status != actors::RequestStatus::finished_length) {
          self->state.failure = "request " + std::to_string(index) + " ended " +
                                std::string(actors::status_name(f.status)) + ": " + f.message;
        }
        caf::anon_send(done, index, self->state.times, self->state.failure);
        self->quit();
      },
  };
}

}  // namespace

Expected<SlotsResult> bench_slots(const gpu::OpenedModel& model, const SlotsBench& b) {
  const model::Pipeline& pipeline = *model.pipeline;
  config::ServeConfig config;
  config.slots.count = b.slots;
  config.slots.ctx = pipeline.max_context();
  config.slots.prefill_chunk = b.prefill_chunk;
  config.slots.queue_limit = b.slots;
  config.devices.split = b.split;
  config.devices.split.micro_batches = b.micro_batches;

  caf::actor_system_config cfg;
  actors::configure_actor_system(cfg);
  caf::actor_system system{cfg};
  const actors::Engine engine = actors::spawn_engine(system, config, {.pipeline = &pipeline, .experts = model.experts, .expert_stage = model.expert_stage});
  SlotsResult result;
  result.micro_batches = engine.limits.micro_batches;

  std::mt19937 rng(static_cast<uint32_t>(b.seed));
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(pipeline.hparams().vocab_size) - 1);
  caf::scoped_actor self{system};
  const Clock::time_point base = Clock::now();
  const uint32_t total = b.warmup + b.tokens;
  for (uint32_t i = 0; i < b.slots; ++i) {
    actors::GenerateRequest r;
    r.id = i + 1;
    r.prompt.resize(std::max<uint32_t>(1, b.depth));
    for (int32_t& t : r.prompt) t = tok(rng);
    r.max_tokens = total;
    r.min_tokens = total;
    r.reuse_prefix = false;
    const auto s = system.spawn(sink, caf::actor_cast<caf::actor>(self), i, base);
    caf::anon_send(engine.scheduler, actors::submit_atom_v, std::move(r), actors::request_sink_actor(s));
  }
  std::vector<std::vector<double>> times(b.slots);
  std::string failure;
  for (uint32_t got = 0; got < b.slots; ++got) {
    self->receive([&](uint32_t index, std::vector<double>& t, std::string& f) {
      times[index] = std::move(t);
      if (!f.empty()) failure = f;
    });
  }
  actors::stop_engine(engine);
  if (!failure.empty()) return Error(ErrorCode::internal, failure);

  // Each request's window is its tokens after the warm-up; the overlap is where all windows are open.
  double open = 0, close = 1e300;
  for (const auto& t : times) {
    if (t.size() < total || b.tokens < 2) return Error(ErrorCode::internal, "a request returned too few tokens");
    const double first = t[b.warmup], last = t[total - 1];
    result.per_slot_tps.push_back((b.tokens - 1) / (last - first));
    open = std::max(open, first);
    close = std::min(close, last);
  }
  result.overlap_s = close > open ? close - open : 0;
  if (result.overlap_s > 0) {
    uint64_t inside = 0;
    for (const auto& t : times) {
      inside += static_cast<uint64_t>(std::count_if(t.begin() + b.warmup, t.end(), [&](double x) {
        return x > open && x <= close;
      }));
    }
    result.aggregate_tps = static_cast<double>(inside) / result.overlap_s;
  }
  return result;
}

}  // namespace ferry::cli
