#include "model/text/pre_tokenizer.hpp"

#include <algorithm>
#include <array>
#include <utility>

#include "model/text/unicode.hpp"

namespace ferry::model {

using namespace unicode;

std::optional<PreTokenizerKind> pre_tokenizer_from_name(std::string_view name) {
  static constexpr std::array<std::pair<std::string_view, PreTokenizerKind>, 21> kNames{{
      {"glm4", PreTokenizerKind::glm4},
      {"glm5", PreTokenizerKind::glm4},  // mainline llama.cpp's name for the same pre-tokenizer (PR #27773)
      {"chatglm-bpe", PreTokenizerKind::glm4},
      {"llama3", PreTokenizerKind::glm4},
      {"llama-bpe", PreTokenizerKind::glm4},
      {"dbrx", PreTokenizerKind::glm4},
      {"smaug-bpe", PreTokenizerKind::glm4},
      {"qwen2", PreTokenizerKind::qwen2},
      {"stablelm2", PreTokenizerKind::qwen2},
      {"gpt-2", PreTokenizerKind::gpt2},
      {"gpt2", PreTokenizerKind::gpt2},
      {"mpt", PreTokenizerKind::gpt2},
      {"olmo", PreTokenizerKind::gpt2},
      {"jais", PreTokenizerKind::gpt2},
      {"starcoder", PreTokenizerKind::starcoder},
      {"refact", PreTokenizerKind::starcoder},
      {"command-r", PreTokenizerKind::starcoder},
      {"smollm", PreTokenizerKind::starcoder},
      {"codeshell", PreTokenizerKind::starcoder},
      {"falcon", PreTokenizerKind::falcon},
      {"deepseek-coder", PreTokenizerKind::deepseek_coder},
  }};
  for (const auto& [n, kind] : kNames) {
    if (n == name) return kind;
  }
  return std::nullopt;
}

namespace {

constexpr uint8_t kLetterOrNumber = kLetter | kNumber;
constexpr uint8_t kNotOther = kLetter | kNumber | kWhiteSpace;  // [^\s\p{L}\p{N}] is what has none

bool is_newline(uint32_t cp) { return cp == '\r' || cp == '\n'; }

// Case-insensitive comparison for (?i:'s|'t|'re|'ve|'m|'ll|'d): Oniguruma folds U+017F LATIN SMALL
// LETTER LONG S to 's' (so "'ſ" is a contraction for GLM's tokenizer, as it is for the reference).
uint32_t fold(uint32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp + ('a' - 'A');
  if (cp == 0x17F) return 's';
  return cp;
}

// Length of the contraction 's 't 're 've 'm 'll 'd at i (0 if none); `folded` for (?i:...).
uint32_t contraction(const std::vector<uint32_t>& cps, uint32_t i, uint32_t end, bool folded) {
  if (cps[i] != '\'' || i + 1 >= end) return 0;
  const auto at = [&](uint32_t k) { return folded ? fold(cps[k]) : cps[k]; };
  const uint32_t c1 = at(i + 1);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (i + 2 >= end) return 0;
  const uint32_t c2 = at(i + 2);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

// [一-龥ࠀ-一가-퟿]: the CJK ranges of deepseek-coder's regex.
bool is_deepseek_cjk(uint32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FA5) || (cp >= 0x0800 && cp <= 0x4E00) || (cp >= 0xAC00 && cp <= 0xD7FF);
}

// [\p{P}\$\+<=>\^~\|`]: falcon's punctuation class.
bool is_falcon_punct(uint32_t cp, uint8_t flags) {
  if (flags & kPunctuation) return true;
  switch (cp) {
    case '$': case '+': case '<': case '=': case '>': case '^': case '~': case '|': case '`':
      return true;
    default:
      return false;
  }
}

}  // namespace

uint32_t PreTokenizer::run_of(uint32_t i, uint32_t end, uint8_t flag) const {
  while (i < end && (flags_[i] & flag)) ++i;
  return i;
}

// glm4 (llama3 with \p{N}{1,3}), and qwen2 with \p{N}:
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
// Every code point starts a match of one of the alternatives, so the pieces cover the text.
uint32_t PreTokenizer::match_glm4(uint32_t i, uint32_t end, uint32_t max_digits) const {
  if (uint32_t n = contraction(cps_, i, end, /*folded=*/true)) return n;
  const uint8_t f = flags_[i];
  if (f & kLetter) return run_of(i, end, kLetter) - i;
  if (!is_newline(cps_[i]) && !(f & kLetterOrNumber) && i + 1 < end && (flags_[i + 1] & kLetter)) {
    return run_of(i + 1, end, kLetter) - i;
  }
  if (f & kNumber) return std::min(run_of(i, end, kNumber) - i, max_digits);
  uint32_t j = end;  // start of the [^\s\p{L}\p{N}]+ run, if the alternative applies
  if (!(f & kNotOther)) {
    j = i;
  } else if (cps_[i] == ' ' && i + 1 < end && !(flags_[i + 1] & kNotOther)) {
    j = i + 1;
  }
  if (j < end) {
    uint32_t k = j;
    while (k < end && !(flags_[k] & kNotOther)) ++k;
    while (k < end && is_newline(cps_[k])) ++k;
    return k - i;
  }
  // Whitespace. \s*[\r\n]+ ends at the last newline of the run; \s+(?!\S) leaves the run's last
  // space to the word after it; \s+ takes a lone space before a non-space.
  const uint32_t e = run_of(i, end, kWhiteSpace);
  for (uint32_t k = e; k > i; --k) {
    if (is_newline(cps_[k - 1])) return k - i;
  }
  if (e == end || e - i == 1) return e - i;
  return e - 1 - i;
}

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
uint32_t PreTokenizer::match_gpt2(uint32_t i, uint32_t end) const {
  if (uint32_t n = contraction(cps_, i, end, /*folded=*/false)) return n;
  const uint32_t s = (cps_[i] == ' ' && i + 1 < end) ? i + 1 : i;  // after the optional space
  for (uint32_t start : {s, i}) {
    const uint8_t f = flags_[start];
    if (f & kLetter) return run_of(start, end, kLetter) - i;
    if (f & kNumber) return run_of(start, end, kNumber) - i;
    if (!(f & kNotOther)) {
      uint32_t k = start;
      while (k < end && !(flags_[k] & kNotOther)) ++k;
      return k - i;
    }
    if (start == i) break;
  }
  const uint32_t e = run_of(i, end, kWhiteSpace);
  if (e == end || e - i == 1) return e - i;
  return e - 1 - i;
}

// A regex Split with "Isolated" behaviour over every range of `in`: matches and the text between
// them become pieces, in order.
template <class Match>
void PreTokenizer::split_isolated(const std::vector<Range>& in, std::vector<Range>& out, Match match) const {
  out.clear();
  for (const Range& r : in) {
    uint32_t gap = r.begin;
    uint32_t i = r.begin;
    while (i < r.end) {
      const uint32_t len = match(i, r.end);
      if (len == 0) {
        ++i;
        continue;
      }
      if (gap < i) out.push_back({gap, i});
      out.push_back({i, i + len});
      i += len;
      gap = i;
    }
    if (gap < r.end) out.push_back({gap, r.end});
  }
}

void PreTokenizer::split(std::string_view text, std::vector<ByteRange>& pieces) {
  cps_.clear();
  flags_.clear();
  offsets_.clear();
  for (size_t i = 0; i < text.size();) {
    const Decoded d = decode_utf8(text, i);
    cps_.push_back(d.cp);
    flags_.push_back(unicode::flags(d.cp));
    offsets_.push_back(static_cast<uint32_t>(i));
    i += d.len;
  }
  offsets_.push_back(static_cast<uint32_t>(text.size()));
  const auto n = static_cast<uint32_t>(cps_.size());
  if (n == 0) return;

  ranges_a_.assign(1, Range{0, n});
  // Each stage reads ranges_a_ and writes ranges_b_; the swap makes its output the next input.
  const auto stage = [&](auto&& match) {
    split_isolated(ranges_a_, ranges_b_, match);
    std::swap(ranges_a_, ranges_b_);
  };
  const auto single = [&](auto&& pred) {
    return [&, pred](uint32_t i, uint32_t) -> uint32_t { return pred(i) ? 1 : 0; };
  };
  const auto gpt2 = [&](uint32_t i, uint32_t end) { return match_gpt2(i, end); };

  switch (kind_) {
    case PreTokenizerKind::glm4:
      stage([&](uint32_t i, uint32_t end) { return match_glm4(i, end, 3); });
      break;
    case PreTokenizerKind::qwen2:
      stage([&](uint32_t i, uint32_t end) { return match_glm4(i, end, 1); });
      break;
    case PreTokenizerKind::gpt2:
      stage(gpt2);
      break;
    case PreTokenizerKind::starcoder:  // \p{N}, then GPT-2's regex
      stage(single([&](uint32_t i) { return (flags_[i] & kNumber) != 0; }));
      stage(gpt2);
      break;
    case PreTokenizerKind::falcon:  // [\p{P}\$\+<=>\^~\|`]+, GPT-2's regex, [0-9][0-9][0-9]
      stage([&](uint32_t i, uint32_t end) {
        uint32_t k = i;
        while (k < end && is_falcon_punct(cps_[k], flags_[k])) ++k;
        return k - i;
      });
      stage(gpt2);
      stage([&](uint32_t i, uint32_t end) -> uint32_t {
        if (i + 3 > end) return 0;
        for (uint32_t k = i; k < i + 3; ++k) {
          if (cps_[k] < '0' || cps_[k] > '9') return 0;
        }
        return 3;
      });
      break;
    case PreTokenizerKind::deepseek_coder:  // [\r\n], \s?\p{L}+, \s?\p{P}+, [一-龥ࠀ-一가-퟿]+, \p{N}
      stage(single([&](uint32_t i) { return is_newline(cps_[i]); }));
      for (const uint8_t cls : {kLetter, kPunctuation}) {
        stage([&, cls](uint32_t i, uint32_t end) -> uint32_t {
          if ((flags_[i] & kWhiteSpace) && i + 1 < end && (flags_[i + 1] & cls)) return run_of(i + 1, end, cls) - i;
          if (flags_[i] & cls) return run_of(i, end, cls) - i;
          return 0;
        });
      }
      stage([&](uint32_t i, uint32_t end) {
        uint32_t k = i;
        while (k < end && is_deepseek_cjk(cps_[k])) ++k;
        return k - i;
      });
      stage(single([&](uint32_t i) { return (flags_[i] & kNumber) != 0; }));
      break;
  }
  for (const Range& r : ranges_a_) pieces.push_back({offsets_[r.begin], offsets_[r.end]});
}

}  // namespace ferry::model
