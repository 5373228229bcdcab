// Response bodies are what OpenAI clients parse: field names, nulls, and the usage / timings blocks.
#include "http/responses.hpp"

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include <sstream>

#include "http/metrics_text.hpp"

using namespace ferry::http;
namespace bj = boost::json;

namespace {

bj::object parse(const std::string& text) { return bj::parse(text).as_object(); }

Usage some_usage() {
  Usage u;
  u.usage.prompt_tokens = 10;
  u.usage.cached_tokens = 4;
  u.usage.completion_tokens = 5;
  u.timings.prompt_ms = 30;
  u.timings.predicted_ms = 40;
  return u;
}

}  // namespace

TEST(Responses, ChatCompletionWithToolCallsAndUsage) {
  ChatCompletion c;
  c.id = "chatcmpl-7";
  c.created = 123;
  c.model = "glm-5.3-flash";
  c.reasoning_content = "think";
  c.tool_calls.push_back({"call_7_0", "get_weather", R"({"city": "Paris"})"});
  c.finish_reason = "tool_calls";
  c.token_ids = std::vector<int32_t>{1, 2};
  c.usage = some_usage();
  const auto o = parse(to_json(c));
  EXPECT_EQ(o.at("object"), "chat.completion");
  const auto& choice = o.at("choices").as_array()[0].as_object();
  const auto& message = choice.at("message").as_object();
  EXPECT_EQ(message.at("role"), "assistant");
  EXPECT_TRUE(message.at("content").is_null());  // tool calls and no text: content is null
  EXPECT_EQ(message.at("reasoning_content"), "think");
  const auto& call = message.at("tool_calls").as_array()[0].as_object();
  EXPECT_EQ(call.at("id"), "call_7_0");
  EXPECT_EQ(call.at("type"), "function");
  EXPECT_EQ(call.at("function").as_object().at("arguments"), R"({"city": "Paris"})");
  EXPECT_EQ(choice.at("finish_reason"), "tool_calls");
  EXPECT_EQ(choice.at("token_ids").as_array().size(), 2u);
  const auto& usage = o.at("usage").as_object();
  EXPECT_EQ(usage.at("prompt_tokens").to_number<int>(), 10);
  EXPECT_EQ(usage.at("completion_tokens").to_number<int>(), 5);
  EXPECT_EQ(usage.at("total_tokens").to_number<int>(), 15);
  EXPECT_EQ(usage.at("prompt_tokens_details").as_object().at("cached_tokens").to_number<int>(), 4);
  const auto& timings = o.at("timings").as_object();
  EXPECT_EQ(timings.at("prompt_n").to_number<int>(), 6);
  EXPECT_DOUBLE_EQ(timings.at("prompt_per_second").to_number<double>(), 200.0);
  EXPECT_DOUBLE_EQ(timings.at("predicted_per_second").to_number<double>(), 100.0);  // 4 tokens after the first in 40 ms
}

TEST(Responses, ChunksAnnounceTheRoleThenDeltasThenUsage) {
  ChatChunk first;
  first.id = "chatcmpl-1";
  first.role = true;
  auto o = parse(to_json(first));
  EXPECT_EQ(o.at("object"), "chat.completion.chunk");
  auto delta = o.at("choices").as_array()[0].as_object().at("delta").as_object();
  EXPECT_EQ(delta.at("role"), "assistant");
  EXPECT_TRUE(o.at("choices").as_array()[0].as_object().at("finish_reason").is_null());

  ChatChunk call;
  call.tool_calls.push_back({0, "call_1_0", "f", "{\"a\""});
  call.tool_calls.push_back({0, "", "", ": 1}"});
  o = parse(to_json(call));
  const auto& calls = o.at("choices").as_array()[0].as_object().at("delta").as_object().at("tool_calls").as_array();
  EXPECT_EQ(calls[0].as_object().at("id"), "call_1_0");
  EXPECT_EQ(calls[0].as_object().at("function").as_object().at("name"), "f");
  EXPECT_FALSE(calls[1].as_object().contains("id"));  // later pieces carry only arguments
  EXPECT_EQ(calls[1].as_object().at("function").as_object().at("arguments"), ": 1}");

  ChatChunk usage;
  usage.has_choice = false;
  usage.usage = some_usage();
  o = parse(to_json(usage));
  EXPECT_TRUE(o.at("choices").as_array().empty());
  EXPECT_EQ(o.at("usage").as_object().at("total_tokens").to_number<int>(), 15);
}

TEST(Responses, CompletionModelsErrorAndHealth) {
  Completion c;
  c.id = "cmpl-3";
  c.text = "abc";
  c.finish_reason = "length";
  auto o = parse(to_json(c));
  EXPECT_EQ(o.at("object"), "text_completion");
  EXPECT_EQ(o.at("choices").as_array()[0].as_object().at("text"), "abc");

  o = parse(to_json(ModelList{"glm-5.3-flash", 5, 4096, "", ""}));
  EXPECT_EQ(o.at("data").as_array()[0].as_object().at("id"), "glm-5.3-flash");
  EXPECT_EQ(o.at("data").as_array()[0].as_object().at("synthetic"), false);
  EXPECT_FALSE(o.at("data").as_array()[0].as_object().contains("synthetic_config"));
  o = parse(to_json(ModelList{"glm-5.3-flash", 5, 4096, "configs/glm-5.3-flash.json", "q4_k"}));
  const auto& synthetic = o.at("data").as_array()[0].as_object();
  EXPECT_EQ(synthetic.at("synthetic"), true);
  EXPECT_EQ(synthetic.at("synthetic_config"), "configs/glm-5.3-flash.json");
  EXPECT_EQ(synthetic.at("synthetic_type"), "q4_k");

  o = parse(to_json(invalid_field("messages[1].role", "bad role")));
  const auto& error = o.at("error").as_object();
  EXPECT_EQ(error.at("param"), "messages[1].role");
  EXPECT_EQ(error.at("type"), "invalid_request_error");
  EXPECT_EQ(error.at("message"), "bad role");

  HealthReport loading;
  loading.status = "loading";
  loading.bytes_done = 50;
  loading.bytes_total = 200;
  o = parse(to_json(loading));
  EXPECT_DOUBLE_EQ(o.at("loading").as_object().at("percent").to_number<double>(), 25.0);
  EXPECT_FALSE(o.contains("synthetic"));
  HealthReport serving;
  serving.status = "ok";
  serving.backend = "cuda:0 NVIDIA H200 (SYNTHETIC weights)";
  serving.synthetic = true;
  EXPECT_EQ(parse(to_json(serving)).at("synthetic"), true);
}

TEST(Responses, EngineCausesMapToStatusCodes) {
  using ferry::actors::EndCause;
  EXPECT_EQ(error_for(EndCause::queue_full, "full", 3).status, 429u);
  EXPECT_EQ(error_for(EndCause::queue_full, "full", 3).retry_after_s, 3u);
  EXPECT_EQ(error_for(EndCause::draining, "", 1).status, 503u);
  EXPECT_EQ(error_for(EndCause::too_long, "", 1).code, "context_length_exceeded");
  EXPECT_EQ(error_for(EndCause::backend_failed, "x", 1).status, 500u);
}

TEST(Responses, MetricsAreValidPrometheusText) {
  ServerContext ctx;
  ctx.phase.store(ServerPhase::ready);
  ctx.metrics.count(HttpMetrics::chat, 200);
  ctx.metrics.count(HttpMetrics::chat, 429);
  ferry::actors::EngineSnapshot snap;
  snap.slots.resize(3);
  snap.slots[1].busy = true;
  snap.slots[1].status = ferry::actors::RequestStatus::decoding;
  snap.finished_by_status.assign(8, 0);
  snap.finished_by_status[static_cast<size_t>(ferry::actors::RequestStatus::finished_stop)] = 4;
  ferry::actors::Histogram ttft({0.1, 1});
  ttft.observe(0.05);
  ttft.observe(0.5);
  ttft.observe(5);
  snap.ttft_seconds = ttft.snapshot();
  const std::string text = render_metrics(ctx, snap);
  for (const char* line : {"ferry_up 1\n",
                           "ferry_http_requests_total{endpoint=\"chat_completions\",code=\"429\"} 1\n",
                           "ferry_slots{state=\"idle\"} 2\n", "ferry_slots{state=\"decoding\"} 1\n",
                           "ferry_requests_finished_total{status=\"finished_stop\"} 4\n",
                           "ferry_time_to_first_token_seconds_bucket{le=\"0.1\"} 1\n",
                           "ferry_time_to_first_token_seconds_bucket{le=\"1\"} 2\n",
                           "ferry_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n",
                           "ferry_time_to_first_token_seconds_count 3\n",
                           "# TYPE ferry_time_to_first_token_seconds histogram\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  }
  // promtool's naming rules: a counter ends in _total, nothing else does.
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("# TYPE ", 0) != 0) continue;
    std::istringstream fields(line.substr(7));
    std::string name, type;
    fields >> name >> type;
    const bool total = name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0;
    EXPECT_EQ(total, type == "counter") << line;
  }
}

TEST(Responses, TimingsArePlainDecimals) {
  ChatCompletion c;
  c.id = "chatcmpl-8";
  c.model = "glm-5.3-flash";
  c.usage = some_usage();
  c.usage.timings.prompt_ms = 2.977;
  c.usage.timings.predicted_ms = 1234567.25;
  c.usage.timings.queue_ms = 0.0004;  // rounds to 0
  const std::string text = to_json(c);
  EXPECT_EQ(text.find("E0"), std::string::npos) << text;
  EXPECT_EQ(text.find("e+"), std::string::npos) << text;
  EXPECT_NE(text.find("\"prompt_ms\":2.977,"), std::string::npos) << text;
  EXPECT_NE(text.find("\"predicted_ms\":1234567.25,"), std::string::npos) << text;
  EXPECT_NE(text.find("\"queue_ms\":0,"), std::string::npos) << text;
  const auto o = parse(text);  // still JSON, same values
  EXPECT_DOUBLE_EQ(o.at("timings").as_object().at("prompt_ms").to_number<double>(), 2.977);
}
