#pragma once
// The typed configuration of `ferry serve`: every option with its default and unit, in one place, in
// the sections a TOML file names ([model], [devices], [slots], [server], [sampling]). The command line
// and the TOML file fill it (config/serve_cli.hpp); validate() checks it and names each bad field, its
// value and what was expected.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/expected.hpp"
#include "config/stage_split.hpp"

namespace ferry::config {

struct ModelConfig {
  std::string path;                  // GGUF file; empty = the default model embedded in ferry
  std::string id = "glm-5.3-flash";  // the name /v1/models reports and requests may use
  // Synthetic weights instead of a file: deterministic pseudo-random values of the glm5_next shape in
  // this config.json, made on the GPU (benchmarks of shapes the disk cannot hold; the answers mean
  // nothing). No tokenizer comes with them: `tokenizer_path` (a GGUF file or a Hugging Face tokenizer
  // directory) gives one, else a placeholder (ids 0-255 are bytes, the rest "<|tN|>").
  std::string synthetic_config;
  std::string synthetic_type = "q4_k";  // ggml type of the large matrices
  std::string synthetic_recipe;         // REGEX=TYPE rules per tensor (ferry convert --recipe); empty: none
  uint64_t synthetic_seed = 1;
  std::string tokenizer_path;
};

// Where the layers run: the backend, the devices and the split of the trunk into pipeline stages.
struct DevicesConfig {
  std::string backend = "auto";  // cpu, cuda, or auto (cuda when built with it and a GPU is visible)
  uint32_t threads = 0;          // CPU backend threads; 0 = every core
  StageSplit split;              // --devices and --split
};

struct SlotsConfig {
  uint32_t count = 3;             // concurrent requests
  uint32_t ctx = 524288;          // tokens per slot: prompt + completion
  uint32_t prefill_chunk = 4096;  // prompt tokens per step, at most one chunk per step
  uint32_t queue_limit = 64;      // requests waiting for a slot before 429
  uint32_t retry_after_s = 1;     // Retry-After sent with 429
};

struct ServerConfig {
  std::string host = "127.0.0.1";
  uint16_t port = 9527;                  // 0 = any free port (the chosen one is logged)
  std::string api_key;                   // empty = no authentication
  uint32_t http_threads = 2;             // threads running the HTTP sessions
  uint64_t max_body_bytes = 16ull << 20;  // largest request body accepted (413 above)
  uint32_t sse_queue_limit = 4096;       // pending SSE events per connection before it counts as stalled
  double idle_timeout_s = 300;           // a connection that sends nothing for this long is closed
  double drain_timeout_s = 30;           // on SIGTERM/SIGINT: time running requests get to finish
};

// Used when a request does not say otherwise.
struct SamplingDefaults {
  float temperature = 1.0f;     // 0 = greedy
  float top_p = 0.95f;          // 1 = off
  uint32_t top_k = 0;           // 0 = off
  float min_p = 0.0f;           // 0 = off
  uint32_t max_tokens = 32768;  // completion tokens when the request sets no limit
};

// Test hook: one step made to fail as a device would, so the failure path can be tested end to end.
struct InjectedFault {
  uint64_t step = 0;
  uint32_t stage = 0;
  ErrorCode code = ErrorCode::device_error;
};
// "STEP:STAGE:CODE" (e.g. "3:0:device_error"); the error names what is wrong.
Expected<InjectedFault> parse_fault(const std::string& text);

struct ServeConfig {
  ModelConfig model;
  DevicesConfig devices;
  SlotsConfig slots;
  ServerConfig server;
  SamplingDefaults sampling;
  std::optional<InjectedFault> inject_fault;  // --inject-fault; none in any real run
};

// Empty when the configuration is usable; else one line per problem, naming the option, its value
// and what it must be.
std::vector<std::string> validate(const ServeConfig& config);

}  // namespace ferry::config
