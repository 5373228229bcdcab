#pragma once
// The MTP block on the last CPU stage. Each slot's MTP cache keeps one entry per confirmed position
// p: the trunk's final hidden state at p with the token at p + 1 (as the reference runs it over a
// whole sequence). The last position waits for its next token: its hidden state is kept (pending)
// until the token is drawn or fed. After a drawn token the block drafts the tokens after it; drafts
// past the first are the block fed its own output and leave no entry behind.
#include <cstdint>
#include <span>
#include <vector>

#include "model/cpu/glm5_forward.hpp"
#include "model/cpu/sequence_state.hpp"

namespace ferry::model {

class CpuMtp {
 public:
  CpuMtp(Glm5Forward& forward, uint32_t slots) : forward_(forward), pending_(slots) {}

  void reset(uint32_t slot) { pending_[slot].clear(); }
  // The hidden state of the slot's last position when it waits for its token (empty when not).
  const std::vector<float>& pending(uint32_t slot) const { return pending_[slot]; }
  void set_pending(uint32_t slot, std::vector<float> hidden) { pending_[slot] = std::move(hidden); }

  // After a row set of `state` (rows `tokens` from `start`, `hidden` their final hidden states) of
  // which the first `confirmed` are kept, and `next` drawn after them (-1: none): the cache gets the
  // entries of the confirmed positions, and, with a token drawn, up to `draft` greedy drafts.
  std::vector<int32_t> extend(SequenceState& state, uint32_t slot, uint32_t start, std::span<const int32_t> tokens,
                              const float* hidden, uint32_t confirmed, int32_t next, uint32_t draft);

 private:
  Glm5Forward& forward_;
  std::vector<std::vector<float>> pending_;
};

}  // namespace ferry::model
