#include "model/cpu/dsa.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

#include "model/glm5/glm5_weights.hpp"

namespace ferry::model {

void DsaCache::reset() {
  tokens = 0;
  latent.clear();
  index_k.clear();
  index_gate.clear();
  keys_from = 0;
  pool_keys.clear();
}

void DsaCache::set_tokens(size_t t, size_t kpool) {
  if (t >= tokens) {
    tokens = t;
    return;
  }
  if (t < keys_from) {
    throw std::logic_error("DSA cache cut back to " + std::to_string(t) + " tokens, before its first indexer key at " +
                           std::to_string(keys_from));
  }
  latent.truncate(t);
  index_k.truncate(std::min(index_k.rows(), t - keys_from));
  index_gate.truncate(std::min(index_gate.rows(), t - keys_from));
  pool_keys.resize(std::min(pool_keys.size(), t / kpool * index_k.width()));
  tokens = t;
}

void pool_key(const float* keys, const float* gates, const float* ape, size_t kpool, size_t dim, float* out) {
  std::vector<float> p(kpool);
  for (size_t d = 0; d < dim; ++d) {
    for (size_t i = 0; i < kpool; ++i) p[i] = gates[i * dim + d] + ape[i * dim + d];
    softmax(p.data(), kpool);
    float acc = 0.0f;
    for (size_t i = 0; i < kpool; ++i) acc += p[i] * keys[i * dim + d];
    out[d] = acc;
  }
}

void select_pools(std::span<const float> scores, size_t budget, std::vector<uint32_t>& out) {
  out.resize(scores.size());
  std::iota(out.begin(), out.end(), 0u);
  if (scores.size() > budget) {
    std::nth_element(out.begin(), out.begin() + static_cast<ptrdiff_t>(budget), out.end(),
                     HigherValueFirst{scores.data()});
    out.resize(budget);
    std::sort(out.begin(), out.end());
  }
}

// The budget-th best score minus the next one (scores.size() > budget).
float cut_margin(std::vector<float> scores, size_t budget) {
  std::nth_element(scores.begin(), scores.begin() + static_cast<ptrdiff_t>(budget), scores.end(), std::greater<>());
  const float next = scores[budget];
  const float last = *std::min_element(scores.begin(), scores.begin() + static_cast<ptrdiff_t>(budget));
  return last - next;
}

void expand_selection(std::span<const uint32_t> pools, uint32_t pos, uint32_t kpool, bool select_tail,
                      std::vector<uint32_t>& tokens) {
  tokens.clear();
  for (uint32_t p : pools) {
    for (uint32_t i = 0; i < kpool; ++i) tokens.push_back(p * kpool + i);
  }
  if (select_tail) {
    const uint32_t tail = (pos + 1) % kpool;
    for (uint32_t t = pos + 1 - tail; t <= pos && tail > 0; ++t) tokens.push_back(t);
  }
}

void dsa_layer(const DsaConfig& c, const Glm5LayerWeights& w, const float* x, size_t tokens,
               std::span<const DsaSegment> segments, float* y, DsaSelections& selections, ThreadPool& pool,
               const SelectionObserver* observer) {
  const size_t nh = c.heads, qlr = c.q_lora_rank, r = c.kv_lora_rank, nope = c.nope_dim, vd = c.v_dim;
  const size_t ih = c.index_heads, id = c.index_dim, kp = c.kpool;

  std::vector<float> qr(tokens * qlr), q(tokens * nh * nope), lat(tokens * r);
  matmul(w.attn_q_a, x, tokens, qr.data(), pool);
  matmul(w.attn_kv_a, x, tokens, lat.data(), pool);
  pool.parallel_for(tokens, 1, [&](size_t t0, size_t t1) {
    for (size_t t = t0; t < t1; ++t) {
      rms_norm(qr.data() + t * qlr, w.q_a_norm.data(), qlr, c.rms_eps, qr.data() + t * qlr);
      rms_norm(lat.data() + t * r, w.kv_a_norm.data(), r, c.rms_eps, lat.data() + t * r);
    }
  });
  matmul(w.attn_q_b, qr.data(), tokens, q.data(), pool);

  std::vector<float> kq, kk, gate, hw;
  if (w.has_indexer) {
    kq.resize(tokens * ih * id), kk.resize(tokens * id), gate.resize(tokens * id), hw.resize(tokens * ih);
    matmul(w.idx_q_b, qr.data(), tokens, kq.data(), pool);
    matmul(w.idx_k, x, tokens, kk.data(), pool);
    matmul(w.idx_gate, x, tokens, gate.data(), pool);
    matmul(w.idx_proj, x, tokens, hw.data(), pool);
    const float hscale = 1.0f / std::sqrt(static_cast<float>(ih));
    for (size_t t = 0; t < tokens; ++t) {
      layer_norm(kk.data() + t * id, w.idx_k_norm.data(), w.idx_k_norm_bias.data(), id, c.index_norm_eps,
                 kk.data() + t * id);
      for (size_t h = 0; h < ih; ++h) hw[t * ih + h] *= hscale;
    }
  }

  // New tokens into the caches; keys of the pools they complete.
  for (const DsaSegment& seg : segments) {
    DsaCache& cache = *seg.cache;
    if (cache.tokens != seg.start) throw std::logic_error("DSA cache holds a different number of tokens than the step's start");
    cache.latent.append(lat.data() + seg.row0 * r, seg.rows, r);
    if (w.has_indexer) {
      cache.index_k.append(kk.data() + seg.row0 * id, seg.rows, id);
      cache.index_gate.append(gate.data() + seg.row0 * id, seg.rows, id);
    }
    cache.tokens += seg.rows;
    if (w.has_indexer) {
      const size_t complete = cache.tokens / kp;
      std::vector<float> keys(kp * id), gates(kp * id);
      for (size_t p = cache.pool_keys.size() / id; p < complete; ++p) {
        for (size_t i = 0; i < kp; ++i) {
          const size_t row = p * kp + i - cache.keys_from;
          const float* k = cache.index_k.row(row, keys.data() + i * id);
          if (k != keys.data() + i * id) std::copy_n(k, id, keys.data() + i * id);
          const float* g = cache.index_gate.row(row, gates.data() + i * id);
          if (g != gates.data() + i * id) std::copy_n(g, id, gates.data() + i * id);
        }
        cache.pool_keys.resize((p + 1) * id);
        pool_key(keys.data(), gates.data(), w.idx_ape.data(), kp, id, cache.pool_keys.data() + p * id);
      }
    }
  }

  // Row -> segment.
  std::vector<const DsaSegment*> seg_of(tokens, nullptr);
  for (const DsaSegment& seg : segments) {
    for (size_t i = 0; i < seg.rows; ++i) seg_of[seg.row0 + i] = &seg;
  }
  if (w.has_indexer) {
    selections.valid = true;
    selections.tokens.assign(tokens, {});
    selections.pools.assign(tokens, {});
    selections.margins.assign(tokens, std::numeric_limits<float>::infinity());
  } else if (!selections.valid || selections.tokens.size() != tokens) {
    throw std::runtime_error("DSA layer " + std::to_string(w.index) +
                             " shares the indexer of an earlier layer, but no earlier layer of this step selected tokens");
  }

  std::vector<float> o(tokens * nh * vd);
  const float iscale = 1.0f / std::sqrt(static_cast<float>(id));
  const float scale = 1.0f / std::sqrt(static_cast<float>(nope));
  pool.parallel_for(tokens, 1, [&](size_t t0, size_t t1) {
    std::vector<float> scores, qlat(r), avg(r), p, decoded;
    std::vector<const float*> rows;
    for (size_t t = t0; t < t1; ++t) {
      const DsaSegment& seg = *seg_of[t];
      const DsaCache& cache = *seg.cache;
      const uint32_t pos = seg.start + static_cast<uint32_t>(t - seg.row0);
      if (w.has_indexer) {
        const size_t visible = (size_t{pos} + 1) / kp;
        const size_t budget = c.index_topk / kp;
        scores.assign(visible, 0.0f);
        if (visible > budget) {
          for (size_t pl = 0; pl < visible; ++pl) {
            const float* key = cache.pool_keys.data() + pl * id;
            float s = 0.0f;
            for (size_t h = 0; h < ih; ++h) {
              const float d = dot(kq.data() + (t * ih + h) * id, key, id) * iscale;
              if (d > 0.0f) s += hw[t * ih + h] * d;
            }
            scores[pl] = s;
          }
        }
        select_pools(scores, budget, selections.pools[t]);
        if (observer != nullptr && visible > budget) selections.margins[t] = cut_margin(scores, budget);
        expand_selection(selections.pools[t], pos, static_cast<uint32_t>(kp), c.select_tail, selections.tokens[t]);
      }
      const std::vector<uint32_t>& sel = selections.tokens[t];

      float* ot = o.data() + t * nh * vd;
      if (sel.empty()) {  // only without select_tail, before the first pool completes: nothing to attend
        std::fill(ot, ot + nh * vd, 0.0f);
        continue;
      }
      p.resize(sel.size());
      // The selected rows once per query, decoded when not f32, for every head.
      rows.resize(sel.size());
      if (cache.latent.type() != config::KvType::f32) decoded.resize(sel.size() * r);
      for (size_t i = 0; i < sel.size(); ++i) rows[i] = cache.latent.row(sel[i], decoded.empty() ? nullptr : decoded.data() + i * r);
      for (size_t h = 0; h < nh; ++h) {
        matmul_serial(w.attn_k_b.slice_rows(h * r, r), q.data() + (t * nh + h) * nope, 1, qlat.data());
        for (size_t i = 0; i < sel.size(); ++i) p[i] = dot(qlat.data(), rows[i], r) * scale;
        softmax(p.data(), p.size());
        std::fill(avg.begin(), avg.end(), 0.0f);
        for (size_t i = 0; i < sel.size(); ++i) {
          const float* ls = rows[i];
          for (size_t j = 0; j < r; ++j) avg[j] += p[i] * ls[j];
        }
        matmul_serial(w.attn_v_b.slice_rows(h * vd, vd), avg.data(), 1, ot + h * vd);
      }
    }
  });
  if (observer != nullptr && *observer) {
    for (size_t t = 0; t < tokens; ++t) {
      const uint32_t pos = seg_of[t]->start + static_cast<uint32_t>(t - seg_of[t]->row0);
      (*observer)(w.index, t, pos, selections.pools[t], selections.margins[t]);
    }
  }
  matmul(w.attn_output, o.data(), tokens, y, pool);
}

}  // namespace ferry::model
