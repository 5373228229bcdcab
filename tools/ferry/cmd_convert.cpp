// `ferry convert HF_DIR OUT.gguf`: a glm5_next Hugging Face checkpoint to a glm5next GGUF file
// (the conversion itself is model/glm5/glm5_convert.cpp). Progress and notes go to stderr.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "model/glm5/glm5_convert.hpp"
#include "tools/ferry/commands.hpp"

namespace ferry::cli {

CommandRun add_convert_command(CLI::App& app) {
  struct Options {
    std::string hf_dir, out, type = "bf16", output_type, keep_f32, tokenizer, name, recipe;
    std::vector<std::string> tensor_types;
    unsigned threads = 0;
    bool quiet = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "convert",
      "Convert a Hugging Face glm5_next checkpoint (BF16/F16/F32 safetensors, single or sharded, or the FP8 "
      "release with 128x128 block scales) to a GGUF file laid out as the published glm5next files: experts "
      "stacked, the MTP block when present, the vision tower skipped. Norms, biases, gates, mHC mixers, the router "
      "and the KDA conv/decay state stay F32 whatever --type says");
  sub->add_option("hf_dir", opt->hf_dir, "Checkpoint directory (config.json + *.safetensors)")->required();
  sub->add_option("out", opt->out, "GGUF file to write (written to OUT.partial, renamed when complete)")->required();
  const std::vector<std::string> types = {"f32", "f16", "bf16", "q8_0", "q4_k", "q5_k", "q6_k", "iq4_xs", "iq3_s"};
  sub->add_option("--type", opt->type,
                  "Type of the weight matrices no --tensor-type or --recipe rule names: f32, f16, bf16, q8_0, q4_k, "
                  "q5_k, q6_k, iq4_xs, iq3_s (default bf16). With q4_k, q5_k, iq4_xs and iq3_s the output head is q6_k, "
                  "as in llama.cpp's files; a tied embedding (no lm_head) takes the head's type, as llama.cpp stores it. "
                  "Rows that are not a whole number of the type's blocks fall back to q8_0, else f16 (each one is noted)")
      ->check(CLI::IsMember(types, CLI::ignore_case));
  sub->add_option("--output-type", opt->output_type,
                  "Type of the output head (output.weight) instead, as llama-quantize's --output-tensor-type")
      ->check(CLI::IsMember(types, CLI::ignore_case));
  sub->add_option("--tensor-type", opt->tensor_types,
                  "REGEX=TYPE: tensors whose GGUF name matches REGEX (ECMAScript, searched) get TYPE, as "
                  "llama-quantize's --tensor-type; repeatable, the first matching rule wins, before --recipe's rules. "
                  "Norms, biases, conv taps, the router and the mHC mixers stay f32 whatever a rule says")
      ->type_name("REGEX=TYPE");
  sub->add_option("--recipe", opt->recipe,
                  "File of REGEX=TYPE rules, one a line ('#' comments), applied after --tensor-type's; "
                  "model/glm5/recipes/ has the user's two mixes")
      ->check(CLI::ExistingFile);
  sub->add_option("--keep-f32", opt->keep_f32,
                  "Also keep F32 every GGUF tensor whose name matches this regular expression (ECMAScript, "
                  "searched), e.g. 'attn_k_b|attn_v_b'");
  sub->add_option("--tokenizer", opt->tokenizer,
                  "Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json) to embed as "
                  "tokenizer.ggml.* metadata");
  sub->add_option("--name", opt->name, "general.name (default: the checkpoint directory's name)");
  sub->add_option("--threads", opt->threads, "Quantization threads (default: all cores)");
  sub->add_flag("--quiet", opt->quiet, "Print only notes and errors, no per-tensor progress");
  return [opt]() -> int {
    model::Glm5ConvertOptions o;
    o.type = *model::ggml_type_from_name(opt->type);
    if (!opt->output_type.empty()) o.output_type = *model::ggml_type_from_name(opt->output_type);
    o.keep_f32_regex = opt->keep_f32;
    auto rules = model::Glm5TypeRules::parse(opt->tensor_types, "--tensor-type");
    if (!rules) {
      std::fprintf(stderr, "ferry convert: %s\n", rules.error().message.c_str());
      return 2;
    }
    o.rules = std::move(rules.value());
    if (!opt->recipe.empty()) {
      auto recipe = model::Glm5TypeRules::load_recipe(opt->recipe);
      if (!recipe) {
        std::fprintf(stderr, "ferry convert: %s\n", recipe.error().message.c_str());
        return 2;
      }
      o.rules.append(*recipe);
    }
    o.tokenizer_dir = opt->tokenizer;
    o.name = opt->name;
    o.threads = opt->threads;
    const bool quiet = opt->quiet;
    o.log = [quiet](const std::string& line) {
      if (quiet && !line.starts_with("note:")) return;
      std::fprintf(stderr, "%s\n", line.c_str());
    };
    const auto start = std::chrono::steady_clock::now();
    const auto r = model::convert_glm5_checkpoint(opt->hf_dir, opt->out, o);
    if (!r) {
      std::fprintf(stderr, "ferry convert: %s\n", r.error().message.c_str());
      return 1;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "ferry convert: wrote %s: %llu tensors, %llu bytes in %.1f s\n", opt->out.c_str(),
                 static_cast<unsigned long long>(r->tensors), static_cast<unsigned long long>(r->file_bytes), s);
    return 0;
  };
}

}  // namespace ferry::cli
