#include "http/admin_json.hpp"

#include <boost/json.hpp>
#include <simdjson.h>

#include <charconv>
#include <cmath>
#include <optional>

namespace ferry::http {
namespace {

namespace bj = boost::json;
namespace od = simdjson::ondemand;

constexpr std::string_view kCommands[] = {"auth",  "rate",          "snapshot",    "cancel", "release",
                                          "drain", "set_log_level", "memory_plan", "ping"};

std::string commands_list() {
  std::string out;
  for (std::string_view c : kCommands) out += (out.empty() ? "" : ", ") + std::string(c);
  return out;
}

// The fields a message may carry, as read, before the command decides which it needs.
struct RawMessage {
  std::optional<std::string> cmd, token, level, request_text;
  std::optional<double> hz;
  std::optional<uint64_t> request_number, slot;
  std::string id;
};

AdminError error(std::string cmd, std::string id, std::string code, std::string message) {
  return AdminError{std::move(cmd), std::move(id), std::move(code), std::move(message)};
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\r' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::optional<uint64_t> digits_value(std::string_view s) {
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// A JSON number that is a whole number >= 0 (42, 42.0), or nothing.
std::optional<uint64_t> whole_number(od::value& v) {
  double d = 0;
  if (v.get_double().get(d) || !(d >= 0) || d > 9007199254740992.0 || std::floor(d) != d) return std::nullopt;
  return static_cast<uint64_t>(d);
}

std::optional<AdminError> read_fields(od::object& obj, RawMessage& m) {
  for (auto field : obj) {
    std::string_view key;
    if (field.unescaped_key().get(key)) return error("", m.id, "bad_json", "the message is not valid JSON");
    od::value v;
    if (field.value().get(v)) return error("", m.id, "bad_json", "the message is not valid JSON");
    od::json_type type;
    if (v.type().get(type)) return error("", m.id, "bad_json", "the message is not valid JSON");
    const std::string name(key);
    auto bad = [&](const char* expected) {
      return error(m.cmd.value_or(""), m.id, "bad_field", "'" + name + "': expected " + expected);
    };
    auto read_string = [&](std::optional<std::string>& out) -> std::optional<AdminError> {
      std::string_view s;
      if (type != od::json_type::string || v.get_string().get(s)) return bad("a string");
      out = std::string(s);
      return std::nullopt;
    };
    if (name == "id") {
      if (type != od::json_type::number && type != od::json_type::string) return bad("a number or a string");
      std::string_view raw = trim(v.raw_json_token());
      // Validate the token whole: the echo must be the JSON the client sent.
      if (type == od::json_type::number) {
        double d;
        if (v.get_double().get(d)) return bad("a number or a string");
      } else {
        std::string_view s;
        if (v.get_string().get(s)) return bad("a number or a string");
      }
      m.id = std::string(raw);
    } else if (name == "cmd") {
      if (auto e = read_string(m.cmd)) return e;
    } else if (name == "token") {
      if (auto e = read_string(m.token)) return e;
    } else if (name == "level") {
      if (auto e = read_string(m.level)) return e;
    } else if (name == "hz") {
      double d = 0;
      if (type != od::json_type::number || v.get_double().get(d)) return bad("a number of updates per second");
      m.hz = d;
    } else if (name == "request") {
      if (type == od::json_type::string) {
        if (auto e = read_string(m.request_text)) return e;
      } else if (type == od::json_type::number) {
        m.request_number = whole_number(v);
        if (!m.request_number) return bad("a request id: a whole number, or a response id such as \"chatcmpl-42\"");
      } else {
        return bad("a request id: a whole number, or a response id such as \"chatcmpl-42\"");
      }
    } else if (name == "slot") {
      m.slot = type == od::json_type::number ? whole_number(v) : std::nullopt;
      if (!m.slot || *m.slot > UINT32_MAX) return bad("a slot index: a whole number");
    }
    // Any other field is ignored, as in the HTTP API's bodies.
  }
  return std::nullopt;
}

bj::value id_value(const std::string& id) {
  if (id.empty()) return nullptr;
  boost::system::error_code ec;
  bj::value v = bj::parse(id, ec);
  return ec ? bj::value(nullptr) : v;
}

bj::object message(std::string_view type, std::string_view cmd, const std::string& id) {
  bj::object o;
  o["type"] = type;
  o["cmd"] = cmd;
  o["id"] = id_value(id);
  return o;
}

std::string slot_state(const actors::SlotSnapshot& s) {
  return s.busy ? std::string(actors::status_name(s.status)) : "idle";
}

bj::object counters_json(const std::vector<actors::Counter>& counters) {
  bj::object o;
  for (const auto& c : counters) o[c.name] = c.value;
  return o;
}

const char* kind_name(actors::ActorKind k) {
  switch (k) {
    case actors::ActorKind::scheduler: return "scheduler";
    case actors::ActorKind::stage: return "stage";
    case actors::ActorKind::bridge: return "bridge";
    case actors::ActorKind::admin: return "admin";
    case actors::ActorKind::expert_cache: return "expert_cache";
    case actors::ActorKind::kv_residency: return "kv_residency";
  }
  return "unknown";
}

bj::object actor_json(const actors::ActorReport& r) {
  bj::object o;
  o["name"] = r.name;
  o["kind"] = kind_name(r.kind);
  bj::array links;
  for (const auto& l : r.links) links.emplace_back(l);
  o["links"] = std::move(links);
  o["mailbox"] = r.mailbox;
  o["doing"] = r.doing;
  o["counters"] = counters_json(r.counters);
  if (r.request != 0) o["request"] = r.request;
  return o;
}

bj::object finished_json(const actors::ActorReport& r) {
  return bj::object{{"request", r.request}, {"name", r.name}, {"doing", r.doing}, {"counters", counters_json(r.counters)}};
}

bj::object slot_json(const actors::SlotSnapshot& s) {
  bj::object o;
  o["index"] = s.index;
  o["state"] = slot_state(s);
  o["request"] = s.busy ? bj::value(s.request) : bj::value(nullptr);
  o["prompt_tokens"] = s.prompt_tokens;
  o["prefilled_tokens"] = s.prefilled_tokens;
  o["cached_tokens"] = s.cached_tokens;
  o["generated_tokens"] = s.generated_tokens;
  o["held_tokens"] = s.held_tokens;
  o["tokens_per_s"] = s.generated_tokens > 1 && s.decode_ms > 0 ? (s.generated_tokens - 1) * 1000.0 / s.decode_ms : 0.0;
  return o;
}

bj::object engine_json(const actors::EngineSnapshot& e) {
  bj::object o;
  o["draining"] = e.draining;
  o["failed"] = e.failed;
  o["failure"] = e.failure;
  o["steps"] = e.steps;
  o["prompt_tokens"] = e.prompt_tokens;
  o["cached_tokens"] = e.cached_tokens;
  o["generated_tokens"] = e.generated_tokens;
  o["step_ms_mean"] = e.step_seconds.count ? e.step_seconds.sum * 1000.0 / static_cast<double>(e.step_seconds.count) : 0.0;
  bj::object finished;
  for (size_t i = 0; i < e.finished_by_status.size(); ++i) {
    const auto status = static_cast<actors::RequestStatus>(i);
    if (actors::is_terminal(status)) finished[actors::status_name(status)] = e.finished_by_status[i];
  }
  o["requests_finished"] = std::move(finished);
  return o;
}

bj::object stage_json(const actors::StageView& v) {
  const auto& s = v.status;
  bj::object o;
  o["index"] = s.index;
  o["layers"] = s.layers;
  o["backend"] = s.backend;
  o["failed"] = s.failed;
  o["failure"] = s.failure;
  o["steps"] = s.steps;
  o["rows"] = s.rows;
  o["compute_ms"] = s.compute_ms;
  o["handoff_ms"] = s.handoff_ms;
  o["handoff_bytes"] = s.handoff_bytes;
  o["step_ms"] = v.step_ms;
  return o;
}

}  // namespace

std::string_view command_name(AdminCommand c) { return kCommands[static_cast<size_t>(c)]; }

std::variant<AdminMessage, AdminError> parse_admin_message(std::string_view text) {
  thread_local od::parser parser;  // not thread-safe: one per thread that parses
  const simdjson::padded_string padded(text);
  od::document doc;
  if (parser.iterate(padded).get(doc)) return error("", "", "bad_json", "the message is not valid JSON");
  // On-demand parsing stops at the end of the root value: anything after it must be whitespace.
  std::string_view root;
  if (doc.raw_json().get(root)) return error("", "", "bad_json", "the message is not valid JSON");
  for (size_t i = static_cast<size_t>(root.data() - padded.data()) + root.size(); i < padded.size(); ++i) {
    const char c = padded.data()[i];
    if (c != ' ' && c != '\n' && c != '\r' && c != '\t') {
      return error("", "", "bad_json", "the message is not valid JSON: content after the object");
    }
  }
  doc.rewind();
  od::object obj;
  if (auto e = doc.get_object().get(obj)) {
    return error("", "", "bad_json",
                 e == simdjson::INCORRECT_TYPE ? "the message must be a JSON object" : "the message is not valid JSON");
  }
  RawMessage raw;
  if (auto e = read_fields(obj, raw)) return *e;
  if (!raw.cmd) return error("", raw.id, "missing_field", "'cmd' is missing: one of " + commands_list());
  AdminMessage m;
  m.id = raw.id;
  size_t index = std::size(kCommands);
  for (size_t i = 0; i < std::size(kCommands); ++i) {
    if (*raw.cmd == kCommands[i]) index = i;
  }
  if (index == std::size(kCommands)) {
    return error(*raw.cmd, raw.id, "unknown_command", "unknown command '" + *raw.cmd + "': expected one of " + commands_list());
  }
  m.cmd = static_cast<AdminCommand>(index);
  const std::string& cmd = *raw.cmd;
  auto missing = [&](const char* field, const char* what) {
    return error(cmd, raw.id, "missing_field", cmd + ": '" + field + "' is missing: " + what);
  };
  switch (m.cmd) {
    case AdminCommand::auth:
      if (!raw.token) return missing("token", "the admin token (--admin-token)");
      m.token = *raw.token;
      break;
    case AdminCommand::rate:
      if (!raw.hz) return missing("hz", "updates per second, 0 to 20");
      if (!(*raw.hz >= 0 && *raw.hz <= kAdminMaxRateHz)) {
        char buf[32];
        const auto end = std::to_chars(buf, buf + sizeof buf, *raw.hz).ptr;
        const std::string v(buf, end);
        return error(cmd, raw.id, "bad_field", "'hz' = " + v + ": expected updates per second in [0, 20] (0: none)");
      }
      m.hz = *raw.hz;
      break;
    case AdminCommand::cancel:
      if (raw.request_number) {
        m.request = *raw.request_number;
      } else if (raw.request_text) {
        std::string_view digits = *raw.request_text;
        for (std::string_view prefix : {"chatcmpl-", "cmpl-"}) {
          if (digits.substr(0, prefix.size()) == prefix) digits.remove_prefix(prefix.size());
        }
        const auto n = digits_value(digits);
        if (!n) {
          return error(cmd, raw.id, "bad_field",
                       "'request' = \"" + *raw.request_text + "\": expected a request id such as 42 or \"chatcmpl-42\"");
        }
        m.request = *n;
      } else {
        return missing("request", "the request id, 42 or \"chatcmpl-42\"");
      }
      break;
    case AdminCommand::release:
      if (!raw.slot) return missing("slot", "the slot index");
      m.slot = static_cast<uint32_t>(*raw.slot);
      break;
    case AdminCommand::set_log_level:
      if (!raw.level) return missing("level", "trace, debug, info, warn, error, critical or off");
      m.level = *raw.level;
      break;
    default:
      break;
  }
  return m;
}

std::string to_json(const AdminHello& x) {
  bj::object o;
  o["type"] = "hello";
  o["protocol"] = kAdminProtocol;
  o["auth_required"] = x.auth_required;
  o["model"] = x.model;
  o["backend"] = x.backend;
  o["rate_hz"] = x.rate_hz;
  o["max_rate_hz"] = kAdminMaxRateHz;
  bj::array commands;
  for (std::string_view c : kCommands) commands.emplace_back(c);
  o["commands"] = std::move(commands);
  return bj::serialize(o);
}

std::string to_json(const AdminViewMessage& x) {
  const actors::AdminView& v = x.view;
  bj::object o;
  o["type"] = v.full ? "snapshot" : "delta";
  o["rev"] = v.rev;
  if (!v.full) o["since"] = v.since;
  o["t"] = x.unix_ms;
  o["phase"] = x.phase;
  if (v.full) {
    o["rate_hz"] = x.rate_hz;
    o["server"] = bj::object{{"model", x.model}, {"backend", x.backend}, {"slots", x.slots}, {"ctx", x.ctx}};
  }
  if (v.full || !v.actors.empty()) {
    bj::array actors;
    for (const auto& a : v.actors) actors.push_back(actor_json(a));
    o["actors"] = std::move(actors);
  }
  if (!v.removed.empty()) {
    bj::array removed;
    for (const auto& r : v.removed) removed.emplace_back(r);
    o["removed"] = std::move(removed);
  }
  if (v.engine_changed || v.full) {
    bj::array slots;
    for (const auto& s : v.engine.slots) slots.push_back(slot_json(s));
    o["slots"] = std::move(slots);
    bj::array queued;
    for (auto id : v.engine.queued_requests) queued.emplace_back(id);
    o["queue"] = bj::object{{"length", v.engine.queued}, {"limit", v.engine.queue_limit}, {"requests", std::move(queued)}};
    o["engine"] = engine_json(v.engine);
  }
  if (v.full || !v.stages.empty()) {
    bj::array stages;
    for (const auto& s : v.stages) stages.push_back(stage_json(s));
    o["stages"] = std::move(stages);
  }
  if (v.full || !v.finished.empty()) {
    bj::array finished;
    for (const auto& f : v.finished) finished.push_back(finished_json(f));
    o["finished"] = std::move(finished);
  }
  o["throughput"] = bj::object{{"generated_tokens_per_s", v.throughput.generated_per_s},
                               {"prompt_tokens_per_s", v.throughput.prompt_per_s}};
  return bj::serialize(o);
}

std::string to_json(const AdminError& x) {
  bj::object o;
  o["type"] = "error";
  o["cmd"] = x.cmd.empty() ? bj::value(nullptr) : bj::value(x.cmd);
  o["id"] = id_value(x.id);
  o["code"] = x.code;
  o["message"] = x.message;
  return bj::serialize(o);
}

std::string ack_json(const AdminMessage& m) {
  bj::object o = message("ack", command_name(m.cmd), m.id);
  if (m.cmd == AdminCommand::auth) o["authenticated"] = true;
  if (m.cmd == AdminCommand::rate) o["rate_hz"] = m.hz;
  return bj::serialize(o);
}

std::string ack_json(const AdminMessage& m, const actors::CancelResult& r) {
  bj::object o = message("ack", command_name(m.cmd), m.id);
  o["request"] = r.id;
  o["was_live"] = r.was_live;
  o["status"] = r.was_live ? bj::value(actors::status_name(r.status)) : bj::value(nullptr);
  return bj::serialize(o);
}

std::string ack_json(const AdminMessage& m, const actors::ReleaseResult& r) {
  bj::object o = message("ack", command_name(m.cmd), m.id);
  o["slot"] = m.slot;
  o["cancelled_request"] = r.cancelled != 0 ? bj::value(r.cancelled) : bj::value(nullptr);
  return bj::serialize(o);
}

std::string ack_json(const AdminMessage& m, const actors::DrainAck& r) {
  bj::object o = message("ack", command_name(m.cmd), m.id);
  o["started"] = r.started;
  o["message"] = r.message;
  return bj::serialize(o);
}

std::string ack_json(const AdminMessage& m, const actors::LogLevelResult& r) {
  bj::object o = message("ack", command_name(m.cmd), m.id);
  o["previous"] = r.previous;
  o["level"] = r.level;
  return bj::serialize(o);
}

std::string ack_json(const AdminMessage& m, const actors::MemoryPlan& p) {
  bj::object o = message("ack", command_name(m.cmd), m.id);
  bj::array stages;
  for (const auto& s : p.stages) {
    stages.push_back(bj::object{{"index", s.index},
                                {"layers", s.layers},
                                {"backend", s.backend},
                                {"slot_fixed_bytes", s.slot_fixed_bytes},
                                {"slot_bytes_per_token", s.slot_bytes_per_token},
                                {"slot_bytes_at_ctx", s.slot_bytes_at_ctx},
                                {"slots_bytes_at_ctx", s.slots_bytes_at_ctx}});
  }
  bj::array tiers;
  for (const auto& t : p.tiers) {
    tiers.push_back(bj::object{{"name", t.name}, {"budget_bytes", t.budget_bytes}, {"used_bytes", t.used_bytes}});
  }
  o["plan"] = bj::object{{"slots", p.slots}, {"ctx", p.ctx}, {"stages", std::move(stages)}, {"tiers", std::move(tiers)},
                         {"note", p.note}};
  return bj::serialize(o);
}

}  // namespace ferry::http
