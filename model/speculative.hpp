#pragma once
// Speculative decoding of one slot with the MTP block's drafts, on the engine's side: the rows of
// its next step and what a step's result confirms. A step feeds the tokens the stages do not keep yet
// (the last drawn one; after a rejected draft also the kept rows since the verify set's start) and
// the drafts behind them. Every stage keeps the state at a verify set's start, so a rejection costs
// no step of its own: the next set starts there again, carrying the rows it keeps (a few more rows in
// a step cost far less than a step). Sampled rows verify the same way (SlotRows::verify): the tokens
// are those of plain decoding with the same seed.
#include <cstdint>
#include <vector>

#include "model/step.hpp"

namespace ferry::model {

struct SpecCounts {
  uint64_t drafted = 0;   // drafts sent to be verified
  uint64_t accepted = 0;  // of them, accepted
  uint64_t steps = 0;     // decode steps
  uint64_t tokens = 0;    // tokens they confirmed
};

class SpecDecoder {
 public:
  // A slot that holds `start` positions and has drawn `next` after them, with the MTP's drafts.
  SpecDecoder(uint32_t start, int32_t next, std::vector<int32_t> drafts);

  // The next step's rows: at most `k` drafts (0: plain decode), and `k` new drafts asked for.
  SlotRows rows(uint32_t slot, const SamplingParams& sampling, uint32_t k) const;
  // The result of `sent` (the last rows()): the tokens it confirms, in order.
  std::vector<int32_t> apply(const SlotRows& sent, const SlotResult& result);

  uint32_t start() const { return start_; }                  // where the next rows start
  uint32_t confirmed() const;                                // positions kept, with the drawn token(s)
  const std::vector<int32_t>& drafts() const { return drafts_; }
  const SpecCounts& counts() const { return counts_; }

 private:
  uint32_t start_;
  std::vector<int32_t> feed_;    // tokens from start_ to feed: the last is the latest draw
  std::vector<int32_t> drafts_;  // guesses of the tokens after feed_
  SpecCounts counts_;
};

}  // namespace ferry::model
