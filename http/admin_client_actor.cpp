#include "http/admin_client_actor.hpp"

#include <chrono>

namespace ferry::http {
namespace {

constexpr auto kAskTimeout = std::chrono::seconds(10);
constexpr auto kAuthDeadline = std::chrono::seconds(10);

int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string_view phase_name(ServerPhase p) {
  switch (p) {
    case ServerPhase::loading: return "loading";
    case ServerPhase::ready: return "ready";
    case ServerPhase::draining: return "draining";
    case ServerPhase::load_failed: return "load_failed";
  }
  return "unknown";
}

void close_client(admin_client_pointer self, uint16_t code, std::string reason) {
  AdminClientState& st = self->state;
  if (st.closed) return;
  st.closed = true;
  st.job.channel->close(code, std::move(reason));
  self->quit();
}

// Sends one message; a console that is gone or not reading ends this actor.
void send(admin_client_pointer self, std::string text) {
  AdminClientState& st = self->state;
  if (st.closed) return;
  if (!st.job.channel->send(std::move(text))) {
    st.closed = true;
    self->quit();
  }
}

void send_error(admin_client_pointer self, const AdminMessage& m, std::string code, std::string message) {
  send(self, to_json(AdminError{std::string(command_name(m.cmd)), m.id, std::move(code), std::move(message)}));
}

void send_view(admin_client_pointer self, const actors::AdminView& view) {
  AdminClientState& st = self->state;
  const ServerContext& ctx = *st.job.context;
  AdminViewMessage m{view, phase_name(ctx.current_phase()), st.rate_hz, unix_ms(),
                     ctx.config.model.id,          ctx.backend_name,
                     ctx.engine.limits.slots,      ctx.engine.limits.ctx};
  st.rev = view.rev;
  st.last_throughput = view.throughput;
  send(self, to_json(m));
}

void schedule_tick(admin_client_pointer self) {
  AdminClientState& st = self->state;
  if (st.closed || st.rate_hz <= 0 || st.tick_scheduled) return;
  st.tick_scheduled = true;
  const auto period = std::chrono::duration<double>(1.0 / st.rate_hz);
  self->delayed_send(self, std::chrono::duration_cast<std::chrono::milliseconds>(period), actors::admin_tick_atom_v,
                     st.tick);
}

void engine_unavailable(admin_client_pointer self, const AdminMessage& m, const caf::error& err) {
  send_error(self, m, "engine_unavailable", "the engine did not answer: " + self->system().render(err));
}

// The first snapshot, after authentication; the ticks start with it.
void start(admin_client_pointer self) {
  AdminClientState& st = self->state;
  st.started = true;
  st.view_pending = true;
  self->request(st.job.context->engine.admin, kAskTimeout, actors::admin_view_atom_v, uint64_t{0})
      .then(
          [self](actors::AdminView& view) {
            self->state.view_pending = false;
            send_view(self, view);
            schedule_tick(self);
          },
          [self](caf::error& err) {
            self->state.view_pending = false;
            engine_unavailable(self, AdminMessage{AdminCommand::snapshot, {}, {}, 0, 0, 0, {}}, err);
            schedule_tick(self);
          });
}

void on_tick(admin_client_pointer self) {
  AdminClientState& st = self->state;
  if (st.view_pending) return schedule_tick(self);
  st.view_pending = true;
  self->request(st.job.context->engine.admin, kAskTimeout, actors::admin_view_atom_v, st.rev)
      .then(
          [self](actors::AdminView& view) {
            AdminClientState& st = self->state;
            st.view_pending = false;
            // Only what changed; when the engine rests the console hears nothing.
            if (view.full || !view.empty() || !(view.throughput == st.last_throughput)) send_view(self, view);
            schedule_tick(self);
          },
          [self](caf::error&) {
            self->state.view_pending = false;
            schedule_tick(self);
          });
}

void command(admin_client_pointer self, const AdminMessage& m) {
  AdminClientState& st = self->state;
  const actors::admin_actor admin = st.job.context->engine.admin;
  switch (m.cmd) {
    case AdminCommand::auth:  // already authenticated
    case AdminCommand::ping:
      return send(self, ack_json(m));
    case AdminCommand::rate:
      st.rate_hz = m.hz;
      ++st.tick;  // the ticks of the old rate are dropped
      st.tick_scheduled = false;
      send(self, ack_json(m));
      return schedule_tick(self);
    case AdminCommand::snapshot:
      self->request(admin, kAskTimeout, actors::admin_view_atom_v, uint64_t{0})
          .then([self](actors::AdminView& view) { send_view(self, view); },
                [self, m](caf::error& err) { engine_unavailable(self, m, err); });
      return;
    case AdminCommand::cancel:
      self->request(admin, kAskTimeout, actors::AdminCancel{m.request})
          .then([self, m](actors::CancelResult& r) { send(self, ack_json(m, r)); },
                [self, m](caf::error& err) { engine_unavailable(self, m, err); });
      return;
    case AdminCommand::release:
      self->request(admin, kAskTimeout, actors::ReleaseSlot{m.slot})
          .then(
              [self, m](actors::ReleaseResult& r) {
                if (r.ok) send(self, ack_json(m, r));
                else send_error(self, m, "not_found", r.message);
              },
              [self, m](caf::error& err) { engine_unavailable(self, m, err); });
      return;
    case AdminCommand::drain:
      self->request(admin, kAskTimeout, actors::admin_drain_atom_v)
          .then([self, m](actors::DrainAck& r) { send(self, ack_json(m, r)); },
                [self, m](caf::error& err) { engine_unavailable(self, m, err); });
      return;
    case AdminCommand::set_log_level:
      self->request(admin, kAskTimeout, actors::SetLogLevel{m.level})
          .then(
              [self, m](actors::LogLevelResult& r) {
                if (r.ok) send(self, ack_json(m, r));
                else send_error(self, m, "bad_field", "'level' = \"" + m.level + "\": " + r.message);
              },
              [self, m](caf::error& err) { engine_unavailable(self, m, err); });
      return;
    case AdminCommand::memory_plan:
      self->request(admin, kAskTimeout, actors::memory_plan_atom_v)
          .then([self, m](actors::MemoryPlan& plan) { send(self, ack_json(m, plan)); },
                [self, m](caf::error& err) { engine_unavailable(self, m, err); });
      return;
  }
}

void on_text(admin_client_pointer self, const std::string& text) {
  AdminClientState& st = self->state;
  if (st.closed) return;
  auto parsed = parse_admin_message(text);
  if (!st.job.authenticated) {
    auto* m = std::get_if<AdminMessage>(&parsed);
    if (m == nullptr || m->cmd != AdminCommand::auth) {
      AdminError e = m == nullptr ? std::get<AdminError>(parsed) : AdminError{std::string(command_name(m->cmd)), m->id, {}, {}};
      e.code = "unauthorized";
      e.message = "send {\"cmd\":\"auth\",\"token\":\"...\"} first (the --admin-token), or the token in an "
                  "'Authorization: Bearer' header with the upgrade request";
      send(self, to_json(e));
      return close_client(self, kClosePolicyViolation, "admin token required");
    }
    if (!admin_token_matches(st.job.context->config.server.admin_token, m->token)) {
      send_error(self, *m, "unauthorized", "wrong admin token");
      return close_client(self, kClosePolicyViolation, "wrong admin token");
    }
    st.job.authenticated = true;
    send(self, ack_json(*m));
    return start(self);
  }
  if (auto* e = std::get_if<AdminError>(&parsed)) return send(self, to_json(*e));
  command(self, std::get<AdminMessage>(parsed));
}

}  // namespace

bool admin_token_matches(const std::string& configured, const std::string& token) {
  if (configured.empty() || token.size() != configured.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < token.size(); ++i) diff |= static_cast<unsigned char>(token[i] ^ configured[i]);
  return diff == 0;
}

actors::admin_client_actor::behavior_type admin_client(admin_client_pointer self, AdminClientJob job) {
  AdminClientState& st = self->state;
  st.job = std::move(job);
  const ServerContext& ctx = *st.job.context;
  ctx.admin_metrics.client_actors.fetch_add(1);
  st.counted.count = &ctx.admin_metrics.client_actors;
  // The admin actor stops with the engine: so does every console.
  self->monitor(ctx.engine.admin);
  self->set_down_handler([self](const caf::down_msg&) { close_client(self, kCloseGoingAway, "the server is stopping"); });
  send(self, to_json(AdminHello{!st.job.authenticated, ctx.config.model.id, ctx.backend_name, st.rate_hz}));
  if (st.job.authenticated) start(self);
  else self->delayed_send(self, kAuthDeadline, actors::auth_deadline_atom_v);
  return {
      [self](actors::admin_text_atom, const std::string& text) { on_text(self, text); },
      [self](actors::client_gone_atom) {
        self->state.closed = true;
        self->quit();
      },
      [self](actors::admin_tick_atom, uint64_t tick) {
        if (tick != self->state.tick || self->state.closed) return;
        self->state.tick_scheduled = false;
        on_tick(self);
      },
      [self](actors::auth_deadline_atom) {
        if (self->state.job.authenticated) return;
        send(self, to_json(AdminError{"", "", "unauthorized", "no auth message within 10 s"}));
        close_client(self, kClosePolicyViolation, "admin token required");
      },
  };
}

}  // namespace ferry::http
