// `ferry detokenize --model M IDS...`: the text of token ids, the reverse of `ferry tokenize`.
#include <charconv>
#include <cstdio>
#include <string>
#include <vector>

#include "model/text/tokenizer_gguf.hpp"
#include "tools/ferry/commands.hpp"

namespace ferry::cli {
namespace {

struct DetokenizeArgs {
  std::string model;
  std::vector<std::string> ids;
  bool no_special = false;
};

int run_detokenize(const DetokenizeArgs& args) {
  auto tokenizer = model::load_tokenizer(std::filesystem::path(args.model));
  if (!tokenizer) {
    std::fprintf(stderr, "ferry detokenize: %s\n", tokenizer.error().message.c_str());
    return 2;
  }
  // Ids may be separate arguments or one argument separated by spaces or commas ("1,2,3").
  std::vector<model::TokenId> ids;
  for (const std::string& arg : args.ids) {
    size_t i = 0;
    while (i < arg.size()) {
      if (arg[i] == ',' || arg[i] == ' ') {
        ++i;
        continue;
      }
      size_t end = arg.find_first_of(", ", i);
      if (end == std::string::npos) end = arg.size();
      model::TokenId id = -1;
      const auto [ptr, ec] = std::from_chars(arg.data() + i, arg.data() + end, id);
      if (ec != std::errc() || ptr != arg.data() + end || !tokenizer->valid_id(id)) {
        std::fprintf(stderr, "ferry detokenize: '%s' is not a token id (0..%zu)\n", arg.substr(i, end - i).c_str(),
                     tokenizer->vocab_size() - 1);
        return 2;
      }
      ids.push_back(id);
      i = end;
    }
  }
  const std::string text = tokenizer->decode(ids, /*render_special=*/!args.no_special);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace

CommandRun add_detokenize_command(CLI::App& app) {
  auto args = std::make_shared<DetokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("detokenize", "Print the text that token ids stand for (the reverse of tokenize)");
  cmd->add_option("--model", args->model, "A GGUF model (its tokenizer.ggml.* metadata) or a Hugging Face tokenizer directory")
      ->required();
  cmd->add_flag("--no-special", args->no_special, "Leave out the text of special (control) tokens");
  cmd->add_option("ids", args->ids, "Token ids: separate arguments, or separated by commas or spaces")->required();
  cmd->footer("Prints the decoded bytes exactly, with no newline added.");
  return [args] { return run_detokenize(*args); };
}

}  // namespace ferry::cli
