#include "tools/ferry/commands.hpp"

namespace ferry::cli {

CommandRun add_convert_command(CLI::App& app) {
  app.add_subcommand("convert", "Convert a Hugging Face glm5_next checkpoint to GGUF (not built yet)");
  return [] { return not_built_yet("convert", "convert a Hugging Face checkpoint to GGUF"); };
}

}  // namespace ferry::cli
