#pragma once
// The typed configuration of `ferry serve`: every option with its default and unit, in one place, in
// the sections a TOML file names ([model], [devices], [memory], [slots], [server], [sampling]). The command line
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
  // Synthetic routers prefer experts by a stable random rank: each expert's choice score gets
  // -route_skew * ln(rank) (0: no preference; real models route far from uniformly).
  float route_skew = 0;
  std::string tokenizer_path;
};

// Where the layers run: the backend, the devices and the split of the trunk into pipeline stages.
struct DevicesConfig {
  std::string backend = "auto";  // cpu, cuda, or auto (cuda when built with it and a GPU is visible)
  uint32_t threads = 0;          // CPU backend threads; 0 = every core
  StageSplit split;              // --devices and --split
};

// Where the routed experts live when the devices cannot hold them all: a pool on each device and the
// host expert store (pinned RAM), within these budgets. Sizes are bytes.
struct MemoryConfig {
  std::vector<uint64_t> expert_pool_caps;       // per device in use (--expert-pool-cap); empty: what each has left
  std::optional<uint64_t> host_expert_budget;   // the experts no pool holds (--host-expert-budget); none: as needed
  uint64_t expert_shadow = 8ull << 30;          // host copies of pooled experts, kept for cheap eviction
  uint64_t ram_floor = 20ull << 30;             // RAM kept free (--ram-floor)
  uint64_t device_margin = 3ull << 29;          // device memory left for the CUDA context, cuBLAS and graphs
  uint64_t prefill_staging = 2ull << 30;        // per stage: room to upload a layer's missing experts, twice
  std::string miss_path = "auto";               // prefill misses: auto, mapped (read host memory) or upload
  std::string expert_stats;                     // route counts saved at shutdown, read at start (warm start)
};

struct SlotsConfig {
  uint32_t count = 3;             // concurrent requests
  uint32_t ctx = 524288;          // tokens per slot: prompt + completion
  std::string kv_type = "auto";   // DSA latent rows: f32, f16, int8, or auto (int8 on CUDA, f32 on the CPU)
  // CUDA: latent rows per DSA layer and slot on the device (0: the whole context); unset: the memory
  // plan's choice (every row when they fit beside the rest, else a window of 32,768).
  std::optional<uint32_t> kv_resident;
  double kv_host_budget_gib = 0;  // host RAM for the host KV tier past the window (0: its need, within the RAM floor)
  uint32_t prefill_chunk = 4096;  // prompt tokens per step, at most one chunk per step
  uint32_t queue_limit = 64;      // requests waiting for a slot before 429
  uint32_t retry_after_s = 1;     // Retry-After sent with 429
  std::string mtp = "off";        // speculative decoding with the MTP block: auto, off or drafts K (1..3)
  // The prefix cache: copies of slots' states (KDA state, DSA rows) in host RAM, resumed by a later
  // request whose prompt starts with the same tokens. 0 GiB: no checkpoints, only what slots hold.
  double checkpoint_budget_gib = 8;
  uint32_t checkpoint_every = 4096;  // prompt tokens between checkpoints of a long prefill
};

struct ServerConfig {
  std::string host = "127.0.0.1";
  uint16_t port = 9527;                  // 0 = any free port (the chosen one is logged)
  std::string api_key;                   // empty (and no api_key_file) = no authentication
  // More keys, one per line (blank lines and lines starting with '#' skipped). With several keys, a
  // request can be cancelled only with the key that made it.
  std::string api_key_file;
  std::vector<std::string> file_api_keys;  // the keys read from api_key_file (ServeCli::finish fills it)
  uint32_t http_threads = 2;             // threads running the HTTP sessions
  uint64_t max_body_bytes = 16ull << 20;  // largest request body accepted (413 above)
  uint32_t sse_queue_limit = 4096;       // pending SSE events per connection before it counts as stalled
  // Open connections at most. At the limit a new connection closes the longest-idle one (no request in
  // progress), else it gets a 503. 0 = auto: half the open-file limit (which ferry raises to its hard
  // limit at start), at most 32768.
  uint32_t max_connections = 0;
  double read_timeout_s = 30;            // a request's headers and body must arrive within this, counted
                                         // from its first byte (from the accept for a new connection)
  double idle_timeout_s = 300;           // a kept-alive connection may wait this long for its next request
  double drain_timeout_s = 30;           // on SIGTERM/SIGINT: time running requests get to finish
  // The admin console: the /admin page and the /admin/ws WebSocket (messages: http/admin_json.hpp).
  std::string admin_token;               // the console's token, not an API key; empty: the console
                                         // answers only where it listens on a loopback address
  uint16_t admin_port = 0;               // 0 = on the API's port; else on its own listener
  std::string admin_host = "127.0.0.1";  // with admin_port: the address the console listens on
  uint32_t admin_queue_limit = 64;       // messages a console may leave unread before it is dropped
  double telemetry_interval_ms = 50;     // a busy actor reports to the admin actor at most this often
  std::string log_format = "text";       // text, or json: one JSON object per line
};

// Used when a request does not say otherwise.
struct SamplingDefaults {
  float temperature = 1.0f;     // 0 = greedy
  float top_p = 0.95f;          // 1 = off
  uint32_t top_k = 0;           // 0 = off
  float min_p = 0.0f;           // 0 = off
  uint32_t max_tokens = 32768;  // completion tokens when the request sets no limit
  std::string reasoning_effort;  // a chat request's thinking effort when it gives none (low, medium,
                                 // high, xhigh, max); empty: the chat template's own (max)
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
  MemoryConfig memory;
  SlotsConfig slots;
  ServerConfig server;
  SamplingDefaults sampling;
  std::optional<InjectedFault> inject_fault;  // --inject-fault; none in any real run
};

// Empty when the configuration is usable; else one line per problem, naming the option, its value
// and what it must be.
std::vector<std::string> validate(const ServeConfig& config);

}  // namespace ferry::config
