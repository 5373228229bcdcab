// `ferry tokenize`: the token ids of a text, or of a chat request rendered with GLM-5.3-Flash's chat
// template, as the server counts them. A user's debugging tool and the handle the Python tests use
// to compare ferry with Hugging Face `tokenizers` and with jinja2.
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "model/text/chat_template.hpp"
#include "model/text/json.hpp"
#include "model/text/tokenizer_gguf.hpp"
#include "model/text/unicode.hpp"
#include "tools/ferry/commands.hpp"

namespace ferry::cli {
namespace {

struct TokenizeArgs {
  std::string model;
  std::string file;
  std::string chat;
  std::string text;
  bool ids_only = false;
  bool no_special = false;
  bool show_prompt = false;
  bool split = false;
};

std::optional<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A token's bytes for display: valid UTF-8 as is, control characters and invalid bytes escaped.
std::string display(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < bytes.size();) {
    const model::unicode::Decoded d = model::unicode::decode_utf8(bytes, i);
    const uint32_t cp = d.cp;
    if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\\') {
      out += "\\\\";
    } else if (cp < 0x20 || cp == 0x7F || cp >= model::unicode::kInvalidBase) {
      const auto b = static_cast<unsigned char>(bytes[i]);
      out += "\\x";
      out += kHex[b >> 4];
      out += kHex[b & 15];
    } else {
      out.append(bytes.substr(i, d.len));
    }
    i += d.len;
  }
  return out;
}

// The chat request: an OpenAI chat-completions body (messages, tools, reasoning_effort,
// add_generation_prompt, chat_template_kwargs {enable_thinking, clear_thinking, reasoning_effort}).
Expected<model::RenderedChat> render_request(const std::string& path) {
  const auto body = read_file(path);
  if (!body) return Error(ErrorCode::io, "cannot read " + path);
  auto doc = model::parse_json(*body);
  if (!doc) return doc.error().prefixed(path + ": ");
  if (!doc->is_object()) return Error(path + ": expected a JSON object with \"messages\"");
  const model::JsonValue* messages = doc->find("messages");
  if (!messages) return Error(path + ": no \"messages\"");
  model::ChatOptions options;
  const auto read_options = [&](const model::JsonValue& obj) -> Status {
    for (const auto& [key, value] : obj.as_object()) {
      if (key == "reasoning_effort" && value.is_string()) {
        options.reasoning_effort = value.as_string();
      } else if (key == "enable_thinking" && value.is_bool()) {
        options.enable_thinking = value.as_bool();
      } else if (key == "clear_thinking" && value.is_bool()) {
        options.clear_thinking = value.as_bool();
      } else if (key == "add_generation_prompt" && value.is_bool()) {
        options.add_generation_prompt = value.as_bool();
      } else if ((key == "enable_thinking" || key == "clear_thinking" || key == "add_generation_prompt") &&
                 !value.is_null()) {
        return Error(path + ": \"" + key + "\" must be true or false");
      }
    }
    return std::nullopt;
  };
  if (auto err = read_options(*doc)) return *err;
  if (const model::JsonValue* kwargs = doc->find("chat_template_kwargs"); kwargs && kwargs->is_object()) {
    if (auto err = read_options(*kwargs)) return *err;
  }
  auto result = model::ChatTemplate{}.render(*messages, doc->find("tools"), options);
  if (!result) return result.error().prefixed(path + ": ");
  return result;
}

int run_tokenize(const TokenizeArgs& args) {
  const int sources = !args.file.empty() + !args.chat.empty() + !args.text.empty();
  if (sources != 1) {
    std::fprintf(stderr, "ferry tokenize: give exactly one of TEXT, --file FILE or --chat REQUEST.json\n");
    return 2;
  }
  std::string text;
  bool parse_special = !args.no_special;
  if (!args.chat.empty()) {
    auto rendered = render_request(args.chat);
    if (!rendered) {
      std::fprintf(stderr, "ferry tokenize: %s\n", rendered.error().message.c_str());
      return 2;
    }
    if (args.show_prompt) {
      std::fwrite(rendered->prompt.data(), 1, rendered->prompt.size(), stdout);
      return 0;
    }
    text = std::move(rendered->prompt);
    parse_special = true;  // the template's markers are special tokens
  } else if (!args.file.empty()) {
    auto content = read_file(args.file);
    if (!content) {
      std::fprintf(stderr, "ferry tokenize: cannot read %s\n", args.file.c_str());
      return 2;
    }
    text = std::move(*content);
  } else {
    text = args.text;
  }
  if (args.show_prompt) {
    std::fprintf(stderr, "ferry tokenize: --show-prompt needs --chat\n");
    return 2;
  }
  if (args.model.empty()) {
    std::fprintf(stderr, "ferry tokenize: --model is required to tokenize\n");
    return 2;
  }
  auto tokenizer = model::load_tokenizer(std::filesystem::path(args.model));
  if (!tokenizer) {
    std::fprintf(stderr, "ferry tokenize: %s\n", tokenizer.error().message.c_str());
    return 2;
  }
  std::string out;
  if (args.split) {
    for (std::string_view piece : tokenizer->pre_tokenize(text, parse_special)) out += display(piece) + '\n';
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  }
  const auto ids = tokenizer->encode(text, parse_special);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (args.ids_only) {
      if (i > 0) out += ' ';
      out += std::to_string(ids[i]);
    } else {
      out += std::to_string(ids[i]) + '\t' + display(tokenizer->token_bytes(ids[i])) + '\n';
    }
  }
  if (args.ids_only) {
    out += '\n';
  } else {
    out += "# " + std::to_string(ids.size()) + " tokens\n";
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

CommandRun add_tokenize_command(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize",
      "Print the token ids (and pieces) of a text as the model's tokenizer splits it, or of an OpenAI chat "
      "request rendered with the GLM-5.3-Flash chat template (the prompt the server would run)");
  cmd->add_option("--model", args->model, "A GGUF model (its tokenizer.ggml.* metadata) or a Hugging Face tokenizer directory");
  cmd->add_option("--file", args->file, "Tokenize the bytes of this file");
  cmd->add_option("--chat", args->chat,
                  "Render this chat request (JSON: messages, tools, reasoning_effort, add_generation_prompt, "
                  "chat_template_kwargs {enable_thinking, clear_thinking}) and tokenize the prompt");
  cmd->add_flag("--show-prompt", args->show_prompt, "With --chat: print the rendered prompt text instead (no --model needed)");
  cmd->add_flag("--ids-only", args->ids_only, "Print only the ids, space-separated, on one line");
  cmd->add_flag("--split", args->split,
                "Print the pieces BPE works within instead (added tokens, then the pre-tokenizer's split), one a "
                "line, escaped like the pieces");
  cmd->add_flag("--no-special", args->no_special,
                "Treat special (control) tokens in TEXT or --file as plain text instead of matching them");
  cmd->add_option("text", args->text, "The text to tokenize");
  cmd->footer("Default output: one line per token, 'id<TAB>piece' (control characters and invalid UTF-8 escaped), "
              "then '# N tokens'.");
  return [args] { return run_tokenize(*args); };
}

}  // namespace ferry::cli
