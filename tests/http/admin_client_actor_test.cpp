// The admin client actor (one per console) on CAF's deterministic scheduler: a recording channel
// stands for the WebSocket, the real engine graph runs over a scripted backend.
#include <boost/json.hpp>
#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <gtest/gtest.h>

#include "actors/bootstrap.hpp"
#include "http/admin_client_actor.hpp"
#include "tests/actors/scripted_stage.hpp"

using namespace ferry;
using namespace ferry::http;
namespace bj = boost::json;

namespace {

class RecordingAdminChannel : public AdminChannel {
 public:
  bool send(std::string text) override {
    if (sent.size() >= accept) return false;
    sent.push_back(bj::parse(text).as_object());
    return true;
  }
  void close(uint16_t c, std::string r) override {
    code = c;
    reason = std::move(r);
  }
  std::vector<bj::object> sent;
  size_t accept = SIZE_MAX;  // a console that stops reading after this many
  uint16_t code = 0;
  std::string reason;
};

class AdminClientTest : public ::testing::Test {
 protected:
  AdminClientTest() : sys(configure(cfg)), sched(dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler())) {
    auto context = std::make_shared<ServerContext>();
    context->config.slots.count = 2;
    context->config.server.admin_token = "tok";
    context->system = &sys;
    backend = std::make_shared<ferry::testing::ScriptedStage>(2, 64, 1000);
    context->engine = actors::spawn_engine(sys, context->config, actors::EngineModel{.pipeline = ferry::testing::pipeline_of({backend}).get()}, false);
    context->phase.store(ServerPhase::ready);
    ctx = context;
    sched.run();
  }
  ~AdminClientTest() override {
    actors::stop_engine(ctx->engine);
    sched.run();
  }
  static caf::actor_system_config& configure(caf::actor_system_config& c) {
    c.set("scheduler.policy", caf::atom("testing"));
    c.set("logger.file-verbosity", caf::atom("quiet"));
    return c;
  }

  std::shared_ptr<RecordingAdminChannel> console(bool authenticated) {
    auto channel = std::make_shared<RecordingAdminChannel>();
    client = sys.spawn(admin_client, AdminClientJob{channel, ctx, authenticated});
    sched.run();
    return channel;
  }
  void say(const std::string& text) {
    caf::anon_send(client, actors::admin_text_atom_v, text);
    sched.run();
  }
  bool alive() const { return ctx->admin_metrics.client_actors.load() > 0; }

  caf::actor_system_config cfg;
  caf::actor_system sys;
  caf::scheduler::test_coordinator& sched;
  std::shared_ptr<ferry::testing::ScriptedStage> backend;
  std::shared_ptr<ServerContext> ctx;
  actors::admin_client_actor client;
};

}  // namespace

TEST_F(AdminClientTest, AnAuthenticatedConsoleGetsHelloThenASnapshot) {
  auto ch = console(true);
  ASSERT_EQ(ch->sent.size(), 2u);
  EXPECT_EQ(ch->sent[0].at("type"), "hello");
  EXPECT_EQ(ch->sent[0].at("auth_required"), false);
  EXPECT_EQ(ch->sent[1].at("type"), "snapshot");
  EXPECT_EQ(ch->sent[1].at("slots").as_array().size(), 2u);
}

TEST_F(AdminClientTest, TheFirstMessageMustBeTheRightToken) {
  auto ch = console(false);
  ASSERT_EQ(ch->sent.size(), 1u);
  EXPECT_EQ(ch->sent[0].at("auth_required"), true);
  say(R"({"cmd":"auth","token":"tok","id":1})");
  ASSERT_EQ(ch->sent.size(), 3u);
  EXPECT_EQ(ch->sent[1].at("type"), "ack");
  EXPECT_EQ(ch->sent[2].at("type"), "snapshot");

  auto wrong = console(false);
  say(R"({"cmd":"auth","token":"tik"})");
  EXPECT_EQ(wrong->sent.back().at("code"), "unauthorized");
  EXPECT_EQ(wrong->code, kClosePolicyViolation);

  auto other = console(false);
  say(R"({"cmd":"drain"})");  // not before authenticating
  EXPECT_EQ(other->sent.back().at("code"), "unauthorized");
  EXPECT_EQ(other->code, kClosePolicyViolation);
  EXPECT_FALSE(ctx->engine.admin == nullptr);

  auto silent = console(false);
  for (int i = 0; i < 50 && silent->code == 0; ++i) {  // until the auth deadline (ticks of the others fire too)
    sched.trigger_timeouts();
    sched.run();
  }
  EXPECT_EQ(silent->code, kClosePolicyViolation);
  EXPECT_EQ(silent->sent.back().at("code"), "unauthorized");
}

TEST_F(AdminClientTest, CommandsAreAnsweredAndBadOnesKeepTheConsole) {
  auto ch = console(true);
  say(R"({"cmd":"ping","id":1})");
  EXPECT_EQ(ch->sent.back().at("type"), "ack");
  say("{oops");
  EXPECT_EQ(ch->sent.back().at("code"), "bad_json");
  say(R"({"cmd":"release","slot":5,"id":2})");
  EXPECT_EQ(ch->sent.back().at("code"), "not_found");
  say(R"({"cmd":"cancel","request":99,"id":3})");
  EXPECT_EQ(ch->sent.back().at("was_live"), false);
  say(R"({"cmd":"set_log_level","level":"nope","id":4})");
  EXPECT_EQ(ch->sent.back().at("code"), "bad_field");
  say(R"({"cmd":"memory_plan","id":5})");
  EXPECT_EQ(ch->sent.back().at("plan").at("slots"), 2);
  say(R"({"cmd":"snapshot"})");
  EXPECT_EQ(ch->sent.back().at("type"), "snapshot");
  EXPECT_EQ(ch->code, 0);  // still open
}

TEST_F(AdminClientTest, TicksSendDeltasOnlyWhenSomethingChanged) {
  auto ch = console(true);
  say(R"({"cmd":"rate","hz":20})");
  const size_t before = ch->sent.size();
  sched.trigger_timeouts();
  sched.run();
  // The admin's own node changed (a console joined); then nothing.
  for (int i = 0; i < 3; ++i) {
    sched.trigger_timeouts();
    sched.run();
  }
  const size_t quiet = ch->sent.size();
  for (int i = 0; i < 3; ++i) {
    sched.trigger_timeouts();
    sched.run();
  }
  EXPECT_EQ(ch->sent.size(), quiet);
  actors::GenerateRequest r;
  r.id = 1;
  r.prompt = {1, 2, 3};
  r.max_tokens = 2;
  auto sink = sys.spawn([](caf::event_based_actor*) -> caf::behavior { return {[](const actors::RequestStarted&) {},
                                                                             [](const actors::TokensGenerated&) {},
                                                                             [](const actors::RequestFinished&) {}}; });
  caf::anon_send(ctx->engine.scheduler, actors::submit_atom_v, r, caf::actor_cast<actors::request_sink_actor>(sink));
  sched.run();
  for (int i = 0; i < 4; ++i) {
    sched.trigger_timeouts();
    sched.run();
  }
  ASSERT_GT(ch->sent.size(), quiet);
  bool saw_tokens = false;
  for (size_t i = before; i < ch->sent.size(); ++i) {
    const auto& m = ch->sent[i];
    EXPECT_EQ(m.at("type"), "delta");
    if (m.contains("engine")) saw_tokens |= m.at("engine").at("generated_tokens").as_int64() == 2;
  }
  EXPECT_TRUE(saw_tokens);
  caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
}

TEST_F(AdminClientTest, AConsoleThatStopsReadingIsLetGo) {
  auto ch = console(true);
  ch->accept = ch->sent.size();  // full from now on
  say(R"({"cmd":"ping"})");
  EXPECT_FALSE(alive());
}

TEST_F(AdminClientTest, TheAdminStoppingClosesTheConsole) {
  auto ch = console(true);
  caf::anon_send_exit(ctx->engine.admin, caf::exit_reason::user_shutdown);
  sched.run();
  EXPECT_EQ(ch->code, kCloseGoingAway);
  EXPECT_FALSE(alive());
}
