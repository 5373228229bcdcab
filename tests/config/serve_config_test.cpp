#include "config/serve_config.hpp"

#include <gtest/gtest.h>

using ferry::config::ServeConfig;
using ferry::config::validate;

TEST(ServeConfig, DefaultsAreValid) {
  const ServeConfig c;
  EXPECT_TRUE(validate(c).empty());
  EXPECT_EQ(c.server.host, "127.0.0.1");
  EXPECT_EQ(c.server.port, 9527);
  EXPECT_EQ(c.slots.count, 3u);
  EXPECT_EQ(c.slots.ctx, 524288u);
  EXPECT_EQ(c.slots.prefill_chunk, 4096u);
  EXPECT_EQ(c.model.id, "glm-5.3-flash");
}

TEST(ServeConfig, EachProblemNamesTheOptionAndTheValue) {
  ServeConfig c;
  c.slots.count = 0;
  c.devices.backend = "tpu";
  c.sampling.top_p = 0;
  const auto errors = validate(c);
  ASSERT_EQ(errors.size(), 3u);
  EXPECT_EQ(errors[0], "--backend = tpu: expected cpu, cuda or auto");
  EXPECT_NE(errors[1].find("--slots = 0"), std::string::npos);
  EXPECT_NE(errors[2].find("--top-p = 0"), std::string::npos);
}

TEST(ServeConfig, SyntheticWeightsNeedAConfigTheGpuAndNoModelFile) {
  ServeConfig c;
  c.model.synthetic_config = FERRY_SOURCE_DIR "/tests/fixtures/glm5/serve_tiny/config.json";
  c.devices.backend = "cuda";
  EXPECT_TRUE(validate(c).empty());
  c.devices.backend = "cpu";
  c.model.path = FERRY_SOURCE_DIR "/tests/fixtures/glm5/serve_tiny/config.json";
  auto errors = validate(c);
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[0], "--model = " FERRY_SOURCE_DIR
                       "/tests/fixtures/glm5/serve_tiny/config.json: expected no --model with --synthetic (the "
                       "weights are made, not read)");
  EXPECT_EQ(errors[1], "--backend = cpu: expected cuda or auto with --synthetic, which makes its weights on the GPU");
  c = ServeConfig{};
  c.model.synthetic_config = "/nonexistent/config.json";
  c.model.tokenizer_path = "/nonexistent/tokenizer";
  c.devices.backend = "auto";
  errors = validate(c);
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_NE(errors[0].find("--synthetic = /nonexistent/config.json: expected an existing config.json"), std::string::npos);
  EXPECT_NE(errors[1].find("--tokenizer = /nonexistent/tokenizer"), std::string::npos);
  c = ServeConfig{};
  c.model.tokenizer_path = FERRY_SOURCE_DIR "/tests/fixtures/glm5/serve_tiny/config.json";
  errors = validate(c);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("only with --synthetic"), std::string::npos);
}

TEST(ServeConfig, ConnectionLimitsAndReadDeadline) {
  ServeConfig c;
  EXPECT_EQ(c.server.max_connections, 0u);  // auto: from the open-file limit at start
  EXPECT_LT(c.server.read_timeout_s, c.server.idle_timeout_s);
  c.server.read_timeout_s = 0;
  c.server.max_connections = 2000000;
  const auto errors = validate(c);
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[0], "--read-timeout = 0: expected seconds in (0, 3600]");
  EXPECT_EQ(errors[1], "--max-connections = 2000000: expected 0 (auto) to 1000000 connections");
}

TEST(ServeConfig, KvWindowAndHostBudgetDefaultsAndBounds) {
  ServeConfig c;
  EXPECT_FALSE(c.slots.kv_resident);  // the memory plan's choice
  EXPECT_EQ(c.slots.kv_host_budget_gib, 0.0);  // derived
  c.slots.kv_host_budget_gib = -1;
  const auto errors = validate(c);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0], "--kv-host-budget = -1: expected GiB in [0, 65536]");
}

TEST(ServeConfig, KvTypeIsAutoOrAFormat) {
  ServeConfig c;
  EXPECT_EQ(c.slots.kv_type, "auto");
  for (const char* t : {"f32", "f16", "int8"}) {
    c.slots.kv_type = t;
    EXPECT_TRUE(validate(c).empty()) << t;
  }
  c.slots.kv_type = "q4";
  const auto errors = validate(c);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0], "--kv-type = q4: expected f32, f16, int8 or auto");
}
