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
#include "config/serve_cli.hpp"
#include "gpu/backend_factory.hpp"
#include "http/admin_server.hpp"
#include "http/admin_ws.hpp"
#include "http/http_server.hpp"
#include "http/request_log.hpp"
#include "http/server_context.hpp"
#include "tools/ferry/commands.hpp"
#include "tools/ferry/serve_model.hpp"

namespace ferry::cli {
namespace {

// The memory plan's tiers as the admin console lists them: each stage's expert pool, the host store.
std::vector<actors::MemoryTier> memory_tiers(const gpu::MemoryPlan& plan) {
  std::vector<actors::MemoryTier> tiers;
  for (size_t i = 0; i < plan.stages.size(); ++i) {
    const gpu::StagePlan& s = plan.stages[i];
    if (s.resident) continue;
    const uint64_t pool = uint64_t{s.pool_slots} * plan.expert_slot_bytes;
    tiers.push_back({"stage " + std::to_string(i) + " expert pool (cuda:" + std::to_string(s.device) + ")", pool, pool});
  }
  if (plan.tiered()) {
    tiers.push_back({"host expert store (with shadow copies)", plan.host.store_bytes + plan.host.shadow_bytes,
                     plan.host.store_bytes});
  }
  return tiers;
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
  // A drain asked for without a signal (the admin console's drain command); false when a drain or
  // stop is already under way.
  bool request_stop() {
    if (stop.exchange(true)) return false;
    stop.notify_all();
    return true;
  }
  std::atomic<bool> stop{false};

 private:
  sigset_t set_;
  std::atomic<int> signal_{0};
  std::thread thread_;
};

int serve(config::ServeCli& cli) {
  if (const auto errors = cli.finish(); !errors.empty()) {
    for (const auto& e : errors) std::fprintf(stderr, "ferry serve: %s\n", e.c_str());
    return 2;
  }
  const config::ServeConfig& config = cli.config();
  http::configure_logging(config.server.log_format == "json");
  // Signals are blocked before the first CUDA call below: the driver's threads would otherwise
  // take SIGTERM with its default action and kill the process instead of draining it.
  SignalWaiter signals;
  const bool synthetic = !config.model.synthetic_config.empty();
  Expected<std::string> model_path = std::string();
  Expected<SyntheticSource> synthetic_source = SyntheticSource{};
  const Error* source_error = nullptr;
  if (synthetic) {
    synthetic_source = read_synthetic_source(config);
    if (!synthetic_source) source_error = &synthetic_source.error();
  } else {
    model_path = resolve_model_path(config);
    if (!model_path) source_error = &model_path.error();
  }
  if (source_error != nullptr) {
    std::fprintf(stderr, "ferry serve: %s\n", source_error->message.c_str());
    return 2;
  }
  // Known before listening too: a ferry built without CUDA, or a machine without a GPU, cannot serve
  // --backend cuda, nor synthetic weights, which are made on the GPU.
  if (auto kind = gpu::resolve_backend_kind(synthetic ? "cuda" : config.devices.backend); !kind) {
    std::fprintf(stderr, "ferry serve: %s: %s\n", synthetic ? "--synthetic needs a GPU" : "--backend",
                 kind.error().message.c_str());
    return 2;
  }
  if (synthetic) {
    const std::string types = config.model.synthetic_recipe.empty()
                                  ? config.model.synthetic_type
                                  : "recipe " + config.model.synthetic_recipe + ", else " + config.model.synthetic_type;
    spdlog::warn("SYNTHETIC WEIGHTS: pseudo-random {} values of the shape in {} (seed {}), no trained model: the "
                 "answers mean nothing; for speed and memory measurements only",
                 types, config.model.synthetic_config, config.model.synthetic_seed);
  }

  caf::actor_system_config caf_config;
  actors::configure_actor_system(caf_config);
  caf::actor_system system{caf_config};

  auto context = std::make_shared<http::ServerContext>();
  context->config = config;
  context->system = &system;
  context->started_unix = static_cast<int64_t>(std::time(nullptr));
  context->progress.stage_name = synthetic ? "synthetic weights of " + config.model.synthetic_config
                                 : config.model.path.empty() ? "the default model"
                                                             : config.model.path;

  boost::asio::io_context ioc;
  auto work = boost::asio::make_work_guard(ioc);
  http::HttpServer server(ioc, context);
  if (std::string error = server.listen(config.server.host, config.server.port); !error.empty()) {
    std::fprintf(stderr, "ferry serve: %s\n", error.c_str());
    return 1;
  }
  http::AdminServer admin_server(ioc, context);
  if (config.server.admin_port != 0) {
    if (std::string error = admin_server.listen(config.server.admin_host, config.server.admin_port); !error.empty()) {
      std::fprintf(stderr, "ferry serve: %s\n", error.c_str());
      return 1;
    }
  }
  std::vector<std::thread> io_threads;
  for (uint32_t i = 0; i < config.server.http_threads; ++i) io_threads.emplace_back([&ioc] { ioc.run(); });
  spdlog::info("listening on http://{}:{} (GET /health reports loading progress)", config.server.host, server.port());
  {
    const std::string& admin_host = config.server.admin_port != 0 ? config.server.admin_host : config.server.host;
    const uint16_t admin_port = config.server.admin_port != 0 ? admin_server.port() : server.port();
    if (config.server.admin_token.empty() && !http::admin_listens_on_loopback(config.server)) {
      spdlog::warn("admin console off: it listens on {} (not a loopback address) and no --admin-token is set",
                   admin_host);
    } else {
      spdlog::info("admin console on http://{}:{}/admin ({})", admin_host, admin_port,
                   config.server.admin_token.empty() ? "loopback, no token" : "token required");
    }
  }

  auto stop_http = [&] {
    server.close();
    admin_server.close();
    work.reset();
    ioc.stop();
    for (auto& t : io_threads) t.join();
  };

  auto loaded = synthetic ? load_synthetic(*synthetic_source, config)
                          : load_model(*model_path, config, context->progress, signals.stop);
  if (!loaded) {
    if (signals.stop.load()) {
      spdlog::info("{} while loading: exiting", strsignal(signals.signal()));
      stop_http();
      return 0;
    }
    spdlog::error("cannot serve: {}", loaded.error().message);
    stop_http();
    return 1;
  }
  LoadedModel& model = *loaded;
  context->tokenizer = model.tokenizer;
  context->end_token_ids = model.tokenizer->end_of_generation_ids();
  context->backend_name = model.opened.pipeline->describe();
  if (model.opened.plan.tiered()) spdlog::info("memory plan:\n{}", gpu::format_plan(model.opened.plan));
  if (!model.opened.plan.stages.empty()) spdlog::info("KV: {}", gpu::kv_resident_line(model.opened.plan));
  actors::AdminHooks admin_hooks;
  // The phase turns to draining before the console's ack goes out, so a request sent after the ack
  // gets its 503 even when the main thread has not woken yet.
  admin_hooks.drain = [&signals, context] {
    if (!signals.request_stop()) return false;
    context->phase.store(http::ServerPhase::draining, std::memory_order_release);
    return true;
  };
  context->engine = actors::spawn_engine(system, config,
                                         {model.opened.pipeline.get(), model.opened.experts, model.opened.expert_stage,
                                          memory_tiers(model.opened.plan)},
                                         true, std::move(admin_hooks));
  model.opened.pipeline.reset();  // the stage actors own the stages now
  if (context->engine.limits.ctx < config.slots.ctx) {
    spdlog::info("context per slot: {} tokens (the model's trained context; --ctx asked for {})",
                 context->engine.limits.ctx, config.slots.ctx);
  }
  context->phase.store(http::ServerPhase::ready, std::memory_order_release);
  spdlog::info("serving {} as '{}' on http://{}:{}: {} slots of {} tokens, {}", context->progress.stage_name,
               config.model.id, config.server.host, server.port(), config.slots.count, context->engine.limits.ctx,
               context->backend_name);

  signals.stop.wait(false);  // asleep until SIGINT / SIGTERM or the admin console's drain
  spdlog::info("{}: draining (new requests get 503; running ones have {} s to finish)",
               signals.signal() != 0 ? strsignal(signals.signal()) : "admin console", config.server.drain_timeout_s);
  context->phase.store(http::ServerPhase::draining, std::memory_order_release);
  const caf::scoped_actor self{system};
  const auto wait = std::chrono::milliseconds(static_cast<int64_t>(config.server.drain_timeout_s * 1000) + 60000);
  int exit_code = 0;
  self->request(context->engine.scheduler, wait, actors::DrainRequest{config.server.drain_timeout_s * 1000})
      .receive(
          [](const actors::DrainDone& done) {
            spdlog::info("drained: {} requests finished, {} cancelled at the deadline", done.finished, done.cancelled);
          },
          [&](const caf::error& err) {
            spdlog::error("drain did not complete: {}", system.render(err));
            exit_code = 1;
          });
  // The admin consoles go first, with a close frame (1001, the server is stopping): their actors quit
  // when the admin actor does, and must let go of their sessions while the io_context still runs.
  caf::anon_send_exit(context->engine.admin, caf::exit_reason::user_shutdown);
  for (int i = 0; i < 100 && (context->admin_metrics.client_actors.load() > 0 ||
                              context->admin_metrics.clients_open.load() > 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // The bridges have handed their last bytes to the sessions: let the writes go out.
  for (int i = 0; i < 50 && context->metrics.exchanges_open.load() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  stop_http();
  actors::stop_engine(context->engine);
  spdlog::info("stopped");
  return exit_code;
}

}  // namespace

CommandRun add_serve_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("serve", "Serve the OpenAI-compatible API (chat, completions, SSE)");
  auto cli = std::make_shared<config::ServeCli>(*cmd);
  return [cli] { return serve(*cli); };
}

}  // namespace ferry::cli
