// The per-request bridge between an HTTP exchange and the engine, on CAF's deterministic scheduler:
// a recording ResponseChannel stands for the connection, the real scheduler and stage run over a
// scripted backend (it draws "last token + 1"), and the test tokenizer turns ids into text.
#include <boost/json.hpp>
#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <gtest/gtest.h>

#include "actors/bootstrap.hpp"
#include "http/bridge_actor.hpp"
#include "model/text/tokenizer_gguf.hpp"
#include "tests/actors/scripted_stage.hpp"

using namespace ferry;
using namespace ferry::http;
namespace bj = boost::json;

namespace {

class RecordingChannel : public ResponseChannel {
 public:
  void send_json(unsigned s, std::string b, HeaderList h) override {
    ++ends;
    status = s;
    body = std::move(b);
    headers = std::move(h);
  }
  void start_events() override { ++starts; }
  bool send_event(std::string payload) override {
    if (events.size() >= accept_events) return false;
    events.push_back(std::move(payload));
    return true;
  }
  void end_events() override { ++ends; }
  void on_client_gone(std::function<void()> callback) override { gone = std::move(callback); }

  unsigned status = 0;
  std::string body;
  HeaderList headers;
  int starts = 0;
  int ends = 0;  // exactly one per exchange
  std::vector<std::string> events;
  size_t accept_events = SIZE_MAX;  // a client that stops reading after this many
  std::function<void()> gone;
};

// Draws a fixed script of tokens whatever the input: a model that "says" exactly this.
class ReplayStage : public ferry::testing::ScriptedStage {
 public:
  ReplayStage(std::vector<int32_t> script, uint32_t vocab) : ScriptedStage(1, 1024, vocab), script_(std::move(script)) {}
  // A new sequence starts the script over (its first sampled row need not start at 0: the prefix
  // cache prefills all but the prompt's last token first).
  Status reset_slot(uint32_t slot) override {
    next_ = 0;
    return ScriptedStage::reset_slot(slot);
  }

 protected:
  int32_t draw(const model::SlotRows& row) override {
    if (row.start == 0) next_ = 0;
    return script_.at(next_++);
  }

 private:
  std::vector<int32_t> script_;
  size_t next_ = 0;
};

std::shared_ptr<const model::Tokenizer> test_tokenizer() {
  auto spec = model::read_hf_tokenizer_dir(FERRY_SOURCE_DIR "/tests/fixtures/tokenizer");
  EXPECT_TRUE(spec.ok()) << (spec.ok() ? "" : spec.error().message);
  auto tokenizer = model::Tokenizer::create(std::move(spec.value()));
  EXPECT_TRUE(tokenizer.ok());
  return std::make_shared<const model::Tokenizer>(std::move(tokenizer.value()));
}

class BridgeTest : public ::testing::Test {
 protected:
  BridgeTest() : sys(configure(cfg)), sched(dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler())) {
    auto context = std::make_shared<ServerContext>();
    context->config.slots.count = 1;
    context->config.slots.queue_limit = 1;
    context->config.slots.retry_after_s = 7;
    context->config.sampling.max_tokens = 6;
    context->system = &sys;
    context->tokenizer = test_tokenizer();
    context->end_token_ids = context->tokenizer->end_of_generation_ids();
    backend = std::make_shared<ferry::testing::ScriptedStage>(1, 64, static_cast<uint32_t>(context->tokenizer->vocab_size()));
    context->engine = actors::spawn_engine(sys, context->config, actors::EngineModel{.pipeline = ferry::testing::pipeline_of({backend}).get()}, false);
    context->phase.store(ServerPhase::ready);
    ctx = context;
  }
  ~BridgeTest() override {
    actors::stop_engine(ctx->engine);
    sched.run();
  }
  static caf::actor_system_config& configure(caf::actor_system_config& c) {
    c.set("scheduler.policy", caf::atom("testing"));
    c.set("logger.file-verbosity", caf::atom("quiet"));
    return c;
  }

  std::shared_ptr<RecordingChannel> start(std::variant<ChatRequest, CompletionRequest> request, bool run = true) {
    auto channel = std::make_shared<RecordingChannel>();
    BridgeJob job;
    job.request = std::move(request);
    job.id = next_id++;
    job.channel = channel;
    job.context = ctx;
    sys.spawn(bridge, std::move(job));
    if (run) sched.run();
    return channel;
  }

  static CompletionRequest completion(std::vector<int32_t> ids, uint32_t max_tokens, bool stream = false) {
    CompletionRequest r;
    r.prompt = std::move(ids);
    r.options.max_tokens = max_tokens;
    r.options.stream = stream;
    return r;
  }

  bool all_slots_idle() {
    auto idle = std::make_shared<bool>(false);
    sys.spawn([this, idle](caf::event_based_actor* self) {
      self->request(ctx->engine.scheduler, caf::infinite, actors::snapshot_atom_v).then([idle](actors::EngineSnapshot& s) {
        *idle = true;
        for (const auto& slot : s.slots) *idle = *idle && !slot.busy;
      });
    });
    sched.run();
    return *idle;
  }

  std::string text_of(int32_t first, int n) const {
    std::vector<int32_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back(first + i);
    return ctx->tokenizer->decode(ids, false);
  }

  caf::actor_system_config cfg;
  caf::actor_system sys;
  caf::scheduler::test_coordinator& sched;
  std::shared_ptr<ferry::testing::ScriptedStage> backend;
  std::shared_ptr<ServerContext> ctx;
  actors::RequestId next_id = 1;
};

}  // namespace

TEST_F(BridgeTest, WholeCompletionCarriesTextUsageAndTokenIds) {
  auto request = completion({300, 301, 302}, 4);
  request.options.return_token_ids = true;
  auto channel = start(request);
  ASSERT_EQ(channel->status, 200u) << channel->body;
  EXPECT_EQ(channel->ends, 1);
  const auto o = bj::parse(channel->body).as_object();
  const auto& choice = o.at("choices").as_array()[0].as_object();
  EXPECT_EQ(choice.at("text").as_string(), text_of(303, 4));
  EXPECT_EQ(choice.at("finish_reason"), "length");
  EXPECT_EQ(choice.at("token_ids").as_array().size(), 4u);
  EXPECT_EQ(o.at("usage").as_object().at("prompt_tokens").to_number<int>(), 3);
  EXPECT_EQ(o.at("usage").as_object().at("completion_tokens").to_number<int>(), 4);
  EXPECT_TRUE(all_slots_idle());
}

TEST_F(BridgeTest, StreamEndsWithFinishUsageAndDone) {
  auto request = completion({300, 301, 302}, 3, true);
  request.options.include_usage = true;
  request.options.return_token_ids = true;
  auto channel = start(request);
  EXPECT_EQ(channel->starts, 1);
  EXPECT_EQ(channel->ends, 1);
  ASSERT_GE(channel->events.size(), 3u);
  EXPECT_EQ(channel->events.back(), "[DONE]");
  size_t ids = 0, finishes = 0;
  std::string text;
  for (size_t i = 0; i + 1 < channel->events.size(); ++i) {
    const auto o = bj::parse(channel->events[i]).as_object();
    if (o.at("choices").as_array().empty()) {
      EXPECT_EQ(i, channel->events.size() - 2);  // the usage chunk comes last, before [DONE]
      EXPECT_EQ(o.at("usage").as_object().at("completion_tokens").to_number<int>(), 3);
      continue;
    }
    const auto& choice = o.at("choices").as_array()[0].as_object();
    text += choice.at("text").as_string();
    if (choice.contains("token_ids")) ids += choice.at("token_ids").as_array().size();
    finishes += choice.at("finish_reason").is_null() ? 0 : 1;
  }
  EXPECT_EQ(text, text_of(303, 3));
  EXPECT_EQ(ids, 3u);  // every token's id reached the client exactly once
  EXPECT_EQ(finishes, 1u);
}

TEST_F(BridgeTest, StopStringEndsTheRequestAndFreesTheSlot) {
  // Find a generated token whose text does not appear earlier in the stream: it is the stop string.
  int32_t first = 300;
  std::string stop;
  for (; first < 1000; ++first) {
    stop = text_of(first + 2, 1);
    if (stop.size() >= 2 && text_of(first, 2).find(stop) == std::string::npos &&
        (text_of(first, 2) + stop).find(stop) == text_of(first, 2).size()) {
      break;
    }
  }
  auto request = completion({first - 1}, 20);
  request.options.stop = {stop};
  auto channel = start(request);
  ASSERT_EQ(channel->status, 200u) << channel->body;
  const auto o = bj::parse(channel->body).as_object();
  const auto& choice = o.at("choices").as_array()[0].as_object();
  EXPECT_EQ(choice.at("text").as_string(), text_of(first, 2));
  EXPECT_EQ(choice.at("finish_reason"), "stop");
  EXPECT_EQ(o.at("usage").as_object().at("completion_tokens").to_number<int>(), 3);
  EXPECT_LT(backend->steps.size(), 20u);  // the engine stopped early
  EXPECT_TRUE(all_slots_idle());
}

TEST_F(BridgeTest, AClientThatStopsReadingCancelsItsRequest) {
  auto request = completion({300}, 40, true);
  auto channel = std::make_shared<RecordingChannel>();
  channel->accept_events = 3;
  BridgeJob job;
  job.request = request;
  job.id = next_id++;
  job.channel = channel;
  job.context = ctx;
  sys.spawn(bridge, std::move(job));
  sched.run();
  EXPECT_EQ(channel->events.size(), 3u);
  EXPECT_EQ(channel->ends, 0);  // nobody to finish the stream for
  EXPECT_LT(backend->steps.size(), 40u);
  EXPECT_TRUE(all_slots_idle());
}

TEST_F(BridgeTest, ClientGoneMidRequestCancelsWithinAStep) {
  auto channel = std::make_shared<RecordingChannel>();
  BridgeJob job;
  job.request = completion({300}, 40, true);
  job.id = next_id++;
  job.channel = channel;
  job.context = ctx;
  auto handle = sys.spawn(bridge, std::move(job));
  while (channel->events.size() < 4 && sched.try_run_once()) {
  }
  const size_t steps_before = backend->steps.size();
  caf::anon_send(handle, actors::client_gone_atom_v);
  caf::anon_send(handle, actors::client_gone_atom_v);  // a second signal changes nothing
  sched.run();
  // The step in flight, and at most one planned before the cancel reached the scheduler.
  EXPECT_LE(backend->steps.size(), steps_before + 2);
  EXPECT_EQ(channel->ends, 0);
  EXPECT_TRUE(all_slots_idle());
}

TEST_F(BridgeTest, BadPromptsAreAnsweredWithoutReachingTheEngine) {
  auto too_long = start(completion(std::vector<int32_t>(64, 5), 1));
  EXPECT_EQ(too_long->status, 400u);
  auto e = bj::parse(too_long->body).as_object().at("error").as_object();
  EXPECT_EQ(e.at("code"), "context_length_exceeded");
  EXPECT_EQ(e.at("param"), "prompt");

  auto over = start(completion({5, 6}, 63));
  EXPECT_EQ(over->status, 400u);
  EXPECT_EQ(bj::parse(over->body).as_object().at("error").as_object().at("param"), "max_tokens");

  auto bad_id = start(completion({5, 999999}, 2));
  EXPECT_EQ(bad_id->status, 400u);
  EXPECT_EQ(bj::parse(bad_id->body).as_object().at("error").as_object().at("param"), "prompt[1]");
  EXPECT_TRUE(backend->steps.empty());
}

TEST_F(BridgeTest, AHugePromptIsRefusedBeforeItIsTokenizedWhole) {
  auto chat_of = [](std::string text) {
    ChatRequest chat;
    chat.messages = model::JsonValue(model::JsonArray{model::JsonValue(
        model::JsonObject{{"role", model::JsonValue("user")}, {"content", model::JsonValue(std::move(text))}})});
    return chat;
  };
  // Its length alone proves it: more bytes than 63 tokens can hold. Then one that needs tokenizing:
  // within the length bound, over the cap (the slot holds 64 tokens).
  for (size_t bytes : {size_t{10} << 20, size_t{2000}}) {
    auto channel = start(chat_of(std::string(bytes, 'a')));
    ASSERT_EQ(channel->status, 400u) << bytes;
    const auto e = bj::parse(channel->body).as_object().at("error").as_object();
    EXPECT_EQ(e.at("code"), "context_length_exceeded");
    EXPECT_EQ(e.at("param"), "messages");
    EXPECT_EQ(e.at("message"), "the prompt has more than 63 tokens; a slot holds 64 tokens (prompt + completion)");
  }
  auto completion_text = CompletionRequest{};
  completion_text.prompt = std::string(5000, 'b');
  auto channel = start(completion_text);
  EXPECT_EQ(channel->status, 400u);
  EXPECT_TRUE(backend->steps.empty());
}

TEST_F(BridgeTest, AFullQueueAnswers429WithRetryAfter) {
  auto first = start(completion({300}, 30), false);
  sched.run(6);  // the first request holds the only slot
  auto second = start(completion({300}, 30), false);
  sched.run(6);  // the second waits in the queue (limit 1)
  auto third = start(completion({300}, 30), false);
  while (third->status == 0 && sched.try_run_once()) {
  }
  EXPECT_EQ(third->status, 429u);
  ASSERT_EQ(third->headers.size(), 1u);
  EXPECT_EQ(third->headers[0].first, "Retry-After");
  EXPECT_EQ(third->headers[0].second, "7");
  sched.run();
  EXPECT_EQ(first->status, 200u);
  EXPECT_EQ(second->status, 200u);
}

TEST_F(BridgeTest, ChatRendersTheTemplateAndParsesReasoning) {
  ChatRequest chat;
  chat.messages = model::JsonValue(model::JsonArray{model::JsonValue(
      model::JsonObject{{"role", model::JsonValue("user")}, {"content", model::JsonValue("hello")}})});
  chat.options.max_tokens = 3;
  auto channel = start(chat);
  ASSERT_EQ(channel->status, 200u) << channel->body;
  const auto o = bj::parse(channel->body).as_object();
  const auto& message = o.at("choices").as_array()[0].as_object().at("message").as_object();
  // The generation prompt ends with <think>; the scripted backend then draws the ids that follow it
  // in the vocabulary: </think> (closing an empty reasoning), <tool_call>, </tool_call>. With no
  // tools in the request, the call is not one: its text stays content.
  EXPECT_FALSE(message.contains("reasoning_content")) << channel->body;
  EXPECT_EQ(message.at("content"), "<tool_call></tool_call>") << channel->body;
  EXPECT_GT(o.at("usage").as_object().at("prompt_tokens").to_number<int>(), 3);
}

// A model that calls a tool: the streamed deltas name it once, carry its arguments in pieces that
// join to the JSON object, and the answer ends with finish_reason "tool_calls".
TEST_F(BridgeTest, ToolCallsStreamAsOpenAiDeltas) {
  const auto& tok = *ctx->tokenizer;
  std::vector<int32_t> script =
      tok.encode("</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
                 "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>",
                 true);
  script.push_back(*tok.special_ids().eom);  // <|observation|>: the turn ends, waiting for the result
  auto replay = std::make_shared<ReplayStage>(script, static_cast<uint32_t>(tok.vocab_size()));
  actors::stop_engine(ctx->engine);
  sched.run();
  ctx->engine = actors::spawn_engine(sys, ctx->config, actors::EngineModel{.pipeline = ferry::testing::pipeline_of({replay}).get()}, false);

  const auto tools = model::parse_json(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}])");
  ASSERT_TRUE(tools.ok());
  for (bool stream : {true, false}) {
    ChatRequest chat;
    chat.messages = model::JsonValue(model::JsonArray{model::JsonValue(
        model::JsonObject{{"role", model::JsonValue("user")}, {"content", model::JsonValue("weather?")}})});
    chat.tools = tools.value();
    chat.options.max_tokens = 40;
    chat.options.stream = stream;
    chat.options.include_usage = true;
    auto channel = start(chat);
    std::string name, arguments, finish;
    std::vector<std::string> ids;
    int completion_tokens = 0;
    if (stream) {
      for (const auto& e : channel->events) {
        if (e == "[DONE]") continue;
        const auto o = bj::parse(e).as_object();
        if (o.at("choices").as_array().empty()) {
          completion_tokens = o.at("usage").as_object().at("completion_tokens").to_number<int>();
          continue;
        }
        const auto& choice = o.at("choices").as_array()[0].as_object();
        if (!choice.at("finish_reason").is_null()) finish = choice.at("finish_reason").as_string();
        const auto& delta = choice.at("delta").as_object();
        EXPECT_FALSE(delta.contains("content") && !delta.at("content").as_string().empty()) << e;
        if (!delta.contains("tool_calls")) continue;
        for (const auto& call : delta.at("tool_calls").as_array()) {
          const auto& c = call.as_object();
          EXPECT_EQ(c.at("index").to_number<int>(), 0);
          if (c.contains("id")) {
            ids.push_back(std::string(c.at("id").as_string()));
            name += c.at("function").as_object().at("name").as_string();
          }
          arguments += c.at("function").as_object().at("arguments").as_string();
        }
      }
    } else {
      ASSERT_EQ(channel->status, 200u) << channel->body;
      const auto o = bj::parse(channel->body).as_object();
      const auto& choice = o.at("choices").as_array()[0].as_object();
      finish = choice.at("finish_reason").as_string();
      const auto& message = choice.at("message").as_object();
      EXPECT_TRUE(message.at("content").is_null());
      const auto& call = message.at("tool_calls").as_array()[0].as_object();
      ids.push_back(std::string(call.at("id").as_string()));
      name = call.at("function").as_object().at("name").as_string();
      arguments = call.at("function").as_object().at("arguments").as_string();
      completion_tokens = o.at("usage").as_object().at("completion_tokens").to_number<int>();
    }
    EXPECT_EQ(ids.size(), 1u) << "stream " << stream << " " << channel->body;
    EXPECT_EQ(name, "get_weather");
    EXPECT_EQ(bj::parse(arguments), bj::parse(R"({"city": "Paris", "days": 3})")) << arguments;
    EXPECT_EQ(finish, "tool_calls");
    EXPECT_EQ(completion_tokens, static_cast<int>(script.size()));
  }
}
