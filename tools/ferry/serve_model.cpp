#include "tools/ferry/serve_model.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <vector>

#include "actors/spec_policy.hpp"
#include "config/byte_size.hpp"
#include "gpu/backend_factory.hpp"
#include "model/formats/gguf.hpp"
#include "model/text/tokenizer_gguf.hpp"
#include "tools/ferry/default_model.hpp"

namespace ferry::cli {
namespace {

using Clock = std::chrono::steady_clock;

// Bytes the kernel says it can give without swapping (MemAvailable); 0 when unknown.
uint64_t available_memory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

std::string format_duration(double seconds) {
  char buf[32];
  if (seconds >= 3600) std::snprintf(buf, sizeof buf, "%dh%02dm", static_cast<int>(seconds / 3600), static_cast<int>(seconds / 60) % 60);
  else if (seconds >= 60) std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(seconds / 60), static_cast<int>(seconds) % 60);
  else std::snprintf(buf, sizeof buf, "%.1fs", seconds);
  return buf;
}

// Progress on a terminal (one line redrawn twice a second) and in the log (every 10% or 10 s).
class ProgressPrinter {
 public:
  ProgressPrinter(const http::LoadProgress& progress) : progress_(progress), tty_(isatty(STDERR_FILENO) == 1) {}

  void update(bool final) {
    const auto now = Clock::now();
    const uint64_t done = progress_.bytes_done.load(), total = progress_.bytes_total.load();
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double rate = elapsed > 0 ? static_cast<double>(done) / elapsed : 0;
    const double percent = total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100;
    const double eta = rate > 0 && total > done ? static_cast<double>(total - done) / rate : 0;
    char line[256];
    std::snprintf(line, sizeof line, "loading %s: %s / %s (%.1f%%), %s/s, ETA %s", progress_.stage_name.c_str(),
                  config::format_byte_size(done).c_str(), config::format_byte_size(total).c_str(), percent,
                  config::format_byte_size(static_cast<uint64_t>(rate)).c_str(), format_duration(eta).c_str());
    if (tty_ && (final || now - last_tty_ >= std::chrono::milliseconds(500))) {
      std::fprintf(stderr, "\r%s\033[K%s", line, final ? "\n" : "");
      std::fflush(stderr);
      last_tty_ = now;
    }
    const int decile = static_cast<int>(percent / 10);
    const bool due = final || decile > last_decile_ || now - last_log_ >= std::chrono::seconds(10);
    if (due && done != last_logged_ && (!tty_ || final)) {
      spdlog::info("{}", line);
      last_logged_ = done;
    }
    if (due) {
      last_decile_ = decile;
      last_log_ = now;
    }
  }

 private:
  const http::LoadProgress& progress_;
  bool tty_;
  Clock::time_point start_ = Clock::now(), last_tty_{}, last_log_ = Clock::now();
  int last_decile_ = 0;
  uint64_t last_logged_ = UINT64_MAX;
};

// Reads the whole file once so that its pages are in memory before the backend touches them.
Status preload(const std::string& path, http::LoadProgress& progress, const std::atomic<bool>& stop) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Error(ErrorCode::io, "cannot open the model file " + path);
  const off_t size = ::lseek(fd, 0, SEEK_END);
  progress.bytes_total.store(size > 0 ? static_cast<uint64_t>(size) : 0);
  const uint64_t free_bytes = available_memory();
  if (free_bytes != 0 && static_cast<uint64_t>(size) > free_bytes / 2) {
    spdlog::info("not preloading {} ({}): more than half of the available memory ({}); pages load on first use",
                 path, config::format_byte_size(static_cast<uint64_t>(size)), config::format_byte_size(free_bytes));
    ::close(fd);
    return std::nullopt;
  }
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  ProgressPrinter printer(progress);
  std::vector<char> buffer(16u << 20);
  uint64_t offset = 0;
  while (offset < static_cast<uint64_t>(size)) {
    if (stop.load()) break;
    const ssize_t n = ::pread(fd, buffer.data(), buffer.size(), static_cast<off_t>(offset));
    if (n <= 0) {
      ::close(fd);
      return Error(ErrorCode::io, "cannot read the model file " + path + " at byte " + std::to_string(offset), offset);
    }
    offset += static_cast<uint64_t>(n);
    progress.bytes_done.store(offset);
    printer.update(false);
  }
  printer.update(true);
  ::close(fd);
  return std::nullopt;
}

gpu::BackendOptions backend_options(const config::ServeConfig& config) {
  gpu::BackendOptions options;
  options.kind = config.devices.backend;
  options.threads = config.devices.threads;
  options.max_slots = config.slots.count;
  options.max_step_rows = config.slots.prefill_chunk + config.slots.count;  // one chunk + a decode row per slot
  options.max_context = config.slots.ctx;
  (void)gpu::parse_kv_type_option(config.slots.kv_type, options);  // validate() checked it
  options.kv_resident = config.slots.kv_resident;
  if (config.slots.kv_host_budget_gib > 0) {
    options.kv_host_budget = static_cast<uint64_t>(config.slots.kv_host_budget_gib * 1073741824.0);
  }
  options.split = config.devices.split;
  options.memory = config.memory;
  options.route_skew = config.model.route_skew;
  options.mtp = config.slots.mtp != "off";
  options.checkpoint_bytes = static_cast<uint64_t>(config.slots.checkpoint_budget_gib * 1073741824.0);
  options.verify_rows = config.slots.count * 2 * actors::kMaxDrafts;  // with --mtp, on a model with an MTP block
  return options;
}

}  // namespace

Expected<std::string> resolve_model_path(const config::ServeConfig& config) {
  if (!config.model.path.empty()) return config.model.path;
  auto path = default_model_path("ferry serve");
  if (!path) return path.error();
  spdlog::info("serving the embedded default model ({}); pass --model FILE.gguf to serve another",
               config::format_byte_size(default_model_bytes().size()));
  return path;
}

Expected<LoadedModel> load_model(const std::string& path, const config::ServeConfig& config,
                                 http::LoadProgress& progress, const std::atomic<bool>& stop) {
  progress.started_ns.store(Clock::now().time_since_epoch().count());
  if (auto err = preload(path, progress, stop)) return *err;
  if (stop.load()) return Error(ErrorCode::io, "interrupted");  // a signal stopped the read of the file

  auto file = model::GgufFile::open(path);
  if (!file) return file.error().prefixed("cannot read " + path + ": ");
  auto tokenizer = model::load_tokenizer(*file);
  if (!tokenizer) return tokenizer.error().prefixed(path + ": the tokenizer: ");

  auto pipeline = gpu::open_pipeline(path, backend_options(config));
  if (!pipeline) return pipeline.error();

  LoadedModel loaded;
  loaded.tokenizer = std::make_shared<const model::Tokenizer>(std::move(tokenizer.value()));
  loaded.opened = std::move(pipeline.value());
  return loaded;
}

Expected<SyntheticSource> read_synthetic_source(const config::ServeConfig& config) {
  return read_synthetic_source(config.model.synthetic_config, config.model.synthetic_type,
                               config.model.synthetic_recipe);
}

Expected<LoadedModel> load_synthetic(const SyntheticSource& source, const config::ServeConfig& config) {
  const uint32_t vocab = source.hparams.vocab_size;
  auto tokenizer = config.model.tokenizer_path.empty() ? model::placeholder_tokenizer(vocab)
                                                 : model::load_tokenizer(std::filesystem::path(config.model.tokenizer_path));
  if (!tokenizer) return tokenizer.error().prefixed("--tokenizer " + config.model.tokenizer_path + ": ");
  if (tokenizer->vocab_size() > vocab) {
    return Error("--tokenizer " + config.model.tokenizer_path + " has " + std::to_string(tokenizer->vocab_size()) +
                 " tokens, more than the " + std::to_string(vocab) + " of --synthetic " + config.model.synthetic_config);
  }
  auto pipeline =
      gpu::open_synthetic_pipeline(source.hparams, source.type, config.model.synthetic_seed, backend_options(config),
                                   source.rules);
  if (!pipeline) return pipeline.error();
  LoadedModel loaded;
  loaded.tokenizer = std::make_shared<const model::Tokenizer>(std::move(tokenizer.value()));
  loaded.opened = std::move(pipeline.value());
  return loaded;
}

}  // namespace ferry::cli
