#pragma once
// Byte-level BPE tokenizer (GGUF `tokenizer.ggml.model = gpt2`), as GLM-4.5 through GLM-5.3 use it:
// added tokens are cut out of the text first (leftmost-longest, like Hugging Face `tokenizers`),
// the rest is split by the pre-tokenizer of `tokenizer.ggml.pre` (hand-written scanners over
// Unicode categories, no std::regex), each piece is mapped to GPT-2's byte alphabet and merged by
// BPE rank. With `ignore_merges` (GLM's tokenizer.json sets it) a piece that is itself a token is
// taken whole before any merge.
//
// A Tokenizer is immutable once created: encode and decode are const and safe to call from several
// threads at once.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "config/expected.hpp"

namespace ferry::model {

using TokenId = int32_t;

// GGUF `tokenizer.ggml.token_type` values (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,       // special added token: matched in text only when encode() parses specials
  user_defined = 4,  // non-special added token: always matched in text, decoded as its text
  unused = 5,
  byte = 6,
};

// The pre-tokenizers ferry implements, by the family of regexes they follow.
enum class PreTokenizerKind {
  glm4,            // glm4, chatglm-bpe, llama3 (llama-bpe), dbrx, smaug-bpe: contractions
                   // case-insensitive, \p{N}{1,3}, [\r\n] handling of the llama3 regex
  qwen2,           // qwen2, stablelm2: the glm4 regex with single digits
  gpt2,            // gpt-2, mpt, olmo, jais: GPT-2's original regex
  starcoder,       // starcoder, refact, command-r, smollm: digits split, then GPT-2's regex
  falcon,          // falcon: punctuation runs, GPT-2's regex, digit triples
  deepseek_coder,  // deepseek-coder: [\r\n], \s?\p{L}+, \s?\p{P}+, CJK runs, single digits
};

// The `tokenizer.ggml.pre` name → kind; nullopt for a name ferry does not implement.
std::optional<PreTokenizerKind> pre_tokenizer_from_name(std::string_view name);

// Everything a byte-level BPE tokenizer is made of, as plain vectors (what the GGUF keys
// `tokenizer.ggml.*` hold).
struct TokenizerSpec {
  std::string pre = "glm4";                // tokenizer.ggml.pre
  std::vector<std::string> tokens;         // tokenizer.ggml.tokens: byte-level text, added tokens plain
  std::vector<int32_t> token_types;        // tokenizer.ggml.token_type; empty means all normal
  std::vector<std::string> merges;         // tokenizer.ggml.merges: "left right", best rank first
  std::optional<TokenId> bos, eos, eot, eom, pad, unk;
  bool add_bos = false;                    // tokenizer.ggml.add_bos_token
  // Take a piece that is a whole token before merging. Default: on for the glm4 family, whose
  // tokenizer.json sets "ignore_merges": true, off otherwise.
  std::optional<bool> ignore_merges;
  std::string chat_template;               // tokenizer.chat_template (informational)
};

struct SpecialTokenIds {
  std::optional<TokenId> bos, eos, eot, eom, pad, unk;
};

class Tokenizer {
 public:
  // Validates the spec: every merge names two tokens whose concatenation is a token, the 256 byte
  // symbols exist, ids are in range, token types are known. The error names the entry.
  static Expected<Tokenizer> create(TokenizerSpec spec);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of `text`. Added user-defined tokens are always matched; control (special) tokens only
  // when `parse_special` (a rendered chat prompt needs true; untrusted text to be shown to the model
  // as text, false). Any bytes are accepted: invalid UTF-8 is split byte by byte and still encodes
  // losslessly. bos is never added here (GLM's template writes its own prefix).
  std::vector<TokenId> encode(std::string_view text, bool parse_special) const;
  void encode(std::string_view text, bool parse_special, std::vector<TokenId>& out) const;
  // The same, capped: appends the encoding of `text` while it stays within `max_tokens` tokens and
  // returns true, or returns false as soon as the text is known to need more (`out` then holds part
  // of it). The work is bounded by the cap, not by the text: a text longer than max_tokens x
  // max_token_bytes() bytes is refused before any of it is split, and a piece is refused before BPE
  // when its length alone needs more tokens than are left (what a 10 MB prompt of "a" would cost).
  bool encode(std::string_view text, bool parse_special, std::vector<TokenId>& out, size_t max_tokens) const;
  // The pieces BPE works within: added tokens whole, the rest as the pre-tokenizer splits it (views
  // into `text`). For debugging a split (`ferry tokenize --split`).
  std::vector<std::string_view> pre_tokenize(std::string_view text, bool parse_special) const;

  // The bytes the ids stand for, concatenated (not necessarily valid UTF-8: a multi-byte character
  // may be split across tokens). Control tokens give their text when `render_special`, else nothing.
  // Ids out of range give nothing (use valid_id() to check first).
  std::string decode(std::span<const TokenId> ids, bool render_special = true) const;
  // One token's bytes (control tokens: their text).
  std::string token_bytes(TokenId id) const;
  // The token as stored in the vocabulary (byte-level alphabet for normal tokens).
  std::string_view piece(TokenId id) const;

  // The id of the token whose stored text is exactly `text` (for added tokens, their text).
  std::optional<TokenId> find(std::string_view text) const;

  size_t vocab_size() const;
  // The most bytes of text one token stands for: a text of n bytes needs at least n / max_token_bytes()
  // tokens. 0 when some byte has no token and encodes to nothing (then a length bounds nothing).
  size_t max_token_bytes() const;
  bool valid_id(TokenId id) const { return id >= 0 && static_cast<size_t>(id) < vocab_size(); }
  TokenType type(TokenId id) const;
  bool is_control(TokenId id) const { return type(id) == TokenType::control; }
  const SpecialTokenIds& special_ids() const;
  // Ids that end a generation: eos, eot, eom (GLM-5.3: <|endoftext|>, <|user|>, <|observation|>).
  std::vector<TokenId> end_of_generation_ids() const;
  bool add_bos() const;
  PreTokenizerKind pre_tokenizer() const;
  bool ignore_merges() const;
  const std::string& chat_template() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A stand-in for weights that come without a tokenizer (synthetic ones): ids 0-255 are the bytes,
// every other id a user-defined token "<|tN|>", matched in text and decoded as that text. No merges,
// no special ids, so nothing ends a generation but its length.
Expected<Tokenizer> placeholder_tokenizer(size_t vocab_size);

}  // namespace ferry::model
