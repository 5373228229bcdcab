#include "model/cpu/kda.hpp"

#include <algorithm>
#include <cmath>

#include "model/glm5/glm5_weights.hpp"

namespace ferry::model {

void KdaState::reset(const KdaConfig& c) {
  const size_t di = size_t{c.heads} * c.head_dim;
  conv.assign((c.conv_kernel - 1) * 3 * di, 0.0f);
  s.assign(di * c.head_dim, 0.0f);
}

void kda_recurrent(size_t tokens, size_t dk, size_t dv, const float* q, const float* k, const float* v,
                   const float* g, const float* beta, float* s, float* o) {
  std::vector<float> mem(dv);
  for (size_t t = 0; t < tokens; ++t) {
    const float* qt = q + t * dk;
    const float* kt = k + t * dk;
    const float* gt = g + t * dk;
    std::fill(mem.begin(), mem.end(), 0.0f);
    for (size_t c = 0; c < dk; ++c) {
      float* row = s + c * dv;
      const float decay = std::exp(gt[c]);
      for (size_t j = 0; j < dv; ++j) {
        row[j] *= decay;
        mem[j] += row[j] * kt[c];
      }
    }
    for (size_t j = 0; j < dv; ++j) mem[j] = (v[t * dv + j] - mem[j]) * beta[t];  // delta
    float* ot = o + t * dv;
    std::fill(ot, ot + dv, 0.0f);
    for (size_t c = 0; c < dk; ++c) {
      float* row = s + c * dv;
      for (size_t j = 0; j < dv; ++j) {
        row[j] += kt[c] * mem[j];
        ot[j] += row[j] * qt[c];
      }
    }
  }
}

void kda_chunked(size_t tokens, size_t dk, size_t dv, const float* q, const float* k, const float* v, const float* g,
                 const float* beta, float* s, float* o, size_t chunk) {
  chunk = std::max<size_t>(chunk, 1);
  std::vector<double> cum(dk), ea(chunk * dk), qa(chunk * dk), ka(chunk * dk), kb(chunk * dk);
  std::vector<double> delta(chunk * dv), s0(dk * dv), acc(dv);
  for (size_t t0 = 0; t0 < tokens; t0 += chunk) {
    const size_t len = std::min(chunk, tokens - t0);
    std::fill(cum.begin(), cum.end(), 0.0);
    for (size_t t = 0; t < len; ++t) {
      const size_t r = t0 + t;
      for (size_t c = 0; c < dk; ++c) {
        cum[c] += g[r * dk + c];
        const double a = std::exp(cum[c]);
        ea[t * dk + c] = a;
        qa[t * dk + c] = a * q[r * dk + c];
        ka[t * dk + c] = a * k[r * dk + c];
        kb[t * dk + c] = k[r * dk + c] / a;  // e^{-G_s} k_s
      }
    }
    for (size_t i = 0; i < dk * dv; ++i) s0[i] = s[i];

    // deltas by forward substitution
    for (size_t t = 0; t < len; ++t) {
      const size_t r = t0 + t;
      const double bt = beta[r];
      std::fill(acc.begin(), acc.end(), 0.0);
      for (size_t c = 0; c < dk; ++c) {
        const double a = ka[t * dk + c];
        const double* srow = s0.data() + c * dv;
        for (size_t j = 0; j < dv; ++j) acc[j] += a * srow[j];
      }
      double* dt = delta.data() + t * dv;
      for (size_t j = 0; j < dv; ++j) dt[j] = bt * (v[r * dv + j] - acc[j]);
      for (size_t u = 0; u < t; ++u) {
        double n = 0.0;
        for (size_t c = 0; c < dk; ++c) n += ka[t * dk + c] * kb[u * dk + c];
        n *= bt;
        const double* du = delta.data() + u * dv;
        for (size_t j = 0; j < dv; ++j) dt[j] -= n * du[j];
      }
    }
    // outputs
    for (size_t t = 0; t < len; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (size_t c = 0; c < dk; ++c) {
        const double a = qa[t * dk + c];
        const double* srow = s0.data() + c * dv;
        for (size_t j = 0; j < dv; ++j) acc[j] += a * srow[j];
      }
      for (size_t u = 0; u <= t; ++u) {
        double m = 0.0;
        for (size_t c = 0; c < dk; ++c) m += qa[t * dk + c] * kb[u * dk + c];
        const double* du = delta.data() + u * dv;
        for (size_t j = 0; j < dv; ++j) acc[j] += m * du[j];
      }
      float* ot = o + (t0 + t) * dv;
      for (size_t j = 0; j < dv; ++j) ot[j] = static_cast<float>(acc[j]);
    }
    // state at the chunk's end
    const double* last = ea.data() + (len - 1) * dk;
    for (size_t c = 0; c < dk; ++c) {
      std::fill(acc.begin(), acc.end(), 0.0);
      const double* srow = s0.data() + c * dv;
      for (size_t j = 0; j < dv; ++j) acc[j] = srow[j];
      for (size_t u = 0; u < len; ++u) {
        const double w = kb[u * dk + c];
        const double* du = delta.data() + u * dv;
        for (size_t j = 0; j < dv; ++j) acc[j] += w * du[j];
      }
      float* out = s + c * dv;
      for (size_t j = 0; j < dv; ++j) out[j] = static_cast<float>(last[c] * acc[j]);
    }
  }
}

void kda_layer(const KdaConfig& c, const Glm5LayerWeights& w, const float* x, size_t tokens,
               std::span<const KdaSegment> segments, float* y, ThreadPool& pool) {
  const size_t hd = c.head_dim, nh = c.heads, di = nh * hd, kc = c.conv_kernel;
  const size_t width = 3 * di;
  std::vector<float> pre(tokens * width), qkv(tokens * width), fa(tokens * hd), f(tokens * di), ga(tokens * hd),
      gate(tokens * di), beta(tokens * nh);
  // Projections into one [tokens][q|k|v] buffer.
  {
    std::vector<float> part(tokens * di);
    const WeightMatrix* proj[3] = {&w.attn_q, &w.attn_k, &w.attn_v};
    for (size_t p = 0; p < 3; ++p) {
      matmul(*proj[p], x, tokens, part.data(), pool);
      for (size_t t = 0; t < tokens; ++t) std::copy_n(part.data() + t * di, di, pre.data() + t * width + p * di);
    }
  }
  matmul(w.ssm_f_a, x, tokens, fa.data(), pool);
  matmul(w.ssm_f_b, fa.data(), tokens, f.data(), pool);
  matmul(w.ssm_g_a, x, tokens, ga.data(), pool);
  matmul(w.ssm_g_b, ga.data(), tokens, gate.data(), pool);
  matmul(w.ssm_beta, x, tokens, beta.data(), pool);
  for (float& b : beta) b = sigmoid(b);

  // Causal conv + SiLU per segment (the state supplies the K-1 inputs before the segment's first row),
  // then the gate and the q/k norms. Parallel over channels.
  const float* taps[3] = {w.conv_q.data(), w.conv_k.data(), w.conv_v.data()};
  for (const KdaSegment& seg : segments) {
    float* state = seg.state->conv.data();
    pool.parallel_for(width, 64, [&](size_t c0, size_t c1) {
      for (size_t ch = c0; ch < c1; ++ch) {
        const float* tap = taps[ch / di] + (ch % di) * kc;
        for (size_t t = 0; t < seg.rows; ++t) {
          float acc = 0.0f;
          for (size_t j = 0; j < kc; ++j) {
            // input at time t - (kc-1) + j, relative to the segment
            const ptrdiff_t at = static_cast<ptrdiff_t>(t) - static_cast<ptrdiff_t>(kc - 1) + static_cast<ptrdiff_t>(j);
            const float in = at >= 0 ? pre[(seg.row0 + static_cast<size_t>(at)) * width + ch]
                                     : state[(static_cast<size_t>(at + static_cast<ptrdiff_t>(kc - 1))) * width + ch];
            acc += tap[j] * in;
          }
          qkv[(seg.row0 + t) * width + ch] = silu(acc);
        }
        // New state: the last kc-1 inputs of (old state ++ segment rows), shifted in place; entry i
        // reads index seg.rows + i >= i, which is not overwritten yet.
        for (size_t i = 0; i < kc - 1; ++i) {
          const size_t src = seg.rows + i;
          state[i * width + ch] = src < kc - 1 ? state[src * width + ch] : pre[(seg.row0 + src - (kc - 1)) * width + ch];
        }
      }
    });
  }
  const float qscale = 1.0f / std::sqrt(static_cast<float>(hd));
  pool.parallel_for(tokens, 1, [&](size_t t0, size_t t1) {
    for (size_t t = t0; t < t1; ++t) {
      float* row = qkv.data() + t * width;
      for (size_t h = 0; h < nh; ++h) {
        l2_norm(row + h * hd, hd, 1e-6f);
        for (size_t i = 0; i < hd; ++i) row[h * hd + i] *= qscale;
        l2_norm(row + di + h * hd, hd, 1e-6f);
      }
      float* ft = f.data() + t * di;
      for (size_t ch = 0; ch < di; ++ch) {
        ft[ch] = c.lower_bound * sigmoid(-w.ssm_a[ch / hd] * (ft[ch] + w.ssm_dt_bias[ch]));
      }
    }
  });

  // The delta rule per (segment, head).
  std::vector<float> o(tokens * di);
  const size_t jobs = segments.size() * nh;
  pool.parallel_for(jobs, 1, [&](size_t j0, size_t j1) {
    std::vector<float> q, k, v, g, b, out;
    for (size_t job = j0; job < j1; ++job) {
      const KdaSegment& seg = segments[job / nh];
      const size_t h = job % nh, n = seg.rows;
      q.resize(n * hd), k.resize(n * hd), v.resize(n * hd), g.resize(n * hd), b.resize(n), out.resize(n * hd);
      for (size_t t = 0; t < n; ++t) {
        const float* row = qkv.data() + (seg.row0 + t) * width;
        std::copy_n(row + h * hd, hd, q.data() + t * hd);
        std::copy_n(row + di + h * hd, hd, k.data() + t * hd);
        std::copy_n(row + 2 * di + h * hd, hd, v.data() + t * hd);
        std::copy_n(f.data() + (seg.row0 + t) * di + h * hd, hd, g.data() + t * hd);
        b[t] = beta[(seg.row0 + t) * nh + h];
      }
      float* s = seg.state->s.data() + h * hd * hd;
      if (n == 1) {
        kda_recurrent(n, hd, hd, q.data(), k.data(), v.data(), g.data(), b.data(), s, out.data());
      } else {
        kda_chunked(n, hd, hd, q.data(), k.data(), v.data(), g.data(), b.data(), s, out.data(), c.chunk);
      }
      for (size_t t = 0; t < n; ++t) std::copy_n(out.data() + t * hd, hd, o.data() + (seg.row0 + t) * di + h * hd);
    }
  });

  // Gated norm per head, then the output projection.
  pool.parallel_for(tokens, 1, [&](size_t t0, size_t t1) {
    for (size_t t = t0; t < t1; ++t) {
      for (size_t h = 0; h < nh; ++h) {
        float* oh = o.data() + t * di + h * hd;
        rms_norm(oh, w.ssm_norm.data(), hd, c.norm_eps, oh);
        const float* gh = gate.data() + t * di + h * hd;
        for (size_t i = 0; i < hd; ++i) oh[i] *= sigmoid(gh[i]);
      }
    }
  });
  matmul(w.attn_output, o.data(), tokens, y, pool);
}

}  // namespace ferry::model
