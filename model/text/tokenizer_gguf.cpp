// Reading the tokenizer from GGUF metadata (`tokenizer.ggml.*`, llama.cpp's key names).
#include "model/text/tokenizer_gguf.hpp"

namespace ferry::model {

Expected<TokenizerSpec> read_tokenizer_spec(const GgufFile& file) {
  TokenizerSpec spec;
  const auto model = file.get_string("tokenizer.ggml.model");
  if (!model) return model.error();
  if (*model != "gpt2") {
    return Error(ErrorCode::unsupported, "tokenizer.ggml.model = '" + std::string(*model) +
                                             "': ferry implements byte-level BPE only (expected 'gpt2')");
  }
  const auto pre = file.get_string("tokenizer.ggml.pre");
  if (!pre) return pre.error();
  spec.pre = std::string(*pre);

  const auto tokens = file.get_string_array("tokenizer.ggml.tokens");
  if (!tokens) return tokens.error();
  spec.tokens = **tokens;
  if (file.contains("tokenizer.ggml.token_type")) {
    const auto types = file.get_i64_array("tokenizer.ggml.token_type");
    if (!types) return types.error();
    spec.token_types.reserve(types->size());
    for (size_t i = 0; i < types->size(); ++i) {
      const int64_t t = (*types)[i];
      if (t < 0 || t > 6) {
        return Error("tokenizer.ggml.token_type[" + std::to_string(i) + "] = " + std::to_string(t) +
                     ", expected 0..6");
      }
      spec.token_types.push_back(static_cast<int32_t>(t));
    }
  }
  const auto merges = file.get_string_array("tokenizer.ggml.merges");
  if (!merges) return merges.error();
  spec.merges = **merges;

  for (auto [key, slot] : {std::pair{"tokenizer.ggml.bos_token_id", &spec.bos},
                           {"tokenizer.ggml.eos_token_id", &spec.eos},
                           {"tokenizer.ggml.eot_token_id", &spec.eot},
                           {"tokenizer.ggml.eom_token_id", &spec.eom},
                           {"tokenizer.ggml.padding_token_id", &spec.pad},
                           {"tokenizer.ggml.unknown_token_id", &spec.unk}}) {
    if (!file.contains(key)) continue;
    const auto id = file.get_u32(key);
    if (!id) return id.error();
    if (*id > static_cast<uint32_t>(INT32_MAX)) {
      return Error(std::string(key) + " = " + std::to_string(*id) + " is not a token id");
    }
    *slot = static_cast<TokenId>(*id);
  }
  if (file.contains("tokenizer.ggml.add_bos_token")) {
    const auto add_bos = file.get_bool("tokenizer.ggml.add_bos_token");
    if (!add_bos) return add_bos.error();
    spec.add_bos = *add_bos;
  }
  if (file.contains("tokenizer.chat_template")) {
    const auto tmpl = file.get_string("tokenizer.chat_template");
    if (!tmpl) return tmpl.error();
    spec.chat_template = std::string(*tmpl);
  }
  return spec;
}

Expected<Tokenizer> load_tokenizer(const GgufFile& file) {
  auto spec = read_tokenizer_spec(file);
  if (!spec) return spec.error();
  return Tokenizer::create(std::move(*spec));
}

Expected<Tokenizer> load_tokenizer(const std::filesystem::path& path) {
  if (std::filesystem::is_directory(path)) {
    auto spec = read_hf_tokenizer_dir(path);
    if (!spec) return spec.error();
    auto tokenizer = Tokenizer::create(std::move(*spec));
    if (!tokenizer) return tokenizer.error().prefixed(path.string() + ": ");
    return tokenizer;
  }
  auto file = GgufFile::open(path);
  if (!file) return file.error();
  auto tokenizer = load_tokenizer(*file);
  if (!tokenizer) return tokenizer.error().prefixed(path.string() + ": ");
  return tokenizer;
}

}  // namespace ferry::model
