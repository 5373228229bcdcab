#include "actors/admin_actor.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "actors/telemetry.hpp"

namespace ferry::actors {
namespace {

using Clock = AdminGraph::Clock;

// The admin's own node of the graph; noted when its figures change, not on every view.
void note_self(admin_pointer self) {
  AdminState& st = self->state;
  ActorReport r;
  r.name = "admin";
  r.kind = ActorKind::admin;
  r.mailbox = own_mailbox_depth(self);
  r.doing = st.clients.empty() ? "no console connected"
                               : std::to_string(st.clients.size()) + (st.clients.size() == 1 ? " console" : " consoles") +
                                     " connected";
  r.counters = {
      {"clients", static_cast<double>(st.clients.size())},
      {"reports", static_cast<double>(st.reports)},
      {"commands", static_cast<double>(st.commands)},
  };
  st.graph.note(r, Clock::now());
}

// Remembers who reports, to notice one that goes down without its last report.
void track_reporter(admin_pointer self, const ActorReport& report) {
  AdminState& st = self->state;
  ++st.reports;
  const caf::strong_actor_ptr sender = self->current_sender();
  if (!sender) return;
  if (report.ended) {
    if (st.reporters.erase(sender->address()) != 0) self->demonitor(sender->address());
    return;
  }
  if (st.reporters.emplace(sender->address(), report.name).second) self->monitor(sender);
}

void track_client(admin_pointer self) {
  AdminState& st = self->state;
  const caf::strong_actor_ptr sender = self->current_sender();
  if (sender && st.clients.insert(sender->address()).second) {
    self->monitor(sender);
    note_self(self);
  }
}

}  // namespace

const std::vector<std::string>& log_level_names() {
  static const std::vector<std::string> names = {"trace", "debug", "info", "warn", "warning", "error", "critical", "off"};
  return names;
}

admin_actor::behavior_type admin(admin_pointer self, scheduler_actor scheduler, std::vector<stage_actor> stages,
                                 MemoryPlan memory, AdminHooks hooks) {
  AdminState& st = self->state;
  st.scheduler = scheduler;
  st.memory = std::move(memory);
  st.hooks = std::move(hooks);
  const auto sink = caf::actor_cast<telemetry_sink_actor>(self);
  self->send(scheduler, subscribe_atom_v, sink);
  for (const stage_actor& s : stages) self->send(s, subscribe_atom_v, sink);
  note_self(self);
  self->set_down_handler([self](const caf::down_msg& down) {
    AdminState& st = self->state;
    if (auto it = st.reporters.find(down.source); it != st.reporters.end()) {
      st.graph.forget(it->second);
      st.reporters.erase(it);
    }
    if (st.clients.erase(down.source) != 0) note_self(self);
  });
  return {
      [self](const ActorReport& report) {
        track_reporter(self, report);
        self->state.graph.note(report, Clock::now());
        note_self(self);
      },
      [self](const ActorReport& report, const EngineSnapshot& engine) {
        track_reporter(self, report);
        self->state.graph.note(report, engine, Clock::now());
        note_self(self);
      },
      [self](const ActorReport& report, const StageStatus& stage) {
        track_reporter(self, report);
        self->state.graph.note(report, stage, Clock::now());
        note_self(self);
      },
      [self](admin_view_atom, uint64_t since) -> AdminView {
        track_client(self);
        return self->state.graph.view(since, Clock::now());
      },
      [self](const AdminCancel& cancel) -> caf::result<CancelResult> {
        ++self->state.commands;
        note_self(self);
        return self->delegate(self->state.scheduler, cancel);
      },
      [self](const ReleaseSlot& release) -> caf::result<ReleaseResult> {
        ++self->state.commands;
        note_self(self);
        return self->delegate(self->state.scheduler, release);
      },
      [self](admin_drain_atom) -> DrainAck {
        AdminState& st = self->state;
        ++st.commands;
        note_self(self);
        DrainAck ack;
        if (st.hooks.drain) {
          ack.started = st.hooks.drain();
        } else {
          ack.started = !st.drain_started;
          if (ack.started) {
            self->request(st.scheduler, caf::infinite, DrainRequest{st.hooks.drain_timeout_ms})
                .then([](const DrainDone&) {}, [](const caf::error&) {});
          }
        }
        st.drain_started = true;
        ack.message = ack.started ? "draining: new requests get 503, running ones finish or are cancelled at the "
                                    "drain deadline, then the server exits"
                                  : "already draining";
        if (ack.started) spdlog::warn("admin console: drain requested");
        return ack;
      },
      [self](const SetLogLevel& set) -> LogLevelResult {
        ++self->state.commands;
        note_self(self);
        LogLevelResult r;
        const auto v = spdlog::level::to_string_view(spdlog::get_level());
        r.previous.assign(v.data(), v.size());
        const auto& names = log_level_names();
        if (std::find(names.begin(), names.end(), set.level) == names.end()) {
          r.level = r.previous;
          r.message = "expected one of trace, debug, info, warn, error, critical, off";
          return r;
        }
        spdlog::set_level(spdlog::level::from_str(set.level));
        r.ok = true;
        r.level = set.level;
        spdlog::info("admin console: log level {} -> {}", r.previous, r.level);
        return r;
      },
      [self](memory_plan_atom) -> MemoryPlan {
        ++self->state.commands;
        note_self(self);
        return self->state.memory;
      },
  };
}

}  // namespace ferry::actors
