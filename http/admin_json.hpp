#pragma once
// The admin console's protocol: every message of the /admin/ws WebSocket, parsed and written here
// (one place; STYLE rule 14). Messages are JSON text frames, one object each.
//
// Connecting. Scripts send `Authorization: Bearer TOKEN` (--admin-token) with the upgrade request;
// a wrong token is refused with 401 before the upgrade. A browser cannot set that header, so the
// page sends {"cmd":"auth","token":"TOKEN"} as its first message instead. Without --admin-token
// the console answers only when it listens on a loopback address (else 403), and then needs no
// token. An upgrade whose Origin is not the server's own is refused (403): another site's page must
// not drive the console of a server on the user's machine.
//
// Server -> client:
//   {"type":"hello","protocol":1,"auth_required":bool,"model":"glm-5.3-flash","backend":"...",
//    "rate_hz":4,"max_rate_hz":20,"commands":[...]}
//       first, always. With auth_required, nothing else comes until a good auth message.
//   {"type":"snapshot","rev":N,"t":UNIX_MS,"phase":"ready"|"draining","rate_hz":4,
//    "server":{...},"actors":[ACTOR...],"slots":[SLOT...],"queue":QUEUE,"engine":ENGINE,
//    "stages":[STAGE...],"finished":[FINISHED...],"throughput":THROUGHPUT}
//       after authentication, and when asked for ({"cmd":"snapshot"}): the whole graph.
//   {"type":"delta","rev":N,"since":M,"t":UNIX_MS,"phase":...,"actors":[changed ACTOR...],
//    "removed":["bridge 42",...],"slots":[...],"queue":{...},"engine":{...},"stages":[changed...],
//    "finished":[new FINISHED...],"throughput":THROUGHPUT}
//       at the client's rate while anything changed; keys absent when their part did not change
//       ("slots", "queue" and "engine" come together). Apply "removed" before "actors". A delta
//       continues from the "rev" of the message before it; "since" says which.
//   {"type":"ack","cmd":CMD,"id":ID,...}     a command's answer (fields below)
//   {"type":"error","cmd":CMD|null,"id":ID|null,"code":CODE,"message":"..."}
//
//   ACTOR  = {"name":"stage 0","kind":"scheduler|stage|bridge|admin|expert_cache|kv_residency",
//             "links":["stage 1"],"mailbox":0,"doing":"idle","counters":{"steps":12,...},
//             "request":42 (bridges)}
//   SLOT   = {"index":0,"state":"idle|queued|prefilling|decoding","request":42|null,"prompt_tokens":..,
//             "prefilled_tokens":..,"cached_tokens":..,"generated_tokens":..,"held_tokens":..,
//             "tokens_per_s":..}
//   QUEUE  = {"length":0,"limit":64,"requests":[43,44]}
//   ENGINE = {"draining":false,"failed":false,"failure":"","steps":..,"prompt_tokens":..,
//             "cached_tokens":..,"generated_tokens":..,"step_ms_mean":..,"requests_finished":{...}}
//   STAGE  = {"index":0,"layers":"layers 0-10","backend":"cpu, 2 threads, ...","failed":false,
//             "failure":"","steps":..,"rows":..,"compute_ms":..,"handoff_ms":..,"handoff_bytes":..,
//             "step_ms":..}
//   FINISHED = {"request":42,"name":"bridge 42","doing":"finished: stop","counters":{...}}
//   THROUGHPUT = {"generated_tokens_per_s":..,"prompt_tokens_per_s":..}  (over the last second)
//
// Client -> server: {"cmd":CMD, "id":ID?, ...}. ID (a number or a string) is echoed in the answer.
//   auth           "token":"..."             ack {"authenticated":true}
//   rate           "hz":0..20                ack {"rate_hz":hz}; 0 stops the deltas (default 4)
//   snapshot                                 a snapshot message (no ack)
//   cancel         "request":42|"chatcmpl-42"   ack {"request":42,"was_live":bool,"status":"decoding"}:
//                                            idempotent, an unknown or ended request is was_live false
//   release        "slot":0                  ack {"slot":0,"cancelled_request":42|null}; error
//                                            not_found for a slot that does not exist
//   drain                                    ack {"started":bool,"message":"..."}; started false when
//                                            already draining; the server then exits as on SIGTERM
//   set_log_level  "level":"debug"           ack {"previous":"info","level":"debug"}
//                                            (trace, debug, info, warn, error, critical, off)
//   memory_plan                              ack {"plan":{"slots":3,"ctx":..,"stages":[{...}],
//                                            "tiers":[],"note":"..."}}
//   ping                                     ack {}
//
// Error codes: bad_json (not JSON, or not an object), missing_field, bad_field (wrong type or
// value: the message names the field, the value and what was expected), unknown_command,
// unauthorized (no or a wrong token: the connection is then closed with 1008), not_found,
// engine_unavailable (the engine did not answer).
//
// Back-pressure: a client that leaves --admin-queue-limit messages unread is dropped (its TCP
// connection closed); the engine never waits for a console.
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "actors/messages.hpp"

namespace ferry::http {

constexpr uint32_t kAdminProtocol = 1;
constexpr double kAdminDefaultRateHz = 4;
constexpr double kAdminMaxRateHz = 20;

enum class AdminCommand : uint8_t { auth, rate, snapshot, cancel, release, drain, set_log_level, memory_plan, ping };

struct AdminMessage {
  AdminCommand cmd = AdminCommand::ping;
  std::string id;  // the client's "id" as JSON text; empty when it sent none
  std::string token;
  double hz = 0;
  actors::RequestId request = 0;
  uint32_t slot = 0;
  std::string level;
};

struct AdminError {
  std::string cmd;  // empty: not known
  std::string id;   // JSON text; empty: none
  std::string code;
  std::string message;
};

// One client message; an AdminError names what is wrong with it.
std::variant<AdminMessage, AdminError> parse_admin_message(std::string_view text);
std::string_view command_name(AdminCommand c);

struct AdminHello {
  bool auth_required = false;
  std::string model;
  std::string backend;
  double rate_hz = kAdminDefaultRateHz;
};

// A snapshot (view.full) or a delta, with what the client needs beside the view.
struct AdminViewMessage {
  const actors::AdminView& view;
  std::string_view phase;  // ready, draining
  double rate_hz = kAdminDefaultRateHz;
  int64_t unix_ms = 0;
  // The snapshot's "server" section:
  std::string_view model;
  std::string_view backend;
  uint32_t slots = 0;
  uint32_t ctx = 0;
};

std::string to_json(const AdminHello& x);
std::string to_json(const AdminViewMessage& x);
std::string to_json(const AdminError& x);

// Acks, one per command (AdminMessage::id echoed).
std::string ack_json(const AdminMessage& m);  // auth, rate, ping: the fields are the message's own
std::string ack_json(const AdminMessage& m, const actors::CancelResult& r);
std::string ack_json(const AdminMessage& m, const actors::ReleaseResult& r);
std::string ack_json(const AdminMessage& m, const actors::DrainAck& r);
std::string ack_json(const AdminMessage& m, const actors::LogLevelResult& r);
std::string ack_json(const AdminMessage& m, const actors::MemoryPlan& r);

}  // namespace ferry::http
