#include "model/cpu/sequence_state.hpp"

#include <algorithm>

namespace ferry::model {

KdaConfig kda_config(const Glm5Hparams& hp) {
  KdaConfig c;
  c.heads = hp.kda_heads;
  c.head_dim = hp.kda_head_dim;
  c.conv_kernel = hp.conv_kernel;
  c.lower_bound = hp.kda_lower_bound;
  c.norm_eps = hp.rms_eps;
  return c;
}

DsaConfig dsa_config(const Glm5Hparams& hp) {
  DsaConfig c;
  c.heads = hp.n_heads;
  c.q_lora_rank = hp.q_lora_rank;
  c.kv_lora_rank = hp.kv_lora_rank;
  c.nope_dim = hp.qk_nope_head_dim;
  c.v_dim = hp.v_head_dim;
  c.index_heads = hp.index_n_heads;
  c.index_dim = hp.index_head_dim;
  c.index_topk = hp.index_topk;
  c.kpool = hp.index_kpool;
  c.select_tail = hp.index_select_tail;
  c.rms_eps = hp.rms_eps;
  c.index_norm_eps = hp.index_norm_eps;
  return c;
}

SequenceState::SequenceState(const Glm5Hparams& hp, config::KvFormats formats)
    : SequenceState(hp, {0, hp.n_layers}, true, formats) {}

SequenceState::SequenceState(const Glm5Hparams& hp, config::LayerRange layers, bool with_mtp,
                             config::KvFormats formats)
    : kda_cfg_(kda_config(hp)), kpool_(std::max<uint32_t>(1, hp.index_kpool)) {
  const DsaCache empty(formats, hp.kv_lora_rank, hp.index_head_dim);
  slot_.assign(hp.n_layers, 0);
  for (uint32_t il = layers.first; il < layers.end; ++il) {
    if (hp.layer_kinds[il] == LayerKind::kda) {
      slot_[il] = static_cast<uint32_t>(kda_.size());
      kda_.emplace_back();
    } else {
      slot_[il] = static_cast<uint32_t>(dsa_.size());
      dsa_.push_back(empty);
    }
  }
  if (with_mtp) mtp_.assign(hp.n_nextn_layers, empty);
  reset();
}

void SequenceState::reset() {
  tokens_ = 0;
  for (KdaState& k : kda_) k.reset(kda_cfg_);
  for (DsaCache& d : dsa_) d.reset();
  for (DsaCache& d : mtp_) d.reset();
}

void SequenceState::set_tokens(uint32_t tokens, uint32_t mtp_tokens) {
  tokens_ = tokens;
  for (DsaCache& d : dsa_) d.set_tokens(tokens, kpool_);
  for (DsaCache& d : mtp_) d.set_tokens(mtp_tokens, kpool_);
}

size_t SequenceState::bytes() const {
  size_t n = 0;
  for (const KdaState& k : kda_) n += (k.conv.size() + k.s.size()) * sizeof(float);
  auto cache = [](const DsaCache& d) {
    return d.latent.bytes() + d.index_k.bytes() + d.index_gate.bytes() + d.pool_keys.size() * sizeof(float);
  };
  for (const DsaCache& d : dsa_) n += cache(d);
  for (const DsaCache& d : mtp_) n += cache(d);
  return n;
}

}  // namespace ferry::model
