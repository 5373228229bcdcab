#include "tools/ferry/commands.hpp"

namespace ferry::cli {

CommandRun add_bench_command(CLI::App& app) {
  app.add_subcommand("bench", "Measure prefill and decode speed (not built yet)");
  return [] { return not_built_yet("bench", "measure prefill and decode speed"); };
}

}  // namespace ferry::cli
