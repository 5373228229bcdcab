#include "tools/ferry/commands.hpp"

namespace ferry::cli {

CommandRun add_run_command(CLI::App& app) {
  app.add_subcommand("run", "Generate tokens from a prompt (not built yet)");
  return [] { return not_built_yet("run", "generate tokens from a prompt"); };
}

}  // namespace ferry::cli
