#pragma once
// DSA layers: MLA without RoPE over a cache of per-token latents, and the lightning indexer that
// chooses, per query, which cached tokens the attention sees.
//
// Attention ("absorbed" MLA): c_s = rmsnorm(kv_a x_s) is the 512-wide latent the cache keeps. Per
// head, k_s = K_h c_s and v_s = V_h c_s (the two halves of kv_b), so q . k_s = (K_h^T q) . c_s and
// sum_s p_s v_s = V_h (sum_s p_s c_s): attention runs on the latents directly. Scale (nope)^-0.5.
//
// Indexer: per token it caches kk = layernorm(wk x) (with bias, eps 1e-6) and gate = W_gate x. Tokens
// form pools of kpool consecutive tokens from position 0; a complete pool's key is, per channel, the
// softmax over its kpool tokens of (gate + ape[position in pool]) weighting their kk. A query at
// position t scores each complete pool whose last token is visible (<= t):
//   score(p) = sum_h w_h relu(kq_h . key_p / sqrt(index_head_dim)),  w = weights_proj x / sqrt(index_heads)
// keeps the top index_topk/kpool pools (all visible ones when they are fewer) and, with
// kpool_select_tail, the tokens of its own incomplete pool. Attention runs over exactly those tokens.
//
// Tie rule: pools with equal scores are ranked by the lower pool index (the earlier pool wins). The
// reference (torch.topk) leaves ties unspecified; the fixtures keep every top-k boundary margin far
// above rounding, so the rule only decides true ties (e.g. pools that all score exactly 0 because
// every indexer head's dot product is negative).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "config/kv_type.hpp"
#include "kv/kv_rows.hpp"
#include "model/cpu/cpu_ops.hpp"

namespace ferry::model {

struct Glm5LayerWeights;

struct DsaConfig {
  uint32_t heads = 0, q_lora_rank = 0, kv_lora_rank = 0, nope_dim = 0, v_dim = 0;
  uint32_t index_heads = 0, index_dim = 0, index_topk = 0, kpool = 1;
  bool select_tail = true;
  float rms_eps = 1e-5f;
  float index_norm_eps = 1e-6f;
};

// One slot's cache for one DSA layer (or the MTP block): latent rows and the indexer's keys and gates
// in their KV formats (attention and pool keys see the decoded rows), pool keys in f32.
struct DsaCache {
  DsaCache() = default;
  DsaCache(config::KvFormats formats, uint32_t kv_lora_rank, uint32_t index_dim)
      : latent(formats.latent, kv_lora_rank), index_k(formats.index, index_dim), index_gate(formats.index, index_dim) {}
  size_t tokens = 0;
  kv::KvRows latent;              // tokens x kv_lora_rank
  kv::KvRows index_k;             // (tokens - keys_from) x index_dim (empty in a layer without an indexer)
  kv::KvRows index_gate;          // (tokens - keys_from) x index_dim
  size_t keys_from = 0;           // the position of index_k's first row: a restore brings only the
                                  // incomplete pool's (model/slot_state.hpp), a pool boundary
  std::vector<float> pool_keys;   // (tokens / kpool) x index_dim: keys of the complete pools
  void reset();
  // Holds `t` tokens: fewer than now keeps the first t (and the pools they complete; t must not be
  // before keys_from); otherwise the rows must already be there (a restore filled them).
  void set_tokens(size_t t, size_t kpool);
};

// A complete pool's key: keys, gates [kpool][dim] of its tokens, ape [kpool][dim].
void pool_key(const float* keys, const float* gates, const float* ape, size_t kpool, size_t dim, float* out);

// The pools a query keeps: indices of the `budget` highest scores (ties: lower index first),
// returned in ascending order; all of them when there are no more than `budget`.
void select_pools(std::span<const float> scores, size_t budget, std::vector<uint32_t>& out);

// The token positions a query at `pos` attends to, given its selected pools: the pools' tokens then,
// with select_tail, the tokens of its own incomplete pool (pos - (pos+1) % kpool + 1 .. pos).
void expand_selection(std::span<const uint32_t> pools, uint32_t pos, uint32_t kpool, bool select_tail,
                      std::vector<uint32_t>& tokens);

struct DsaSegment {
  size_t row0 = 0;
  size_t rows = 0;
  uint32_t start = 0;  // position of the first row (= tokens the cache held before)
  DsaCache* cache = nullptr;
};

// Called once per query row, on the calling thread, with the pools it selected (evaluation) and the
// cut's margin: the score of the last pool selected minus that of the best one left out (infinite
// when every visible pool is selected; a shared layer's are its indexer layer's).
using SelectionObserver =
    std::function<void(uint32_t layer, size_t row, uint32_t pos, std::span<const uint32_t> pools, float margin)>;

// Per-row selections handed from a full indexer layer to the "shared" DSA layers after it.
struct DsaSelections {
  bool valid = false;
  std::vector<std::vector<uint32_t>> tokens;  // per row
  std::vector<std::vector<uint32_t>> pools;   // per row
  std::vector<float> margins;                 // per row, with an observer (SelectionObserver's margin)
};

// The whole layer: x [tokens][D] (after the layer's input norm) -> y [tokens][D]. Appends the new
// tokens to each segment's cache first (a query sees its own token and earlier ones only).
void dsa_layer(const DsaConfig& c, const Glm5LayerWeights& w, const float* x, size_t tokens,
               std::span<const DsaSegment> segments, float* y, DsaSelections& selections, ThreadPool& pool,
               const SelectionObserver* observer = nullptr);

}  // namespace ferry::model
