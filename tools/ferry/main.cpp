// `ferry`: one binary, one subcommand per job.
#include <cstdio>
#include <utility>
#include <vector>

#include "tools/ferry/commands.hpp"

namespace ferry::cli {

int not_built_yet(const char* command, const char* what_it_will_do) {
  std::fprintf(stderr, "ferry %s: not built yet (it will %s)\n", command, what_it_will_do);
  return 2;
}

}  // namespace ferry::cli

int main(int argc, char** argv) {
  using namespace ferry::cli;
  CLI::App app{"ferry: an inference server for GLM-5.3-Flash (glm5_next) on GPUs that hold less than the model"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "ferry 0.1.0");

  std::vector<std::pair<CLI::App*, CommandRun>> commands;
  auto add = [&](CommandRun (*adder)(CLI::App&)) {
    const size_t before = app.get_subcommands({}).size();
    CommandRun run = adder(app);
    commands.emplace_back(app.get_subcommands({})[before], std::move(run));
  };
  add(add_serve_command);
  add(add_run_command);
  add(add_bench_command);
  add(add_plan_command);
  add(add_convert_command);
  add(add_inspect_command);
  add(add_tokenize_command);
  add(add_detokenize_command);
  add(add_eval_ref_command);
  add(add_gguf_dump_command);
  add(add_safetensors_dump_command);

  // CLI11 would only say "a subcommand is required": name the word it did not know.
  auto known = [&](const char* word) {
    for (const CLI::App* sub : app.get_subcommands({})) {
      if (sub->check_name(word)) return true;
    }
    return false;
  };
  if (argc > 1 && argv[1][0] != '-' && !known(argv[1])) {
    std::fprintf(stderr, "ferry: unknown subcommand '%s' (see ferry --help)\n", argv[1]);
    return 2;
  }
  CLI11_PARSE(app, argc, argv);
  for (auto& [sub, run] : commands) {
    if (sub->parsed()) return run();
  }
  return 2;
}
