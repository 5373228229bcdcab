#pragma once
// The pre-tokenizers: split text (with no added tokens in it) into the pieces that BPE merges
// within. Each is the regex sequence of a Hugging Face tokenizer.json (Split, "Isolated"), written
// as a hand-made scanner over code points; the regexes are in pre_tokenizer.cpp next to their code.
#include <cstdint>
#include <string_view>
#include <vector>

#include "model/text/tokenizer.hpp"

namespace ferry::model {

struct ByteRange {
  uint32_t begin;
  uint32_t end;
};

class PreTokenizer {
 public:
  explicit PreTokenizer(PreTokenizerKind kind) : kind_(kind) {}

  // Appends the pieces of `text` as byte ranges of `text`, in order, covering it exactly.
  // `text` must be shorter than 4 GiB.
  void split(std::string_view text, std::vector<ByteRange>& pieces);

 private:
  struct Range {
    uint32_t begin;
    uint32_t end;
  };
  template <class Match>
  void split_isolated(const std::vector<Range>& in, std::vector<Range>& out, Match match) const;

  // Matchers: the length in code points of the match at `i` within a piece ending at `end` (the
  // end of the piece is the end of the string for the regex), 0 when the regex does not match at i.
  uint32_t match_glm4(uint32_t i, uint32_t end, uint32_t max_digits) const;
  uint32_t match_gpt2(uint32_t i, uint32_t end) const;
  uint32_t run_of(uint32_t i, uint32_t end, uint8_t flag) const;

  PreTokenizerKind kind_;
  // Scratch, reused between calls: the code points of the text, their category flags, the byte
  // offset of each (plus the end), and the ranges of the current and the next stage.
  std::vector<uint32_t> cps_;
  std::vector<uint8_t> flags_;
  std::vector<uint32_t> offsets_;
  std::vector<Range> ranges_a_;
  std::vector<Range> ranges_b_;
};

}  // namespace ferry::model
