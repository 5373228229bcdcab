#pragma once
// Turns generated token ids into text as they arrive. What it returns is always valid UTF-8: the
// bytes of a character split across tokens are held until the character is complete, and a byte
// sequence that can never become valid is replaced by U+FFFD (as Hugging Face's decoder does). A
// special token's text is returned whole, in the call for that token, never cut.
#include <string>
#include <string_view>

#include "model/text/tokenizer.hpp"

namespace ferry::model {

class StreamingDetokenizer {
 public:
  // The tokenizer must outlive this object. Control tokens give their text when `render_special`.
  explicit StreamingDetokenizer(const Tokenizer& tokenizer, bool render_special = true);

  // The text that became complete with this token (may be empty).
  std::string push(TokenId id);
  // The held bytes of an unfinished character, as U+FFFD; call once at the end of the stream.
  std::string finish();
  // Bytes held back waiting for the rest of a character (0 to 3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  std::string drain(bool final);

  const Tokenizer* tokenizer_;
  bool render_special_;
  std::string pending_;
};

// Appends the longest prefix of `bytes` that is valid UTF-8 up to a possibly unfinished last
// character, replacing every invalid sequence by U+FFFD (maximal subparts, as WHATWG and Python's
// errors="replace" do); returns how many trailing bytes were left because they may still become a
// character. With `final`, nothing is left: an unfinished tail becomes U+FFFD.
size_t append_valid_utf8(std::string& out, std::string_view bytes, bool final);

}  // namespace ferry::model
