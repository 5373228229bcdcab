// The admin console's messages: parsing each command and its errors, and the JSON each answer is.
#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "http/admin_json.hpp"

using namespace ferry;
using namespace ferry::http;
namespace bj = boost::json;

namespace {

AdminMessage ok(std::string_view text) {
  auto r = parse_admin_message(text);
  if (auto* e = std::get_if<AdminError>(&r)) ADD_FAILURE() << text << ": " << e->code << ": " << e->message;
  return std::holds_alternative<AdminMessage>(r) ? std::get<AdminMessage>(r) : AdminMessage{};
}

AdminError bad(std::string_view text) {
  auto r = parse_admin_message(text);
  EXPECT_TRUE(std::holds_alternative<AdminError>(r)) << text;
  return std::holds_alternative<AdminError>(r) ? std::get<AdminError>(r) : AdminError{};
}

}  // namespace

TEST(AdminJson, ParsesEveryCommand) {
  EXPECT_EQ(ok(R"({"cmd":"auth","token":"t"})").token, "t");
  EXPECT_EQ(ok(R"({"cmd":"rate","hz":2.5})").hz, 2.5);
  EXPECT_EQ(ok(R"({"cmd":"rate","hz":0})").hz, 0);
  EXPECT_EQ(ok(R"({"cmd":"cancel","request":42})").request, 42u);
  EXPECT_EQ(ok(R"({"cmd":"cancel","request":"chatcmpl-43"})").request, 43u);
  EXPECT_EQ(ok(R"({"cmd":"cancel","request":"cmpl-44"})").request, 44u);
  EXPECT_EQ(ok(R"({"cmd":"cancel","request":"45"})").request, 45u);
  EXPECT_EQ(ok(R"({"cmd":"release","slot":2})").slot, 2u);
  EXPECT_EQ(ok(R"({"cmd":"set_log_level","level":"warn"})").level, "warn");
  EXPECT_EQ(ok(R"({"cmd":"drain"})").cmd, AdminCommand::drain);
  EXPECT_EQ(ok(R"({"cmd":"memory_plan"})").cmd, AdminCommand::memory_plan);
  EXPECT_EQ(ok(R"({"cmd":"snapshot"})").cmd, AdminCommand::snapshot);
  EXPECT_EQ(ok(R"(  {"cmd":"ping", "extra": [1, {"x": 2}]}  )").cmd, AdminCommand::ping);  // unknown fields ignored
}

TEST(AdminJson, EchoesTheIdAsSent) {
  EXPECT_EQ(ok(R"({"cmd":"ping","id":7})").id, "7");
  EXPECT_EQ(ok(R"({"id":"a\"b","cmd":"ping"})").id, R"("a\"b")");
  const AdminMessage m = ok(R"({"cmd":"ping","id":"x-1"})");
  EXPECT_EQ(bj::parse(ack_json(m)).at("id"), "x-1");
  EXPECT_EQ(bad(R"({"cmd":"nope","id":9})").id, "9");
}

TEST(AdminJson, ErrorsNameTheFieldAndWhatWasExpected) {
  EXPECT_EQ(bad("").code, "bad_json");
  EXPECT_EQ(bad("{").code, "bad_json");
  EXPECT_EQ(bad("null").code, "bad_json");
  EXPECT_EQ(bad(R"({"cmd":"ping"} x)").code, "bad_json");
  EXPECT_EQ(bad(R"({"cmd":"ping","cmd2":)").code, "bad_json");
  const AdminError unknown = bad(R"({"cmd":"reboot"})");
  EXPECT_EQ(unknown.code, "unknown_command");
  EXPECT_NE(unknown.message.find("expected one of auth, rate, snapshot, cancel"), std::string::npos);
  EXPECT_EQ(bad(R"({"id":1})").code, "missing_field");
  EXPECT_EQ(bad(R"({"cmd":"auth"})").message, "auth: 'token' is missing: the admin token (--admin-token)");
  const AdminError hz = bad(R"({"cmd":"rate","hz":-1})");
  EXPECT_EQ(hz.code, "bad_field");
  EXPECT_EQ(hz.message, "'hz' = -1: expected updates per second in [0, 20] (0: none)");
  EXPECT_EQ(bad(R"({"cmd":"cancel","request":1.5})").code, "bad_field");
  EXPECT_EQ(bad(R"({"cmd":"cancel","request":true})").code, "bad_field");
  EXPECT_EQ(bad(R"({"cmd":"release","slot":-1})").code, "bad_field");
  EXPECT_EQ(bad(R"({"cmd":"release","slot":4294967296})").code, "bad_field");
  EXPECT_EQ(bad(R"({"cmd":["ping"]})").message, "'cmd': expected a string");
}

TEST(AdminJson, AViewIsASnapshotOrADeltaWithOnlyItsChangedParts) {
  actors::AdminView v;
  v.rev = 9;
  v.full = true;
  actors::ActorReport a;
  a.name = "stage 0";
  a.kind = actors::ActorKind::stage;
  a.links = {"scheduler"};
  a.counters = {{"steps", 3}};
  v.actors = {a};
  v.engine_changed = true;
  v.engine.slots.resize(1);
  v.engine.slots[0].busy = true;
  v.engine.slots[0].status = actors::RequestStatus::decoding;
  v.engine.slots[0].request = 5;
  v.engine.slots[0].generated_tokens = 11;
  v.engine.slots[0].decode_ms = 100;
  const bj::object snap = bj::parse(to_json(AdminViewMessage{v, "ready", 4, 123, "m", "cpu", 3, 4096})).as_object();
  EXPECT_EQ(snap.at("type"), "snapshot");
  EXPECT_EQ(snap.at("server").at("ctx"), 4096);
  EXPECT_EQ(snap.at("actors").at(0).at("counters").at("steps"), 3.0);
  const auto& slot = snap.at("slots").at(0);
  EXPECT_EQ(slot.at("state"), "decoding");
  EXPECT_EQ(slot.at("request"), 5);
  EXPECT_DOUBLE_EQ(slot.at("tokens_per_s").as_double(), 100.0);  // 10 tokens after the first in 100 ms
  actors::AdminView d;
  d.rev = 10;
  d.since = 9;
  d.removed = {"bridge 5"};
  const bj::object delta = bj::parse(to_json(AdminViewMessage{d, "ready", 4, 124, "m", "cpu", 3, 4096})).as_object();
  EXPECT_EQ(delta.at("type"), "delta");
  EXPECT_EQ(delta.at("since"), 9);
  EXPECT_FALSE(delta.contains("slots") || delta.contains("actors") || delta.contains("server"));
  EXPECT_EQ(delta.at("removed").at(0), "bridge 5");
  EXPECT_TRUE(delta.contains("throughput"));
}

TEST(AdminJson, AcksAndErrors) {
  AdminMessage m = ok(R"({"cmd":"cancel","request":3,"id":1})");
  actors::CancelResult r;
  r.id = 3;
  r.was_live = true;
  r.status = actors::RequestStatus::prefilling;
  const bj::object ack = bj::parse(ack_json(m, r)).as_object();
  EXPECT_EQ(ack.at("type"), "ack");
  EXPECT_EQ(ack.at("status"), "prefilling");
  const bj::object err = bj::parse(to_json(AdminError{"", "", "bad_json", "x"})).as_object();
  EXPECT_TRUE(err.at("cmd").is_null() && err.at("id").is_null());
  const bj::object hello = bj::parse(to_json(AdminHello{true, "m", "cpu", 4})).as_object();
  EXPECT_EQ(hello.at("auth_required"), true);
  EXPECT_EQ(hello.at("commands").as_array().size(), 9u);
}
