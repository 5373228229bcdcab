#include "tools/ferry/commands.hpp"

namespace ferry::cli {

CommandRun add_inspect_command(CLI::App& app) {
  app.add_subcommand("inspect", "Describe a GGUF model file (not built yet)");
  return [] { return not_built_yet("inspect", "describe a GGUF model file"); };
}

}  // namespace ferry::cli
