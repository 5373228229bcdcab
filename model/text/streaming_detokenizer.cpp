#include "model/text/streaming_detokenizer.hpp"

namespace ferry::model {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// How many bytes a well-formed sequence starting with `b` needs, and the range its second byte
// must lie in (Unicode's Table 3-7), so that overlongs and surrogates are caught at the first bad
// byte, as a decoder that replaces "maximal subparts" does.
struct Lead {
  uint32_t len;
  uint8_t lo;
  uint8_t hi;
};

Lead lead(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};  // 0x80..0xC1, 0xF5..0xFF never start a character
}

}  // namespace

size_t append_valid_utf8(std::string& out, std::string_view bytes, bool final) {
  size_t i = 0;
  size_t run = 0;  // start of the valid bytes not yet copied
  while (i < bytes.size()) {
    const auto b = static_cast<uint8_t>(bytes[i]);
    const Lead l = lead(b);
    if (l.len == 1) {
      ++i;
      continue;
    }
    if (l.len == 0) {
      out.append(bytes.substr(run, i - run));
      out += kReplacement;
      run = ++i;
      continue;
    }
    // Count the continuation bytes that fit: the second within [lo, hi], the others 80..BF.
    uint32_t k = 1;
    while (k < l.len && i + k < bytes.size()) {
      const auto c = static_cast<uint8_t>(bytes[i + k]);
      const bool ok = k == 1 ? (c >= l.lo && c <= l.hi) : (c >= 0x80 && c <= 0xBF);
      if (!ok) break;
      ++k;
    }
    if (k == l.len) {
      i += k;
      continue;
    }
    if (i + k == bytes.size() && !final) {
      // An unfinished character at the end: hold it back.
      out.append(bytes.substr(run, i - run));
      return bytes.size() - i;
    }
    out.append(bytes.substr(run, i - run));
    out += kReplacement;
    i += k;
    run = i;
  }
  out.append(bytes.substr(run));
  return 0;
}

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer, bool render_special)
    : tokenizer_(&tokenizer), render_special_(render_special) {}

std::string StreamingDetokenizer::push(TokenId id) {
  const TokenType type = tokenizer_->type(id);
  if (!tokenizer_->valid_id(id) || ((type == TokenType::control || type == TokenType::unused) && !render_special_)) {
    return {};
  }
  if (type == TokenType::control || type == TokenType::user_defined) {
    // An added token is text of its own: what was held before it can no longer be completed.
    std::string out = drain(/*final=*/true);
    out += tokenizer_->token_bytes(id);
    return out;
  }
  pending_ += tokenizer_->token_bytes(id);
  return drain(/*final=*/false);
}

std::string StreamingDetokenizer::finish() { return drain(/*final=*/true); }

std::string StreamingDetokenizer::drain(bool final) {
  std::string out;
  const size_t held = append_valid_utf8(out, pending_, final);
  pending_.erase(0, pending_.size() - held);
  return out;
}

}  // namespace ferry::model
