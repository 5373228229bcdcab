// `ferry serve`: the OpenAI-compatible server. The HTTP server listens first (so /health answers
// "loading" with progress), then the model loads, then the engine graph starts. SIGTERM / SIGINT
// drain: new requests get 503, running ones get --drain-timeout to finish, the rest are cancelled
// with an error event, and the process exits 0 once every slot is idle.
#include <csignal>
#include <pthread.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <thread>

#include "actors/bootstrap.hpp"
#include "config/byte_size.hpp"
#include "config/serve_config.hpp"
#include "gpu/backend_factory.hpp"
#include "http/http_server.hpp"
#include "http/server_context.hpp"
#include "tools/ferry/commands.hpp"
#include "tools/ferry/serve_model.hpp"

namespace ferry::cli {
namespace {

struct ServeOptions {
  config::ServeConfig config;
  std::string max_body = config::format_byte_size(config::ServeConfig{}.max_body_bytes);  // the default, as text
  std::string config_file;
};

void add_options(CLI::App& cmd, ServeOptions& o) {
  config::ServeConfig& c = o.config;
  cmd.add_option("--config", o.config_file,
                 "TOML file setting any of these options by name (slots = 3, model-id = \"x\"); "
                 "the command line wins over it")
      ->check(CLI::ExistingFile);
  cmd.add_option("--model", c.model_path, "GGUF model file (default: the small model embedded in ferry)");
  cmd.add_option("--synthetic", c.synthetic_config,
                 "config.json of a glm5_next shape: serve deterministic pseudo-random weights of it, made on the GPU "
                 "(speed and memory only; the answers mean nothing)");
  cmd.add_option("--type", c.synthetic_type, "ggml type of the synthetic weights' large matrices")->capture_default_str();
  cmd.add_option("--synthetic-seed", c.synthetic_seed, "seed of the synthetic weights")->capture_default_str();
  cmd.add_option("--tokenizer", c.tokenizer_path,
                 "with --synthetic: a GGUF file or Hugging Face tokenizer directory to read text with (default: a "
                 "placeholder where ids 0-255 are bytes and id N >= 256 is the text <|tN|>)");
  cmd.add_option("--backend", c.backend, "compute backend: cpu, cuda, or auto (cuda when there is a GPU)")
      ->capture_default_str();
  cmd.add_option("--threads", c.threads, "CPU backend threads (0: every core)")->capture_default_str();
  cmd.add_option("--model-id", c.model_id, "model name in the API")->capture_default_str();
  cmd.add_option("--host", c.host, "address to listen on")->capture_default_str();
  cmd.add_option("--port", c.port, "port to listen on (0: any free port)")->capture_default_str();
  cmd.add_option("--api-key", c.api_key, "require 'Authorization: Bearer KEY' (also $FERRY_API_KEY)")
      ->envname("FERRY_API_KEY");
  cmd.add_option("--http-threads", c.http_threads, "threads running HTTP connections")->capture_default_str();
  cmd.add_option("--max-body", o.max_body, "largest request body (e.g. 16MiB)")->capture_default_str();
  cmd.add_option("--sse-queue-limit", c.sse_queue_limit, "SSE events a client may leave unread before it is dropped")
      ->capture_default_str();
  cmd.add_option("--idle-timeout", c.idle_timeout_s, "seconds a connection may stay silent")->capture_default_str();
  cmd.add_option("--slots", c.slots, "concurrent requests")->capture_default_str();
  cmd.add_option("--ctx", c.ctx, "tokens per slot, prompt + completion (capped by the model)")->capture_default_str();
  cmd.add_option("--prefill-chunk", c.prefill_chunk, "prompt tokens per step")->capture_default_str();
  cmd.add_option("--queue-limit", c.queue_limit, "requests waiting for a slot before 429")->capture_default_str();
  cmd.add_option("--retry-after", c.retry_after_s, "seconds, sent as Retry-After with 429 and 503")->capture_default_str();
  cmd.add_option("--drain-timeout", c.drain_timeout_s, "seconds running requests get to finish at shutdown")
      ->capture_default_str();
  cmd.add_option("--temperature", c.sampling.temperature, "default sampling temperature (0: greedy)")->capture_default_str();
  cmd.add_option("--top-p", c.sampling.top_p, "default top-p")->capture_default_str();
  cmd.add_option("--top-k", c.sampling.top_k, "default top-k (0: off)")->capture_default_str();
  cmd.add_option("--min-p", c.sampling.min_p, "default min-p (0: off)")->capture_default_str();
  cmd.add_option("--max-tokens", c.sampling.max_tokens, "completion tokens when a request sets no limit")
      ->capture_default_str();
}

// SIGINT / SIGTERM are blocked in every thread and taken by one waiting thread: no async-signal
// handler, no polling. The first asks for a drain; a second one ends the process at once.
class SignalWaiter {
 public:
  SignalWaiter() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);  // threads started after this inherit the mask
    std::signal(SIGPIPE, SIG_IGN);
    thread_ = std::thread([this] {
      int sig = 0;
      sigwait(&set_, &sig);
      signal_.store(sig);
      stop.store(true);
      stop.notify_all();
      sigwait(&set_, &sig);
      spdlog::warn("second signal ({}): exiting without draining", strsignal(sig));
      std::_Exit(1);
    });
    thread_.detach();  // it ends with the process
  }
  int signal() const { return signal_.load(); }
  std::atomic<bool> stop{false};

 private:
  sigset_t set_;
  std::atomic<int> signal_{0};
  std::thread thread_;
};

// CLI11 reads config files for the top-level app only, so the serve options take the TOML file
// here: each key must name an option of `ferry serve`; one given on the command line keeps its value.
std::vector<std::string> apply_config_file(CLI::App& cmd, const std::string& path) {
  std::vector<std::string> errors;
  std::vector<CLI::ConfigItem> items;
  try {
    items = CLI::ConfigTOML().from_file(path);
  } catch (const CLI::Error& e) {
    return {"--config " + path + ": " + e.what()};
  }
  for (const CLI::ConfigItem& item : items) {
    if (item.name == "++" || item.name == "--") {
      errors.push_back("--config " + path + ": sections are not used; write the options at the top level");
      continue;
    }
    std::string name = item.fullname();
    std::replace(name.begin(), name.end(), '_', '-');
    CLI::Option* option = cmd.get_option_no_throw("--" + name);
    if (option == nullptr || name == "config" || name == "help") {
      errors.push_back("--config " + path + ": unknown option '" + item.fullname() + "' (see ferry serve --help)");
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

int serve(CLI::App& cmd, ServeOptions& options) {
  if (!options.config_file.empty()) {
    const auto errors = apply_config_file(cmd, options.config_file);
    for (const auto& e : errors) std::fprintf(stderr, "ferry serve: %s\n", e.c_str());
    if (!errors.empty()) return 2;
  }
  config::ServeConfig& config = options.config;
  auto body_limit = config::parse_byte_size(options.max_body);
  std::vector<std::string> errors;
  if (auto* e = std::get_if<config::ByteSizeError>(&body_limit)) errors.push_back("--max-body: " + e->message);
  else config.max_body_bytes = std::get<uint64_t>(body_limit);
  for (auto& e : config::validate(config)) errors.push_back(std::move(e));
  if (!errors.empty()) {
    for (const auto& e : errors) std::fprintf(stderr, "ferry serve: %s\n", e.c_str());
    return 2;
  }
  // Signals are blocked before the first CUDA call below: the driver's threads would otherwise
  // take SIGTERM with its default action and kill the process instead of draining it.
  SignalWaiter signals;
  // Known before listening: a ferry built without CUDA, or a machine without a GPU, cannot serve
  // --backend cuda, nor synthetic weights, which are made on the GPU.
  const bool synthetic = !config.synthetic_config.empty();
  if (auto kind = gpu::resolve_backend_kind(synthetic ? "cuda" : config.backend); !kind) {
    std::fprintf(stderr, "ferry serve: %s: %s\n", synthetic ? "--synthetic needs a GPU" : "--backend",
                 kind.error().c_str());
    return 2;
  }
  std::variant<std::string, LoadError> model_path;
  std::variant<SyntheticSource, LoadError> synthetic_source = LoadError{};
  const LoadError* source_error = nullptr;
  if (synthetic) {
    synthetic_source = read_synthetic_source(config);
    source_error = std::get_if<LoadError>(&synthetic_source);
  } else {
    model_path = resolve_model_path(config);
    source_error = std::get_if<LoadError>(&model_path);
  }
  if (source_error != nullptr) {
    std::fprintf(stderr, "ferry serve: %s\n", source_error->message.c_str());
    return 2;
  }
  if (synthetic) {
    spdlog::warn("SYNTHETIC WEIGHTS: pseudo-random {} values of the shape in {} (seed {}), no trained model: the "
                 "answers mean nothing; for speed and memory measurements only",
                 config.synthetic_type, config.synthetic_config, config.synthetic_seed);
  }

  caf::actor_system_config caf_config;
  actors::configure_actor_system(caf_config);
  caf::actor_system system{caf_config};

  auto context = std::make_shared<http::ServerContext>();
  context->config = config;
  context->system = &system;
  context->started_unix = static_cast<int64_t>(std::time(nullptr));
  context->progress.stage_name = synthetic ? "synthetic weights of " + config.synthetic_config
                                 : config.model_path.empty() ? "the default model"
                                                             : config.model_path;

  boost::asio::io_context ioc;
  auto work = boost::asio::make_work_guard(ioc);
  http::HttpServer server(ioc, context);
  if (std::string error = server.listen(config.host, config.port); !error.empty()) {
    std::fprintf(stderr, "ferry serve: %s\n", error.c_str());
    return 1;
  }
  std::vector<std::thread> io_threads;
  for (uint32_t i = 0; i < config.http_threads; ++i) io_threads.emplace_back([&ioc] { ioc.run(); });
  spdlog::info("listening on http://{}:{} (GET /health reports loading progress)", config.host, server.port());

  auto stop_http = [&] {
    server.close();
    work.reset();
    ioc.stop();
    for (auto& t : io_threads) t.join();
  };

  auto loaded = synthetic ? load_synthetic(std::get<SyntheticSource>(synthetic_source), config)
                          : load_model(std::get<std::string>(model_path), config, context->progress, signals.stop);
  if (auto* e = std::get_if<LoadError>(&loaded)) {
    if (signals.stop.load()) {
      spdlog::info("{} while loading: exiting", strsignal(signals.signal()));
      stop_http();
      return 0;
    }
    spdlog::error("cannot serve: {}", e->message);
    stop_http();
    return 1;
  }
  LoadedModel& model = std::get<LoadedModel>(loaded);
  context->tokenizer = model.tokenizer;
  context->end_token_ids = model.tokenizer->end_of_generation_ids();
  context->backend_name = model.backend->describe();
  context->engine = actors::spawn_engine(system, config, model.backend);
  model.backend.reset();  // the stage actor owns it now
  if (context->engine.limits.ctx < config.ctx) {
    spdlog::info("context per slot: {} tokens (the model's limit; --ctx asked for {})", context->engine.limits.ctx, config.ctx);
  }
  context->phase.store(http::ServerPhase::ready, std::memory_order_release);
  spdlog::info("serving {} as '{}' on http://{}:{}: {} slots of {} tokens, {}", context->progress.stage_name,
               config.model_id, config.host, server.port(), config.slots, context->engine.limits.ctx,
               context->backend_name);

  signals.stop.wait(false);  // asleep until SIGINT / SIGTERM
  spdlog::info("{}: draining (new requests get 503; running ones have {} s to finish)", strsignal(signals.signal()),
               config.drain_timeout_s);
  context->phase.store(http::ServerPhase::draining, std::memory_order_release);
  const caf::scoped_actor self{system};
  const auto wait = std::chrono::milliseconds(static_cast<int64_t>(config.drain_timeout_s * 1000) + 60000);
  int exit_code = 0;
  self->request(context->engine.scheduler, wait, actors::DrainRequest{config.drain_timeout_s * 1000})
      .receive(
          [](const actors::DrainDone& done) {
            spdlog::info("drained: {} requests finished, {} cancelled at the deadline", done.finished, done.cancelled);
          },
          [&](const caf::error& err) {
            spdlog::error("drain did not complete: {}", system.render(err));
            exit_code = 1;
          });
  // The bridges have handed their last bytes to the sessions: let the writes go out.
  for (int i = 0; i < 50 && context->metrics.exchanges_open.load() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  stop_http();
  self->send_exit(context->engine.scheduler, caf::exit_reason::user_shutdown);
  self->send_exit(context->engine.stage, caf::exit_reason::user_shutdown);
  spdlog::info("stopped");
  return exit_code;
}

}  // namespace

CommandRun add_serve_command(CLI::App& app) {
  auto options = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve the OpenAI-compatible API (chat, completions, SSE)");
  add_options(*cmd, *options);
  return [cmd, options] { return serve(*cmd, *options); };
}

}  // namespace ferry::cli
