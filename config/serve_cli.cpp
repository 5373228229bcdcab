#include "config/serve_cli.hpp"

#include <algorithm>
#include <cctype>

#include "config/api_key_file.hpp"
#include "config/byte_size.hpp"

namespace ferry::config {

template <class T>
CLI::Option* ServeCli::add(const char* section, const std::string& name, T& value, const std::string& help) {
  sections_[name] = section;
  std::string group = section;
  group[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(group[0])));
  return cmd_.add_option("--" + name, value, help)->group(group);
}

ServeCli::ServeCli(CLI::App& cmd) : cmd_(cmd) {
  ServeConfig& c = config_;
  max_body_ = format_byte_size(c.server.max_body_bytes);
  cmd.add_option("--config", config_file_,
                 "TOML file setting any of these options by name, at the top level or in its section "
                 "([server] port = 9527); the command line wins over it")
      ->check(CLI::ExistingFile);

  add("model", "model", c.model.path, "GGUF model file (default: the small model embedded in ferry)");
  add("model", "model-id", c.model.id, "model name in the API")->capture_default_str();
  add("model", "synthetic", c.model.synthetic_config,
      "config.json of a glm5_next shape: serve deterministic pseudo-random weights of it, made on the GPU "
      "(speed and memory only; the answers mean nothing)");
  add("model", "type", c.model.synthetic_type, "ggml type of the synthetic weights' large matrices")
      ->capture_default_str();
  add("model", "recipe", c.model.synthetic_recipe,
      "with --synthetic: REGEX=TYPE rules per tensor, as ferry convert --recipe (e.g. "
      "model/glm5/recipes/maya-l.recipe); --type for the tensors no rule names")
      ->check(CLI::ExistingFile);
  add("model", "synthetic-seed", c.model.synthetic_seed, "seed of the synthetic weights")->capture_default_str();
  add("model", "route-skew", c.model.route_skew,
      "with --synthetic: routers prefer experts by a stable random rank, choice score -S*ln(rank) (0: none)")
      ->capture_default_str();
  add("model", "tokenizer", c.model.tokenizer_path,
      "with --synthetic: a GGUF file or Hugging Face tokenizer directory to read text with (default: a "
      "placeholder where ids 0-255 are bytes and id N >= 256 is the text <|tN|>)");

  add("devices", "backend", c.devices.backend, "compute backend: cpu, cuda, or auto (cuda when there is a GPU)")
      ->capture_default_str();
  add("devices", "threads", c.devices.threads, "CPU backend threads (0: every core)")->capture_default_str();
  add("devices", "devices", devices_, "CUDA devices the stages run on, e.g. 0,1,2,3 (default: 0)");
  add("devices", "split", split_,
      "pipeline stages: the first layer of each stage after the first (11,23,34 = four stages), auto (one "
      "stage per device, of about equal weight bytes) or none")
      ->capture_default_str();
  add("devices", "micro-batches", c.devices.split.micro_batches,
      "decode micro-batches kept in flight through the stages (0: one per device in use)")
      ->capture_default_str();

  for_each_memory_option(memory_, [&](const std::string& name, std::string& value, const std::string& help) {
    add("memory", name, value, help)->capture_default_str();
  });

  add("slots", "slots", c.slots.count, "concurrent requests")->capture_default_str();
  add("slots", "ctx", c.slots.ctx, "tokens per slot, prompt + completion")->capture_default_str();
  add("slots", "kv-type", c.slots.kv_type, "DSA latent rows: f32, f16, int8 or auto (int8 on CUDA, f32 on the CPU)")
      ->capture_default_str();
  add("slots", "kv-resident", c.slots.kv_resident,
      "CUDA: DSA latent rows per layer and slot kept on the device; a longer context keeps the rest in pinned host "
      "memory (0: the whole context on the device; default: the whole context when every slot's rows fit beside "
      "the weights, experts and the rest of the memory plan, else 32768)");
  add("slots", "kv-host-budget", c.slots.kv_host_budget_gib,
      "GiB of host RAM the host KV tier may take (0: what slots x ctx need, counted against --ram-floor)")
      ->capture_default_str();
  add("slots", "prefill-chunk", c.slots.prefill_chunk, "prompt tokens per step")->capture_default_str();
  add("slots", "mtp", c.slots.mtp,
      "speculative decoding with the model's MTP block (CPU backend): auto (drafts per "
      "acceptance), off, or K drafts a step (1..3)")
      ->capture_default_str();
  add("slots", "queue-limit", c.slots.queue_limit, "requests waiting for a slot before 429")->capture_default_str();
  add("slots", "retry-after", c.slots.retry_after_s, "seconds, sent as Retry-After with 429 and 503")
      ->capture_default_str();
  add("slots", "checkpoint-budget", c.slots.checkpoint_budget_gib,
      "GiB of host RAM for prefix-cache checkpoints (slot states a later prompt with the same start resumes; 0: none)")
      ->capture_default_str();
  add("slots", "checkpoint-every", c.slots.checkpoint_every, "prompt tokens between checkpoints of a long prefill")
      ->capture_default_str();

  add("server", "host", c.server.host, "address to listen on")->capture_default_str();
  add("server", "port", c.server.port, "port to listen on (0: any free port)")->capture_default_str();
  add("server", "api-key", c.server.api_key, "require 'Authorization: Bearer KEY' (also $FERRY_API_KEY)")
      ->envname("FERRY_API_KEY");
  add("server", "api-key-file", c.server.api_key_file,
      "file of API keys, one per line, each accepted like --api-key; with several keys a request can be "
      "cancelled only with the key that made it")
      ->check(CLI::ExistingFile);
  add("server", "http-threads", c.server.http_threads, "threads running HTTP connections")->capture_default_str();
  add("server", "max-body", max_body_, "largest request body (e.g. 16MiB)")->capture_default_str();
  add("server", "sse-queue-limit", c.server.sse_queue_limit,
      "SSE events a client may leave unread before it is dropped")
      ->capture_default_str();
  add("server", "max-connections", c.server.max_connections,
      "open connections at most; at the limit a new one closes the longest-idle connection, else gets 503 "
      "(0: half the open-file limit, at most 32768)")
      ->capture_default_str();
  add("server", "read-timeout", c.server.read_timeout_s,
      "seconds a client has to send a whole request (headers and body) from its first byte, or from the "
      "accept on a new connection")
      ->capture_default_str();
  add("server", "idle-timeout", c.server.idle_timeout_s, "seconds a kept-alive connection may wait for its next request")
      ->capture_default_str();
  add("server", "drain-timeout", c.server.drain_timeout_s, "seconds running requests get to finish at shutdown")
      ->capture_default_str();
  add("server", "admin-token", c.server.admin_token,
      "token of the admin console (/admin, /admin/ws), not an API key (also $FERRY_ADMIN_TOKEN); without one the "
      "console answers only where it listens on a loopback address")
      ->envname("FERRY_ADMIN_TOKEN");
  add("server", "admin-port", c.server.admin_port,
      "serve the admin console on this port of --admin-host instead of the API's port (0: on the API's port)")
      ->capture_default_str();
  add("server", "admin-host", c.server.admin_host, "address of the admin console's own port (with --admin-port)")
      ->capture_default_str();
  add("server", "admin-queue-limit", c.server.admin_queue_limit,
      "messages an admin console may leave unread before it is dropped")
      ->capture_default_str();
  add("server", "telemetry-interval", c.server.telemetry_interval_ms,
      "milliseconds: a busy actor reports to the admin actor at most this often")
      ->capture_default_str();
  add("server", "log-format", c.server.log_format, "log lines as text or json (one object per line)")
      ->capture_default_str();

  add("sampling", "temperature", c.sampling.temperature, "default sampling temperature (0: greedy)")
      ->capture_default_str();
  add("sampling", "top-p", c.sampling.top_p, "default top-p")->capture_default_str();
  add("sampling", "top-k", c.sampling.top_k, "default top-k (0: off)")->capture_default_str();
  add("sampling", "min-p", c.sampling.min_p, "default min-p (0: off)")->capture_default_str();
  add("sampling", "max-tokens", c.sampling.max_tokens, "completion tokens when a request sets no limit")
      ->capture_default_str();
  add("sampling", "reasoning-effort", c.sampling.reasoning_effort,
      "thinking effort of a chat request that names none: low, medium, high, xhigh or max (default: the chat "
      "template's, max)");

  cmd.add_option("--inject-fault", inject_fault_,
                 "test hook: fail one step as a device would, STEP:STAGE:CODE (e.g. 3:0:device_error)")
      ->group("");
}

// CLI11 reads config files for the top-level app only, so the serve options take the TOML file
// here: each key must name an option of `ferry serve` (in its own section, if in one); one given on
// the command line keeps its value.
std::vector<std::string> ServeCli::apply_config_file(const std::string& path) {
  std::vector<std::string> errors;
  std::vector<CLI::ConfigItem> items;
  try {
    items = CLI::ConfigTOML().from_file(path);
  } catch (const CLI::Error& e) {
    return {"--config " + path + ": " + e.what()};
  }
  for (const CLI::ConfigItem& item : items) {
    if (item.name == "++" || item.name == "--") continue;  // a table opens or closes
    std::string name = item.name;
    std::replace(name.begin(), name.end(), '_', '-');
    CLI::Option* option = cmd_.get_option_no_throw("--" + name);
    const auto section = sections_.find(name);
    if (option == nullptr || section == sections_.end()) {
      errors.push_back("--config " + path + ": unknown option '" + item.fullname() + "' (see ferry serve --help)");
      continue;
    }
    if (item.parents.size() > 1 || (item.parents.size() == 1 && item.parents[0] != section->second)) {
      errors.push_back("--config " + path + ": '" + item.fullname() + "' belongs in [" + section->second +
                       "] or at the top level");
      continue;
    }
    if (option->count() > 0) continue;
    try {
      option->add_result(item.inputs);
      option->run_callback();
    } catch (const CLI::Error& e) {
      errors.push_back("--config " + path + ": " + item.fullname() + ": " + e.what());
    }
  }
  return errors;
}

std::vector<std::string> ServeCli::finish() {
  std::vector<std::string> errors;
  if (!config_file_.empty()) errors = apply_config_file(config_file_);
  if (!errors.empty()) return errors;
  auto body_limit = parse_byte_size(max_body_);
  if (!body_limit) errors.push_back("--max-body: " + body_limit.error().message);
  else config_.server.max_body_bytes = *body_limit;
  if (auto e = parse_split(split_, config_.devices.split)) errors.push_back(e->message);
  for (auto& e : parse_memory_options(memory_, config_.memory)) errors.push_back(std::move(e));
  if (!devices_.empty()) {
    if (auto e = parse_devices(devices_, config_.devices.split)) errors.push_back(e->message);
  }
  if (!inject_fault_.empty()) {
    auto fault = parse_fault(inject_fault_);
    if (fault) config_.inject_fault = fault.value();
    else errors.push_back(fault.error().message);
  }
  if (!config_.server.api_key_file.empty()) {
    auto keys = read_api_key_file(config_.server.api_key_file);
    if (keys) config_.server.file_api_keys = std::move(*keys);
    else errors.push_back(keys.error().message);
  }
  for (auto& e : validate(config_)) errors.push_back(std::move(e));
  return errors;
}

}  // namespace ferry::config
