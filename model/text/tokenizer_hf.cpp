// Hugging Face tokenizer directories -> TokenizerSpec -> GGUF `tokenizer.ggml.*` metadata, the way
// llama.cpp's convert_hf_to_gguf.py does it for GLM (`_set_vocab_glm` with `get_vocab_base`).
#include <fstream>
#include <sstream>

#include "model/formats/gguf_writer.hpp"
#include "model/text/json.hpp"
#include "model/text/tokenizer_gguf.hpp"

namespace ferry::model {
namespace {

// The Split regexes of the pre-tokenizers ferry implements, as tokenizer.json spells them.
constexpr std::string_view kGlm4Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

Expected<std::string> read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error(ErrorCode::io, "cannot read " + path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Expected<JsonValue> read_json(const std::filesystem::path& path) {
  auto text = read_text(path);
  if (!text) return text.error();
  auto doc = parse_json(*text);
  if (!doc) return doc.error().prefixed(path.string() + ": ");
  if (!doc->is_object()) return Error(path.string() + ": expected a JSON object");
  return doc;
}

bool is_type(const JsonValue* v, std::string_view type) {
  const JsonValue* t = v ? v->find("type") : nullptr;
  return t && t->is_string() && t->as_string() == type;
}

bool flag(const JsonValue* obj, std::string_view key) {
  const JsonValue* v = obj ? obj->find(key) : nullptr;
  return v && v->is_bool() && v->as_bool();
}

// The tokenizer.ggml.pre name of a tokenizer.json pre_tokenizer, or an error naming what it is.
Expected<std::string> pre_tokenizer_name(const JsonValue* pre) {
  if (is_type(pre, "ByteLevel") && flag(pre, "use_regex")) return std::string("gpt-2");
  if (is_type(pre, "Sequence")) {
    const JsonValue* list = pre->find("pretokenizers");
    if (list && list->is_array() && list->as_array().size() == 2) {
      const JsonValue& split = list->as_array()[0];
      const JsonValue& byte_level = list->as_array()[1];
      const JsonValue* pattern = split.find("pattern");
      const JsonValue* regex = pattern ? pattern->find("Regex") : nullptr;
      const JsonValue* behavior = split.find("behavior");
      if (is_type(&split, "Split") && regex && regex->is_string() && behavior && behavior->is_string() &&
          behavior->as_string() == "Isolated" && !flag(&split, "invert") && is_type(&byte_level, "ByteLevel") &&
          !flag(&byte_level, "use_regex")) {
        if (regex->as_string() == kGlm4Regex) return std::string("glm4");
        if (regex->as_string() == kQwen2Regex) return std::string("qwen2");
      }
    }
  }
  return Error(ErrorCode::unsupported,
               "tokenizer.json pre_tokenizer " + (pre ? to_python_json(*pre).substr(0, 300) : "null") +
                   " is not one ferry implements (GLM's Split regex + ByteLevel, Qwen2's, or ByteLevel with its "
                   "GPT-2 regex)");
}

// "eos_token": "<|endoftext|>" or {"content": "<|endoftext|>", ...}.
std::optional<std::string> token_text(const JsonValue& config, std::string_view key) {
  const JsonValue* v = config.find(key);
  if (v && v->is_object()) v = v->find("content");
  if (v && v->is_string()) return v->as_string();
  return std::nullopt;
}

// llama.cpp's `does_token_look_special`: added tokens that are not flagged special but are named
// like control tokens become control tokens in the GGUF.
bool looks_special(std::string_view t) {
  const auto wrapped = [&](std::string_view open, std::string_view close) {
    return t.size() >= open.size() + close.size() && t.substr(0, open.size()) == open &&
           t.substr(t.size() - close.size()) == close;
  };
  return t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]" || wrapped("<|", "|>") ||
         wrapped("<\xEF\xBD\x9C", "\xEF\xBD\x9C>") || wrapped("<unused", ">");
}

}  // namespace

Expected<TokenizerSpec> read_hf_tokenizer_dir(const std::filesystem::path& dir, size_t vocab_size) {
  const auto tokenizer_path = dir / "tokenizer.json";
  auto doc = read_json(tokenizer_path);
  if (!doc) return doc.error();
  const std::string where = tokenizer_path.string() + ": ";
  const JsonValue* model = doc->find("model");
  if (!is_type(model, "BPE")) return Error(ErrorCode::unsupported, where + "model.type must be \"BPE\"");
  if (flag(model, "byte_fallback")) {
    return Error(ErrorCode::unsupported, where + "model.byte_fallback is true: not a byte-level BPE");
  }
  if (const JsonValue* norm = doc->find("normalizer"); norm && !norm->is_null()) {
    return Error(ErrorCode::unsupported, where + "normalizer " + to_python_json(*norm).substr(0, 200) +
                                             " is not supported (GLM's tokenizer has none)");
  }
  auto pre = pre_tokenizer_name(doc->find("pre_tokenizer"));
  if (!pre) return pre.error().prefixed(where);

  TokenizerSpec spec;
  spec.pre = *pre;
  if (const JsonValue* im = model->find("ignore_merges"); im && im->is_bool()) spec.ignore_merges = im->as_bool();

  // Ids: the model's vocab, then added_tokens (which may repeat vocab entries).
  struct Entry {
    std::string text;
    TokenType type = TokenType::unused;
    bool set = false;
  };
  std::vector<Entry> entries;
  const auto place = [&](const JsonValue& id_value, std::string text, TokenType type) -> Status {
    if (!id_value.is_number() || !id_value.as_number().is_integer() || id_value.as_number().text[0] == '-' ||
        id_value.as_number().text.size() > 9) {
      return Error(where + "token '" + text + "' has id " + to_python_json(id_value) +
                   ", expected an integer id below 10^9");
    }
    const size_t id = std::stoul(id_value.as_number().text);
    if (id >= entries.size()) entries.resize(id + 1);
    entries[id] = {std::move(text), type, true};
    return std::nullopt;
  };
  const JsonValue* vocab = model->find("vocab");
  if (!vocab || !vocab->is_object()) return Error(where + "model.vocab must be an object");
  for (const auto& [text, id] : vocab->as_object()) {
    if (auto err = place(id, text, TokenType::normal)) return *err;
  }
  std::vector<std::string> added_texts;
  if (const JsonValue* added = doc->find("added_tokens"); added && added->is_array()) {
    for (const JsonValue& t : added->as_array()) {
      const JsonValue* id = t.find("id");
      const JsonValue* content = t.find("content");
      if (!id || !content || !content->is_string()) return Error(where + "added_tokens entry without id and content");
      const bool control = flag(&t, "special") || looks_special(content->as_string());
      if (auto err = place(*id, content->as_string(), control ? TokenType::control : TokenType::user_defined)) return *err;
      added_texts.push_back(content->as_string());
    }
  }
  if (vocab_size != 0 && vocab_size < entries.size()) {
    return Error(where + "has token ids up to " + std::to_string(entries.size() - 1) + " but the model's vocab_size is " +
                 std::to_string(vocab_size));
  }
  entries.resize(std::max(entries.size(), vocab_size));
  spec.tokens.reserve(entries.size());
  spec.token_types.reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    Entry& e = entries[i];
    spec.tokens.push_back(e.set ? std::move(e.text) : "[PAD" + std::to_string(i) + "]");
    spec.token_types.push_back(static_cast<int32_t>(e.set ? e.type : TokenType::unused));
  }

  const JsonValue* merges = model->find("merges");
  if (!merges || !merges->is_array()) return Error(where + "model.merges must be an array");
  spec.merges.reserve(merges->as_array().size());
  for (const JsonValue& m : merges->as_array()) {
    if (m.is_string()) {
      spec.merges.push_back(m.as_string());
    } else if (m.is_array() && m.as_array().size() == 2 && m.as_array()[0].is_string() && m.as_array()[1].is_string()) {
      spec.merges.push_back(m.as_array()[0].as_string() + " " + m.as_array()[1].as_string());
    } else {
      return Error(where + "model.merges[" + std::to_string(spec.merges.size()) + "] = " + to_python_json(m) +
                   ", expected \"a b\" or [\"a\", \"b\"]");
    }
  }

  const auto id_of = [&](const std::string& text) -> std::optional<TokenId> {
    for (size_t i = 0; i < spec.tokens.size(); ++i) {
      if (spec.tokens[i] == text && spec.token_types[i] != static_cast<int32_t>(TokenType::normal)) {
        return static_cast<TokenId>(i);
      }
    }
    for (size_t i = 0; i < spec.tokens.size(); ++i) {
      if (spec.tokens[i] == text) return static_cast<TokenId>(i);
    }
    return std::nullopt;
  };

  const auto config_path = dir / "tokenizer_config.json";
  JsonValue config = JsonObject{};
  if (std::filesystem::exists(config_path)) {
    auto c = read_json(config_path);
    if (!c) return c.error();
    config = std::move(*c);
  }
  for (auto [key, slot] : {std::pair{"eos_token", &spec.eos}, {"pad_token", &spec.pad}, {"bos_token", &spec.bos},
                           {"unk_token", &spec.unk}}) {
    if (const auto text = token_text(config, key)) {
      const auto id = id_of(*text);
      if (!id) return Error(config_path.string() + ": " + key + " '" + *text + "' is not a token");
      *slot = *id;
    }
  }
  if (const JsonValue* add_bos = config.find("add_bos_token"); add_bos && add_bos->is_bool()) {
    spec.add_bos = add_bos->as_bool();
  }
  // _set_vocab_glm: bos [gMASK], eot <|user|>, unk <|endoftext|>, eom <|observation|>.
  const auto glm = [&](const char* text) { return id_of(text); };
  if (glm("[gMASK]") && glm("<|user|>") && glm("<|endoftext|>") && glm("<|observation|>")) {
    spec.bos = glm("[gMASK]");
    spec.eot = glm("<|user|>");
    spec.unk = glm("<|endoftext|>");
    spec.eom = glm("<|observation|>");
  }

  if (const auto jinja = dir / "chat_template.jinja"; std::filesystem::exists(jinja)) {
    auto text = read_text(jinja);
    if (!text) return text.error();
    spec.chat_template = std::move(*text);
  } else if (const JsonValue* t = config.find("chat_template"); t && t->is_string()) {
    spec.chat_template = t->as_string();
  }
  return spec;
}

Status write_tokenizer_metadata(GgufWriter& writer, const TokenizerSpec& spec) {
  const auto set = [&](std::string key, GgufValue value) { return writer.set(std::move(key), std::move(value)); };
  std::vector<int32_t> types = spec.token_types;
  if (types.empty()) types.assign(spec.tokens.size(), static_cast<int32_t>(TokenType::normal));
  if (auto e = set("tokenizer.ggml.model", std::string("gpt2"))) return e;
  if (auto e = set("tokenizer.ggml.pre", spec.pre)) return e;
  if (auto e = set("tokenizer.ggml.tokens", GgufArray{spec.tokens})) return e;
  if (auto e = set("tokenizer.ggml.token_type", GgufArray{std::move(types)})) return e;
  if (auto e = set("tokenizer.ggml.merges", GgufArray{spec.merges})) return e;
  for (const auto& [key, id] : {std::pair{"tokenizer.ggml.bos_token_id", spec.bos},
                                {"tokenizer.ggml.eos_token_id", spec.eos},
                                {"tokenizer.ggml.eot_token_id", spec.eot},
                                {"tokenizer.ggml.eom_token_id", spec.eom},
                                {"tokenizer.ggml.unknown_token_id", spec.unk},
                                {"tokenizer.ggml.padding_token_id", spec.pad}}) {
    if (!id) continue;
    if (auto e = set(key, static_cast<uint32_t>(*id))) return e;
  }
  if (spec.add_bos) {
    if (auto e = set("tokenizer.ggml.add_bos_token", true)) return e;
  }
  if (!spec.chat_template.empty()) {
    if (auto e = set("tokenizer.chat_template", spec.chat_template)) return e;
  }
  return std::nullopt;
}

Status write_tokenizer_metadata(GgufWriter& writer, const std::filesystem::path& hf_tokenizer_dir,
                                size_t vocab_size) {
  auto spec = read_hf_tokenizer_dir(hf_tokenizer_dir, vocab_size);
  if (!spec) return spec.error();
  // Refuse a tokenizer ferry could not load later (a merge naming a missing token, ...).
  if (auto check = Tokenizer::create(*spec); !check) {
    return check.error().prefixed(hf_tokenizer_dir.string() + ": ");
  }
  return write_tokenizer_metadata(writer, *spec);
}

}  // namespace ferry::model
