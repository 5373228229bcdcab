#pragma once
// Everything one slot's sequence leaves behind for its next tokens: per KDA layer the conv inputs and
// the recurrent state (constant size), per DSA layer the latent and indexer caches (growing with the
// sequence), and the MTP block's own DSA cache. Prefill chunks of any size and single decode tokens
// continue the same state; the result equals one pass over the whole sequence.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/cpu/dsa.hpp"
#include "model/cpu/kda.hpp"
#include "config/kv_type.hpp"
#include "config/stage_split.hpp"
#include "model/glm5/glm5_hparams.hpp"

namespace ferry::model {

KdaConfig kda_config(const Glm5Hparams& hp);
DsaConfig dsa_config(const Glm5Hparams& hp);

class SequenceState {
 public:
  // The whole model's state (every trunk layer and the MTP block).
  explicit SequenceState(const Glm5Hparams& hp, config::KvFormats formats = {});
  // A stage's part: trunk layers [first, end), and the MTP block when with_mtp; DSA rows in `formats`.
  SequenceState(const Glm5Hparams& hp, config::LayerRange layers, bool with_mtp, config::KvFormats formats = {});

  void reset();
  uint32_t tokens() const { return tokens_; }           // trunk positions held
  uint32_t mtp_tokens() const { return mtp_.empty() ? 0 : static_cast<uint32_t>(mtp_[0].tokens); }

  // Preconditions: `layer` is one of the state's layers, of that kind.
  KdaState& kda(uint32_t layer) { return kda_[slot_[layer]]; }
  DsaCache& dsa(uint32_t layer) { return dsa_[slot_[layer]]; }
  DsaCache& mtp(uint32_t block) { return mtp_[block]; }  // block 0 = layer n_layers

  void advance(uint32_t n) { tokens_ += n; }
  // The state holds `tokens` trunk and `mtp_tokens` MTP positions: fewer than now drops the DSA
  // caches' later rows (the KDA state is the caller's to restore: it cannot be rolled back); after a
  // restore that filled the caches it records their length.
  void set_tokens(uint32_t tokens, uint32_t mtp_tokens);
  // Bytes held now (KDA state is fixed; the DSA caches grow with the tokens).
  size_t bytes() const;

 private:
  KdaConfig kda_cfg_;
  uint32_t kpool_ = 1;
  uint32_t tokens_ = 0;
  std::vector<uint32_t> slot_;  // layer -> index into kda_ or dsa_
  std::vector<KdaState> kda_;
  std::vector<DsaCache> dsa_;
  std::vector<DsaCache> mtp_;
};

}  // namespace ferry::model
