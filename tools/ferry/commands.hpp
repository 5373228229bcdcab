#pragma once
// Every `ferry` subcommand lives in its own file and registers itself here: it adds its options to
// the app and returns what to run when the user chose it (the process exit code).
#include <CLI/CLI.hpp>

#include <functional>

namespace ferry::cli {

using CommandRun = std::function<int()>;

CommandRun add_serve_command(CLI::App& app);
CommandRun add_run_command(CLI::App& app);
CommandRun add_bench_command(CLI::App& app);
CommandRun add_plan_command(CLI::App& app);
CommandRun add_convert_command(CLI::App& app);
CommandRun add_inspect_command(CLI::App& app);
CommandRun add_tokenize_command(CLI::App& app);
CommandRun add_detokenize_command(CLI::App& app);
CommandRun add_eval_ref_command(CLI::App& app);
CommandRun add_gguf_dump_command(CLI::App& app);
CommandRun add_safetensors_dump_command(CLI::App& app);

// For a subcommand whose issue has not landed yet: says so and fails, never pretends.
int not_built_yet(const char* command, const char* what_it_will_do);

}  // namespace ferry::cli
