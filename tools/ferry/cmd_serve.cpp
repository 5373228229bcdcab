#include "tools/ferry/commands.hpp"

namespace ferry::cli {

CommandRun add_serve_command(CLI::App& app) {
  app.add_subcommand("serve", "Serve the OpenAI-compatible API (not built yet)");
  return [] { return not_built_yet("serve", "serve the OpenAI-compatible API"); };
}

}  // namespace ferry::cli
