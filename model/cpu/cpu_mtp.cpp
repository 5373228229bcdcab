#include "model/cpu/cpu_mtp.hpp"

#include <algorithm>

#include "model/cpu/sampler.hpp"

namespace ferry::model {

std::vector<int32_t> CpuMtp::extend(SequenceState& state, uint32_t slot, uint32_t start,
                                    std::span<const int32_t> tokens, const float* hidden, uint32_t confirmed,
                                    int32_t next, uint32_t draft) {
  const Glm5Hparams& hp = forward_.hparams();
  const size_t D = hp.hidden_size;
  const uint32_t end = start + confirmed;  // positions below it are kept
  const uint32_t from = state.mtp_tokens();
  // The cache is one entry short of the positions held (one waits for its token) or complete; an
  // older gap (a state restored from elsewhere) cannot be filled: the slot drafts nothing.
  if (from + 1 < start || from > end) return {};
  std::vector<float> h;
  std::vector<int32_t> pair;
  for (uint32_t p = from; p < end; ++p) {
    int32_t token = p + 1 < end ? tokens[p + 1 - start] : next;
    if (token < 0) {
      pending_[slot].assign(hidden + size_t{p - start} * D, hidden + size_t{p - start + 1} * D);
      break;
    }
    if (p + 1 == start) {
      // A pending state lost to a restore from a saved image enters as zeros (drafts only get worse).
      const std::vector<float>& ph = pending_[slot];
      if (ph.size() == D) {
        h.insert(h.end(), ph.begin(), ph.end());
      } else {
        h.insert(h.end(), D, 0.0f);
      }
    } else {
      h.insert(h.end(), hidden + size_t{p - start} * D, hidden + size_t{p - start + 1} * D);
    }
    pair.push_back(token);
  }
  if (next >= 0) pending_[slot].clear();
  if (pair.empty()) return {};
  std::vector<float> out;
  forward_.mtp_forward(state, h.data(), pair, out);
  std::vector<int32_t> drafts;
  if (next < 0 || draft == 0) return drafts;
  const uint32_t kept = state.mtp_tokens();
  std::vector<float> logits(hp.vocab_size);
  std::vector<float> last(out.end() - static_cast<ptrdiff_t>(D), out.end());
  for (uint32_t k = 0; k < draft; ++k) {
    forward_.mtp_logits(last.data(), 1, logits.data());
    drafts.push_back(argmax_token(logits));
    if (k + 1 == draft) break;
    forward_.mtp_forward(state, last.data(), std::span<const int32_t>(&drafts.back(), 1), out);
    last = out;
  }
  state.set_tokens(state.tokens(), kept);
  return drafts;
}

}  // namespace ferry::model
