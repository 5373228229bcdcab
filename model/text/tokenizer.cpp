#include "model/text/tokenizer.hpp"

#include <algorithm>
#include <array>
#include <cstring>

#include "model/text/pre_tokenizer.hpp"
#include "model/text/unicode.hpp"

namespace ferry::model {
namespace {

// GPT-2's byte alphabet: printable bytes stand for themselves, the other 68 are shifted to
// U+0100 onwards, so every byte is a visible character and a token's text is a string of them.
struct ByteAlphabet {
  std::array<uint32_t, 256> byte_to_cp{};
  std::array<int16_t, 324> cp_to_byte{};  // every alphabet code point is below U+0144
  ByteAlphabet() {
    cp_to_byte.fill(-1);
    uint32_t shifted = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      byte_to_cp[b] = printable ? b : shifted++;
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet alphabet;
  return alphabet;
}

uint64_t hash_bytes(std::string_view s) {
  // FNV-1a over 8-byte words, then a final mix: fast on short token texts, good enough spread.
  uint64_t h = 0xcbf29ce484222325ULL ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0x100000001b3ULL;
    h ^= h >> 29;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, s.data() + i, s.size() - i);
  h = (h ^ tail) * 0x9E3779B97F4A7C15ULL;
  return h ^ (h >> 32);
}

uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return x;
}

size_t table_size_for(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  return cap;
}

// Token text -> id, open addressing over ids; the texts live in the token vector.
class TextIndex {
 public:
  void build(const std::vector<std::string>& tokens, const std::vector<TokenType>& types) {
    tokens_ = &tokens;
    slots_.assign(table_size_for(tokens.size()), -1);
    // Normal tokens first: when an added token repeats a normal token's text (deepseek-coder adds
    // single byte-alphabet characters), the text means the normal token.
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t id = 0; id < tokens.size(); ++id) {
        if ((types[id] == TokenType::normal) == (pass == 0)) insert(static_cast<TokenId>(id));
      }
    }
  }
  std::optional<TokenId> find(std::string_view text) const {
    const size_t mask = slots_.size() - 1;
    for (size_t i = hash_bytes(text) & mask;; i = (i + 1) & mask) {
      const TokenId id = slots_[i];
      if (id < 0) return std::nullopt;
      if ((*tokens_)[id] == text) return id;
    }
  }

 private:
  void insert(TokenId id) {
    const std::string& text = (*tokens_)[id];
    const size_t mask = slots_.size() - 1;
    for (size_t i = hash_bytes(text) & mask;; i = (i + 1) & mask) {
      if (slots_[i] < 0) {
        slots_[i] = id;
        return;
      }
      if ((*tokens_)[slots_[i]] == text) return;  // keep the first id of a repeated text
    }
  }
  const std::vector<std::string>* tokens_ = nullptr;
  std::vector<TokenId> slots_;
};

// (left id, right id) -> (rank, merged id), open addressing.
class MergeIndex {
 public:
  struct Merge {
    uint32_t rank;
    TokenId merged;
  };
  void reserve(size_t n) {
    keys_.assign(table_size_for(n), kEmpty);
    values_.resize(keys_.size());
  }
  // False when the pair is already there (a later, worse-ranked duplicate is ignored).
  bool insert(TokenId left, TokenId right, Merge m) {
    const uint64_t key = pack(left, right);
    const size_t mask = keys_.size() - 1;
    for (size_t i = mix64(key) & mask;; i = (i + 1) & mask) {
      if (keys_[i] == kEmpty) {
        keys_[i] = key;
        values_[i] = m;
        return true;
      }
      if (keys_[i] == key) return false;
    }
  }
  const Merge* find(TokenId left, TokenId right) const {
    const uint64_t key = pack(left, right);
    const size_t mask = keys_.size() - 1;
    for (size_t i = mix64(key) & mask;; i = (i + 1) & mask) {
      if (keys_[i] == key) return &values_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t pack(TokenId l, TokenId r) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
  }
  std::vector<uint64_t> keys_;
  std::vector<Merge> values_;
};

// The added tokens (control and user-defined) as a byte trie, for leftmost-longest matching.
class AddedTokenTrie {
 public:
  void insert(std::string_view text, TokenId id, bool control) {
    if (text.empty()) return;
    first_byte_[static_cast<uint8_t>(text[0])] = true;
    uint32_t node = 0;
    for (char c : text) {
      const auto b = static_cast<uint8_t>(c);
      uint32_t next = child(node, b);
      if (next == 0) {
        next = static_cast<uint32_t>(nodes_.size());
        nodes_.push_back({});
        nodes_[node].children.push_back({b, next});
      }
      node = next;
    }
    if (nodes_[node].id < 0) {
      nodes_[node].id = id;
      nodes_[node].control = control;
    }
  }
  // The longest added token starting at text[pos] (control ones only when `parse_special`).
  struct Match {
    TokenId id = -1;
    size_t len = 0;
  };
  Match longest_at(std::string_view text, size_t pos, bool parse_special) const {
    Match best;
    if (!first_byte_[static_cast<uint8_t>(text[pos])]) return best;
    uint32_t node = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      node = child(node, static_cast<uint8_t>(text[i]));
      if (node == 0) break;
      const Node& n = nodes_[node];
      if (n.id >= 0 && (parse_special || !n.control)) best = {n.id, i + 1 - pos};
    }
    return best;
  }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, uint32_t>> children;
    TokenId id = -1;
    bool control = false;
  };
  uint32_t child(uint32_t node, uint8_t b) const {
    for (const auto& [c, next] : nodes_[node].children) {
      if (c == b) return next;
    }
    return 0;
  }
  std::vector<Node> nodes_{Node{}};
  std::array<bool, 256> first_byte_{};
};

bool merges_by_default(PreTokenizerKind kind) { return kind == PreTokenizerKind::glm4; }

}  // namespace

struct Tokenizer::Impl {
  std::vector<std::string> tokens;
  std::vector<TokenType> types;
  std::vector<std::string> bytes;  // what each token decodes to
  TextIndex index;
  MergeIndex merges;
  AddedTokenTrie added;
  std::array<TokenId, 256> byte_token{};
  std::array<std::string, 256> byte_text{};  // a byte in the byte alphabet, as UTF-8
  SpecialTokenIds special;
  bool add_bos = false;
  bool ignore_merges = false;
  PreTokenizerKind pre = PreTokenizerKind::glm4;
  std::string chat_template;
  size_t max_token_bytes = 0;

  // Calls on_added / on_piece in text order; each returns false to stop the split there.
  template <class OnAdded, class OnPiece>
  void split(std::string_view text, bool parse_special, OnAdded on_added, OnPiece on_piece) const;
  void encode_piece(std::string_view piece, std::vector<TokenId>& out) const;
};

namespace {

std::string decode_token_text(std::string_view text, TokenType type) {
  if (type != TokenType::normal) return std::string(text);
  // A normal token is a string of byte-alphabet characters; a character outside the alphabet (a
  // vocabulary that is not byte-level in places) stands for its own UTF-8 bytes.
  const ByteAlphabet& alphabet = byte_alphabet();
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const unicode::Decoded d = unicode::decode_utf8(text, i);
    if (d.cp < alphabet.cp_to_byte.size() && alphabet.cp_to_byte[d.cp] >= 0) {
      out.push_back(static_cast<char>(alphabet.cp_to_byte[d.cp]));
    } else {
      out.append(text.substr(i, d.len));
    }
    i += d.len;
  }
  return out;
}

std::string quoted(std::string_view s) {
  std::string out = "'";
  out.append(s.substr(0, 80));
  if (s.size() > 80) out += "...";
  return out + "'";
}

}  // namespace

Expected<Tokenizer> Tokenizer::create(TokenizerSpec spec) {
  auto impl = std::make_unique<Impl>();
  const auto pre = pre_tokenizer_from_name(spec.pre);
  if (!pre) {
    return Error(ErrorCode::unsupported,
                 "tokenizer.ggml.pre = '" + spec.pre +
                     "' is not a pre-tokenizer ferry implements (glm4, chatglm-bpe, llama3, qwen2, gpt-2, mpt, "
                     "starcoder, falcon, deepseek-coder, ...)");
  }
  impl->pre = *pre;
  if (spec.tokens.empty()) return Error("tokenizer.ggml.tokens is empty");
  if (spec.tokens.size() > static_cast<size_t>(INT32_MAX)) return Error("tokenizer.ggml.tokens has too many tokens");
  const size_t n = spec.tokens.size();
  if (!spec.token_types.empty() && spec.token_types.size() != n) {
    return Error("tokenizer.ggml.token_type has " + std::to_string(spec.token_types.size()) +
                 " entries, expected one per token (" + std::to_string(n) + ")");
  }
  impl->types.resize(n, TokenType::normal);
  for (size_t i = 0; i < spec.token_types.size(); ++i) {
    const int32_t t = spec.token_types[i];
    if (t < 0 || t > 6) {
      return Error("tokenizer.ggml.token_type[" + std::to_string(i) + "] = " + std::to_string(t) +
                   ", expected 0..6");
    }
    impl->types[i] = static_cast<TokenType>(t);
  }
  impl->tokens = std::move(spec.tokens);
  impl->index.build(impl->tokens, impl->types);
  impl->bytes.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    impl->bytes.push_back(decode_token_text(impl->tokens[i], impl->types[i]));
    const TokenType t = impl->types[i];
    if (t == TokenType::control || t == TokenType::user_defined) {
      impl->added.insert(impl->tokens[i], static_cast<TokenId>(i), t == TokenType::control);
    }
  }

  // A byte whose symbol is not in the vocabulary (some vocabularies leave out bytes that never occur
  // in UTF-8, like 0xC0) becomes the unknown token, or is dropped when there is none, as in Hugging
  // Face's BPE model.
  const ByteAlphabet& alphabet = byte_alphabet();
  for (uint32_t b = 0; b < 256; ++b) {
    std::string& text = impl->byte_text[b];
    unicode::append_utf8(text, alphabet.byte_to_cp[b]);
    impl->byte_token[b] = impl->index.find(text).value_or(spec.unk.value_or(-1));
  }
  const bool every_byte_encodes =
      std::all_of(impl->byte_token.begin(), impl->byte_token.end(), [](TokenId id) { return id >= 0; });
  for (const std::string& b : impl->bytes) impl->max_token_bytes = std::max(impl->max_token_bytes, b.size());
  if (!every_byte_encodes) impl->max_token_bytes = 0;

  impl->merges.reserve(spec.merges.size());
  std::string joined;
  for (size_t r = 0; r < spec.merges.size(); ++r) {
    const std::string& m = spec.merges[r];
    const size_t space = m.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 >= m.size() || m.find(' ', space + 1) != std::string::npos) {
      return Error("tokenizer.ggml.merges[" + std::to_string(r) + "] = " + quoted(m) +
                   ": expected two tokens separated by one space");
    }
    const std::string_view left = std::string_view(m).substr(0, space);
    const std::string_view right = std::string_view(m).substr(space + 1);
    joined.assign(left);
    joined.append(right);
    const auto l = impl->index.find(left);
    const auto rt = impl->index.find(right);
    const auto merged = impl->index.find(joined);
    if (!l || !rt || !merged) {
      return Error("tokenizer.ggml.merges[" + std::to_string(r) + "] = " + quoted(m) + ": " +
                   quoted(!l ? left : !rt ? right : std::string_view(joined)) + " is not a token");
    }
    impl->merges.insert(*l, *rt, {static_cast<uint32_t>(r), *merged});
  }

  const auto check_id = [&](const char* key, std::optional<TokenId> id) -> Status {
    if (id && (*id < 0 || static_cast<size_t>(*id) >= n)) {
      return Error(std::string("tokenizer.ggml.") + key + " = " + std::to_string(*id) + " is not a token id (0.." +
                   std::to_string(n - 1) + ")");
    }
    return std::nullopt;
  };
  for (const auto& [key, id] : {std::pair{"bos_token_id", spec.bos}, {"eos_token_id", spec.eos},
                                {"eot_token_id", spec.eot}, {"eom_token_id", spec.eom},
                                {"padding_token_id", spec.pad}, {"unknown_token_id", spec.unk}}) {
    if (auto err = check_id(key, id)) return *err;
  }
  impl->special = {spec.bos, spec.eos, spec.eot, spec.eom, spec.pad, spec.unk};
  impl->add_bos = spec.add_bos;
  impl->ignore_merges = spec.ignore_merges.value_or(merges_by_default(impl->pre));
  impl->chat_template = std::move(spec.chat_template);
  return Tokenizer(std::move(impl));
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<TokenId> out;
  encode(text, parse_special, out);
  return out;
}

void Tokenizer::encode(std::string_view text, bool parse_special, std::vector<TokenId>& out) const {
  impl_->split(
      text, parse_special,
      [&](TokenId id, std::string_view) {
        out.push_back(id);
        return true;
      },
      [&](std::string_view piece) {
        impl_->encode_piece(piece, out);
        return true;
      });
}

bool Tokenizer::encode(std::string_view text, bool parse_special, std::vector<TokenId>& out, size_t max_tokens) const {
  const size_t start = out.size();
  const size_t per_token = impl_->max_token_bytes;
  const auto left = [&] { return max_tokens - (out.size() - start); };  // never called past the cap
  // At least ceil(bytes / per_token) tokens: more than are left means over the cap, whatever BPE does.
  const auto too_long = [&](size_t bytes) { return per_token != 0 && (bytes - 1) / per_token + 1 > left(); };
  if (!text.empty() && too_long(text.size())) return false;
  bool within = true;
  impl_->split(
      text, parse_special,
      [&](TokenId id, std::string_view) {
        out.push_back(id);
        return within = out.size() - start <= max_tokens;
      },
      [&](std::string_view piece) {
        if (too_long(piece.size())) return within = false;
        impl_->encode_piece(piece, out);
        return within = out.size() - start <= max_tokens;
      });
  return within;
}

std::vector<std::string_view> Tokenizer::pre_tokenize(std::string_view text, bool parse_special) const {
  std::vector<std::string_view> pieces;
  const auto add = [&](std::string_view piece) {
    pieces.push_back(piece);
    return true;
  };
  impl_->split(text, parse_special, [&](TokenId, std::string_view piece) { return add(piece); }, add);
  return pieces;
}

// Added tokens first (leftmost-longest), then the pre-tokenizer on the text between them.
template <class OnAdded, class OnPiece>
void Tokenizer::Impl::split(std::string_view text, bool parse_special, OnAdded on_added, OnPiece on_piece) const {
  PreTokenizer pre_tokenizer(pre);
  std::vector<ByteRange> pieces;
  const auto fragment = [&](std::string_view f) {
    if (f.empty()) return true;
    pieces.clear();
    pre_tokenizer.split(f, pieces);
    for (const ByteRange& p : pieces) {
      if (!on_piece(f.substr(p.begin, p.end - p.begin))) return false;
    }
    return true;
  };
  size_t start = 0;
  for (size_t pos = 0; pos < text.size();) {
    const auto match = added.longest_at(text, pos, parse_special);
    if (match.len == 0) {
      ++pos;
      continue;
    }
    if (!fragment(text.substr(start, pos - start))) return;
    if (!on_added(match.id, text.substr(pos, match.len))) return;
    pos += match.len;
    start = pos;
  }
  fragment(text.substr(start));
}

// BPE within one piece, as Hugging Face's `Word::merge_all`: repeatedly merge the adjacent pair of
// lowest rank, the leftmost one first among equals, until no pair has a merge.
void Tokenizer::Impl::encode_piece(std::string_view piece, std::vector<TokenId>& out) const {
  if (piece.size() == 1) {
    if (const TokenId id = byte_token[static_cast<uint8_t>(piece[0])]; id >= 0) out.push_back(id);
    return;
  }
  if (ignore_merges) {
    std::string text;
    text.reserve(piece.size() * 2);
    for (char c : piece) text += byte_text[static_cast<uint8_t>(c)];
    if (const auto id = index.find(text); id && types[*id] == TokenType::normal) {
      out.push_back(*id);
      return;
    }
  }
  struct Symbol {
    TokenId id;
    int32_t prev;
    int32_t next;
  };
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    TokenId left, right, merged;
    // std::push_heap keeps the largest on top: "larger" is the lower rank, then the leftmost.
    bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap;
  symbols.clear();
  heap.clear();
  for (char c : piece) {
    if (const TokenId id = byte_token[static_cast<uint8_t>(c)]; id >= 0) {
      const auto i = static_cast<int32_t>(symbols.size());
      symbols.push_back({id, i - 1, i + 1});
    }
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;
  const auto n = static_cast<int32_t>(symbols.size());
  const auto push_pair = [&](int32_t left) {
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    if (const MergeIndex::Merge* m = merges.find(symbols[left].id, symbols[right].id)) {
      heap.push_back({m->rank, left, symbols[left].id, symbols[right].id, m->merged});
      std::push_heap(heap.begin(), heap.end());
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& left = symbols[c.pos];
    // Stale when either side has merged since: the pair at pos is no longer (left, right).
    if (left.id != c.left || left.next < 0 || symbols[left.next].id != c.right) continue;
    const int32_t right = left.next;
    left.id = c.merged;
    left.next = symbols[right].next;
    if (left.next >= 0) symbols[left.next].prev = c.pos;
    symbols[right].id = -1;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
  // Scratch kept per thread must not keep a giant piece's memory for the life of the thread.
  constexpr size_t kKeep = size_t{1} << 16;
  if (symbols.capacity() > kKeep) std::vector<Symbol>().swap(symbols);
  if (heap.capacity() > kKeep) std::vector<Candidate>().swap(heap);
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool render_special) const {
  std::string out;
  for (TokenId id : ids) {
    if (!valid_id(id)) continue;
    const TokenType t = impl_->types[id];
    if ((t == TokenType::control || t == TokenType::unused) && !render_special) continue;
    out += impl_->bytes[id];
  }
  return out;
}

std::string Tokenizer::token_bytes(TokenId id) const { return valid_id(id) ? impl_->bytes[id] : std::string(); }

std::string_view Tokenizer::piece(TokenId id) const {
  return valid_id(id) ? std::string_view(impl_->tokens[id]) : std::string_view();
}

std::optional<TokenId> Tokenizer::find(std::string_view text) const { return impl_->index.find(text); }

size_t Tokenizer::vocab_size() const { return impl_->tokens.size(); }
size_t Tokenizer::max_token_bytes() const { return impl_->max_token_bytes; }

TokenType Tokenizer::type(TokenId id) const { return valid_id(id) ? impl_->types[id] : TokenType::undefined; }

const SpecialTokenIds& Tokenizer::special_ids() const { return impl_->special; }

std::vector<TokenId> Tokenizer::end_of_generation_ids() const {
  std::vector<TokenId> ids;
  for (const auto& id : {impl_->special.eos, impl_->special.eot, impl_->special.eom}) {
    if (id && std::find(ids.begin(), ids.end(), *id) == ids.end()) ids.push_back(*id);
  }
  return ids;
}

bool Tokenizer::add_bos() const { return impl_->add_bos; }
PreTokenizerKind Tokenizer::pre_tokenizer() const { return impl_->pre; }
bool Tokenizer::ignore_merges() const { return impl_->ignore_merges; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }

Expected<Tokenizer> placeholder_tokenizer(size_t vocab_size) {
  TokenizerSpec spec;
  const ByteAlphabet& alphabet = byte_alphabet();
  for (size_t i = 0; i < vocab_size; ++i) {
    std::string text;
    if (i < 256) {
      unicode::append_utf8(text, alphabet.byte_to_cp[i]);
    } else {
      text = "<|t" + std::to_string(i) + "|>";
    }
    spec.tokens.push_back(std::move(text));
    spec.token_types.push_back(static_cast<int32_t>(i < 256 ? TokenType::normal : TokenType::user_defined));
  }
  return Tokenizer::create(std::move(spec));
}

}  // namespace ferry::model
