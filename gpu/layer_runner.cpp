#include "gpu/layer_runner.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gpu/cuda_check.hpp"
#include "gpu/decode_fusion.hpp"
#include "gpu/dsa_decode_fusion.hpp"
#include "gpu/kda_chunked.hpp"
#include "gpu/kda_fusion.hpp"
#include "gpu/mhc_decode.hpp"
#include "gpu/mhc_prefill.hpp"
#include "gpu/moe_decode.hpp"
#include "gpu/moe_route_decode.hpp"
#include "gpu/moe_grouped.hpp"
#include "gpu/mtp_ops.hpp"

namespace ferry::gpu {

using model::FfnKind;
using model::GgmlType;
using model::LayerKind;
using T = model::Glm5Tensor;

LayerRunner::LayerRunner(const model::Glm5Hparams& hp, const DeviceWeights& weights, StageState& state, Workspace& work,
                         StageExperts* experts, blas::Handle cublas, cudaStream_t stream)
    : hp_(hp), d_(hp), weights_(weights), state_(state), w_(work), experts_(experts), cublas_(cublas), s_(stream) {
  FERRY_CUDA(cudaMemsetAsync(router_done_.get(), 0, sizeof(uint32_t), s_));
  if (w_.x8 != nullptr) {
    e4m3_ = std::make_unique<blas::lt::Fp8Gemm>();
    if (!e4m3_->available()) {
      e4m3_.reset();
    } else {
      e4m3_scales_ = DeviceBuffer(size_t{kE4m3Chunks} * 4 * sizeof(uint32_t));
    }
  }
}

// The matvec kernels for up to 8 rows, else cuBLAS: fp32 SGEMM for f32 weights; for the rest,
// tensor-core fp16 GEMMs with fp32 accumulation over split operands, W_hi x_hi + (W_hi x_lo + W_lo x_hi)
// / 2^12, which keeps f32 accuracy (plain fp16 operands flip the top token of small models against the
// CPU reference). The two correction products are one GEMM of depth 2K, [W_hi | W_lo] [x_lo ; x_hi]:
// the staging holds each weight row as its hi then its lo values and each input row as lo then hi, so
// that the main product reads the first half of a weight row and the second of an input row
// (SplitGemm.CorrectionsAsOneProductOfTwiceTheDepth: the same accuracy, 3-16% less time than three GEMMs). On
// sm89+ the corrections of deep products are one e4m3 product instead (mm_staged).
void LayerRunner::mm(const DevMatrix& m, const float* x, size_t ldx, uint32_t n, float* y, size_t ldy) {
  mm_staged(m, x, ldx, n, y, ldy, nullptr);
}

void LayerRunner::mm_staged(const DevMatrix& m, const float* x, size_t ldx, uint32_t n, float* y, size_t ldy,
                            StagedInput* staged) {
  if (n == 0 || m.rows == 0) return;
  if (n <= kMaxMatvecTokens) {
    MatvecArgs a;
    a.w = m;
    a.x = x;
    a.x_tok_stride = ldx;
    a.y = y;
    a.y_tok_stride = ldy;
    a.tokens = n;
    matvec(a, s_);
    return;
  }
  const float one = 1.0f, zero = 0.0f;
  if (m.type == GgmlType::F32) {
    FERRY_CUBLAS(blas::api().sgemm(cublas_, blas::op_t, blas::op_n, static_cast<int>(m.rows), static_cast<int>(n),
                                   static_cast<int>(m.cols), &one, reinterpret_cast<const float*>(m.data),
                                   static_cast<int>(m.row_bytes / 4), x, static_cast<int>(ldx), &zero, y,
                                   static_cast<int>(ldy)));
    mark(OpPart::gemm);
    return;
  }
  const size_t K = m.cols;
  uint16_t* const xs = static_cast<uint16_t*>(w_.xh);  // [n][lo | hi] (xh and xl are one buffer)
  uint16_t* const ws = static_cast<uint16_t*>(w_.wh);  // [rows][hi | lo] (so are wh and wl)
  const StagedInput input{x, ldx, n, m.cols};
  if (staged == nullptr || !staged->same_input(input)) {
    float_to_half(x, ldx, n, K, xs + K, s_, xs, 2 * K);
    mark(OpPart::convert);
    if (staged != nullptr) *staged = input;
  }
  // The weights' row chunks: as few as the staging holds, equal, in whole 64-row groups (the e4m3 product's
  // outputs 16-byte aligned; cuBLAS ran dense down's chunk of 2,730 rows at ~60% of its rate at 2,720).
  const size_t fit = std::max<size_t>(1, w_.wh_elems / m.cols);
  const size_t parts = (m.rows + fit - 1) / fit;
  size_t chunk = (m.rows + parts - 1) / parts;
  if (fit >= 64) chunk = std::min((chunk + 63) / 64 * 64, fit / 64 * 64);
  const float lo = 1.0f / kHalfLoScale;
  // On sm89+ the corrections as one e4m3 product of depth 2K at twice the fp16 rate: each weight row staged as
  // its fp16 hi values then its e4m3 values and lo parts, the input's rows as e4m3 [lo | hi] in work.x8, each
  // operand scaled by a power of two (half_split.cuh). The corrections carry ~2^-11 of each term; e4m3's 3-bit
  // mantissas leave an error of ~2^-15 of it: at depth 4,096 1.3e-6 of the sum of |W x| terms against the fp16
  // form's 4.5e-7 and plain fp16's 2.9e-5 (SplitGemm.*); below kE4m3MinDepth the fp16 form keeps its f32-like
  // accuracy, where the products are short and the time to gain small.
  // Descale then amax, 16 bytes apart (cublasLt's scale pointers are 16-byte aligned): a weight chunk's scratch
  // pair, then the input's.
  uint32_t* const words = w_.e4m3_words;
  const int k2 = static_cast<int>(2 * K), ldc = static_cast<int>(ldy);
  auto e4m3_ready = [&](size_t rows) {
    return e4m3_ != nullptr && K >= kE4m3MinDepth && K % 8 == 0 && ldy % 4 == 0 && rows % 4 == 0 &&
           reinterpret_cast<uintptr_t>(y) % 16 == 0 &&
           e4m3_->ready(static_cast<int>(rows), static_cast<int>(n), k2, 2 * k2, k2, ldc, Workspace::kCublasWorkspace);
  };
  StagedInput own;
  StagedInput& in = staged != nullptr ? *staged : own;
  for (size_t r0 = 0; r0 < m.rows; r0 += chunk) {
    const size_t rows = std::min<size_t>(chunk, m.rows - r0);
    bool fp8 = e4m3_ready(rows);
    uint32_t* wsc = words;  // the chunk's descale and amax: kept per chunk while there is room
    if (fp8) {
      const auto key = std::make_pair(m.data + r0 * m.row_bytes, rows);
      auto it = e4m3_chunks_.find(key);
      const bool known = it != e4m3_chunks_.end();
      if (!known && e4m3_chunks_.size() < kE4m3Chunks) {
        it = e4m3_chunks_.emplace(key, static_cast<uint32_t>(e4m3_chunks_.size())).first;
      }
      if (it != e4m3_chunks_.end()) wsc = e4m3_scales_.as<uint32_t>() + 4 * it->second;
      fp8 = dequantize_to_e4m3_split(m, r0, rows, ws, 2 * K, wsc + 1, reinterpret_cast<float*>(wsc), known, s_);
      if (!fp8 && it != e4m3_chunks_.end() && !known) e4m3_chunks_.erase(it);
    }
    if (!fp8) dequantize_to_half(m, r0, rows, ws, s_, ws + K, 2 * K);
    if (fp8 && !in.e4m3) {
      half_split_to_e4m3(xs, 2 * K, n, K, w_.x8, words + 5, reinterpret_cast<float*>(words + 4), s_);
      in.e4m3 = true;
    }
    mark(OpPart::convert);
    auto gemm = [&](const void* b, size_t depth, const float* alpha, const float* beta) {
      FERRY_CUBLAS(blas::api().gemm_ex(cublas_, blas::op_t, blas::op_n, static_cast<int>(rows), static_cast<int>(n),
                                       static_cast<int>(depth), alpha, ws, CUDA_R_16F, static_cast<int>(2 * K), b,
                                       CUDA_R_16F, static_cast<int>(2 * K), beta, y + r0, CUDA_R_32F,
                                       static_cast<int>(ldy), blas::compute_32f, blas::gemm_default));
    };
    // The e4m3 corrections first (beta 0: cublasLt's FP8 kernels need not read C), then W_hi x_hi onto them:
    // y = main + corrections, one f32 addition as in the fp16 order.
    if (fp8 && !e4m3_->run(static_cast<int>(rows), static_cast<int>(n), k2, lo, reinterpret_cast<uint8_t*>(ws) + 2 * K,
                           2 * k2, reinterpret_cast<const float*>(wsc), w_.x8, k2,
                           reinterpret_cast<const float*>(words + 4), 0.0f, y + r0, ldc, w_.cublas_ws,
                           Workspace::kCublasWorkspace, s_)) {
      fp8 = false;
      dequantize_to_half(m, r0, rows, ws, s_, ws + K, 2 * K);
    }
    if (fp8) {
      gemm(xs + K, K, &one, &one);  // W_hi x_hi
    } else {
      gemm(xs + K, K, &one, &zero);  // W_hi x_hi
      gemm(xs, 2 * K, &lo, &one);    // W_hi x_lo + W_lo x_hi
    }
    mark(OpPart::gemm);
  }
}

// Per-group products: group g multiplies rows [g*rows_per_group, ...) of `m` with x + g*xg. Past the
// matvec rows, strided-batched GEMMs over as many groups as the fp16 staging holds, each weight row dequantised
// once, with mm()'s split operands and its depth-2K corrections: the staging holds each weight row as its hi
// then its lo values, and each (token, group) input as its lo then its hi values (float_to_half_groups), tokens
// in batches that fit it. The per-head products are short (depth 256 or 512), so the f32 outputs' passes weigh:
// two products write them twice, where three wrote them three times and read them twice.
void LayerRunner::mm_grouped(const DevMatrix& m, uint32_t groups, const float* x, size_t ldx, size_t xg, uint32_t n,
                             float* y, size_t ldy, size_t yg) {
  const uint32_t rpg = m.rows / groups;
  if (n <= kMaxMatvecTokens) {
    MatvecArgs a;
    a.w = m.slice_rows(0, rpg);
    a.w_group_bytes = m.row_bytes * rpg;
    a.x = x;
    a.x_tok_stride = ldx;
    a.x_group_stride = xg;
    a.y = y;
    a.y_tok_stride = ldy;
    a.y_group_stride = yg;
    a.tokens = n;
    a.groups = groups;
    matvec(a, s_);
    return;
  }
  if (rpg == 0) return;
  if (xg < m.cols || ldx < groups * xg) {
    throw CudaError("mm_grouped: " + std::to_string(groups) + " groups of " + std::to_string(m.cols) +
                    " inputs do not fit rows of " + std::to_string(ldx) + " floats " + std::to_string(xg) + " apart");
  }
  const float one = 1.0f, zero = 0.0f;
  const int M = static_cast<int>(rpg), N = static_cast<int>(n), K = static_cast<int>(m.cols);
  if (m.type == GgmlType::F32) {
    const long long lda = static_cast<long long>(m.row_bytes / 4);
    FERRY_CUBLAS(blas::api().sgemm_strided(cublas_, blas::op_t, blas::op_n, M, N, K, &one,
                                           reinterpret_cast<const float*>(m.data), static_cast<int>(lda), lda * rpg, x,
                                           static_cast<int>(ldx), static_cast<long long>(xg), &zero, y,
                                           static_cast<int>(ldy), static_cast<long long>(yg), static_cast<int>(groups)));
    mark(OpPart::gemm);
    return;
  }
  // Groups per batch: their weights in wh | wl; tokens per batch: their inputs in xh | xl.
  const size_t cols = m.cols;
  uint16_t* const xs = static_cast<uint16_t*>(w_.xh);  // [tokens][groups][lo | hi]
  uint16_t* const ws = static_cast<uint16_t*>(w_.wh);  // [groups * rpg][hi | lo]
  const size_t per_batch = std::min<size_t>({groups, w_.wh_elems / (size_t{rpg} * cols), w_.xh_elems / cols});
  if (per_batch == 0) throw CudaError("mm_grouped: one group of " + std::to_string(rpg) + " rows exceeds the fp16 staging");
  const float lo = 1.0f / kHalfLoScale;
  for (size_t g0 = 0; g0 < groups; g0 += per_batch) {
    const size_t gb = std::min<size_t>(per_batch, groups - g0);
    dequantize_to_half(m, g0 * rpg, gb * rpg, ws, s_, ws + cols, 2 * cols);
    mark(OpPart::convert);
    const size_t tokens = std::min<size_t>(n, w_.xh_elems / (gb * cols));
    for (size_t t0 = 0; t0 < n; t0 += tokens) {
      const size_t nb = std::min<size_t>(tokens, n - t0);
      float_to_half_groups(x + t0 * ldx + g0 * xg, ldx, xg, nb, static_cast<uint32_t>(gb), cols, xs + cols, s_, xs,
                           2 * cols);
      mark(OpPart::convert);
      auto gemm = [&](const void* b, int depth, const float* alpha, const float* beta) {
        FERRY_CUBLAS(blas::api().gemm_strided_ex(
            cublas_, blas::op_t, blas::op_n, M, static_cast<int>(nb), depth, alpha, ws, CUDA_R_16F, 2 * K,
            static_cast<long long>(rpg) * 2 * K, b, CUDA_R_16F, static_cast<int>(gb * 2 * cols),
            static_cast<long long>(2 * cols), beta, y + t0 * ldy + g0 * yg, CUDA_R_32F, static_cast<int>(ldy),
            static_cast<long long>(yg), static_cast<int>(gb), blas::compute_32f, blas::gemm_default));
      };
      gemm(xs + cols, K, &one, &zero);  // W_hi x_hi
      gemm(xs, 2 * K, &lo, &one);     // W_hi x_lo + W_lo x_hi
      mark(OpPart::gemm);
    }
  }
}

void LayerRunner::mm_products(const MatvecProduct* ps, uint32_t count, const float* x, size_t ldx, uint32_t n,
                              size_t ldy, StagedInput* staged) {
  if (matvec_products(ps, count, x, ldx, n, ldy, s_)) return;
  StagedInput own;
  for (uint32_t i = 0; i < count; ++i) {
    mm_staged(*ps[i].m, ps[i].x != nullptr ? ps[i].x : x, ldx, n, ps[i].y, ps[i].ldy != 0 ? ps[i].ldy : ldy,
              staged != nullptr ? staged : &own);
  }
}

void LayerRunner::mhc_site(const StepGeometry& g, const DevMatrix& fn, const float* base, const float* scale,
                           const float* norm_w, bool post_first) {
  MhcArgs a;
  a.streams = w_.R;
  a.mix = w_.mix;
  a.base = base;
  a.scale = scale;
  a.norm_w = norm_w;
  a.rows = g.rows;
  a.H = d_.H;
  a.D = d_.D;
  a.iters = hp_.hc_sinkhorn_iters;
  a.rms_eps = hp_.rms_eps;
  a.hc_eps = hp_.hc_eps;
  a.x = w_.x;
  a.post = w_.post;
  a.comb = w_.comb;
  MhcPostPre fused;
  fused.pre = a;
  fused.fn = &fn;
  fused.streams = w_.R;
  fused.y = post_first ? w_.y : nullptr;
  fused.combine = post_first && combine_pending_ ? &combine_ : nullptr;
  fused.post_in = w_.post;
  fused.comb_in = w_.comb;
  // Decode rows on the cluster kernel of gpu/mhc_decode.hpp (a cluster a row; comb made on a branch, off the
  // chain), more on gpu/mhc_prefill.hpp's (a cluster 16 rows: the mixer read once per 16 rows, not once a row).
  const bool decode_rows = g.rows <= kMaxMatvecTokens;
  if (branches_ && decode_rows) fused.branch = &comb_branch_;
  const bool one_launch =
      decode_rows ? mhc_post_pre(fused, s_) : mhc_site_prefill(fused, s_) || mhc_post_pre(fused, s_);
  if (one_launch) {
    // One launch did all: its time counts as the pre's; the post is still marked (with no time of its own).
    if (fused.combine != nullptr) combine_pending_ = false;
    mark(OpGroup::mhc_pre);
    if (post_first) mark(OpGroup::mhc_post);
    return;
  }
  comb_branch_.join(s_);  // the post reads comb, and the pre writes it
  finish_combine(g.rows);
  if (post_first) {
    mhc_post(w_.R, w_.y, w_.post, w_.comb, g.rows, d_.H, d_.D, s_);
    mark(OpGroup::mhc_post);
  }
  mm(fn, w_.R, static_cast<size_t>(d_.H) * d_.D, g.rows, w_.mix, d_.mix);
  mhc_pre(a, s_);
  mark(OpGroup::mhc_pre);
}

void LayerRunner::kda_layer(const StepGeometry& g, const DevLayer& l, LayerState& st) {
  const ModelDims& z = d_;
  const uint32_t n = g.rows;
  const MatvecProduct qkv[] = {
      {&l.m(T::attn_q), w_.qkv_raw}, {&l.m(T::attn_k), w_.qkv_raw + z.C}, {&l.m(T::attn_v), w_.qkv_raw + 2 * z.C}};
  // The gate's low-rank input (g_a) and beta with f_a's: all read x; then both low-rank expansions (f_b
  // of f_a's output, g_b of g_a's) before the recurrence.
  const MatvecProduct fa_ga_beta[] = {
      {&l.m(T::ssm_f_a), w_.fa}, {&l.m(T::ssm_g_a), w_.ga}, {&l.m(T::ssm_beta), w_.beta, nullptr, z.kda_nh}};
  const MatvecProduct fb_gb[] = {{&l.m(T::ssm_f_b), w_.f, w_.fa}, {&l.m(T::ssm_g_b), w_.gate, w_.ga}};
  // A decode step's gate products (they read only x) on a branch forked before q/k/v, so that the chain
  // goes from q/k/v straight to the convolution (gpu/stream_branch.hpp); they still run mostly in q/k/v's
  // last blocks, which hold the SMs until then. Eager op times keep them in line.
  const bool beside = branches_ && n <= kMaxMatvecTokens && times_ == nullptr;
  if (beside) {
    const cudaStream_t side = gate_branch_.fork(s_);
    products_on(side, fa_ga_beta, 3, w_.x, z.D, n, z.kda_hd);
    products_on(side, fb_gb, 2, nullptr, z.kda_hd, n, z.C);
  }
  StagedInput x_split;  // both groups of products of x take its one fp16 split (kda_conv leaves the staging)
  mm_products(qkv, 3, w_.x, z.D, n, 3 * z.C, &x_split);
  mark(OpGroup::kda_proj);
  KdaArgs a;
  a.row = g.row;
  a.seg = g.seg;
  a.rows = n;
  a.segments = g.segments;
  a.heads = z.kda_nh;
  a.head_dim = z.kda_hd;
  a.kernel = z.K;
  a.qkv = w_.qkv;
  a.qkv_raw = w_.qkv_raw;
  a.conv_w = l.conv;
  a.conv_state = st.conv;
  // Decode rows on sm90: the convolution inside the recurrence's launch (gpu/kda_fusion.hpp).
  const bool fuse_conv = n <= kMaxMatvecTokens && times_ == nullptr && kda_conv_fuses(a);
  if (!fuse_conv) kda_conv(a, s_);
  mark(OpGroup::kda_conv);
  if (!beside) {
    mm_products(fa_ga_beta, 3, w_.x, z.D, n, z.kda_hd, &x_split);
    mm_products(fb_gb, 2, nullptr, z.kda_hd, n, z.C);
  }
  mark(OpGroup::kda_proj);
  gate_branch_.join(s_);
  a.f = w_.f;
  a.dt_bias = l.v(T::ssm_dt_bias);
  a.a = l.v(T::ssm_a);
  a.lower_bound = hp_.kda_lower_bound;
  a.beta = w_.beta;
  a.state = st.recurrent;
  a.out = w_.o;
  const GatedNorm norm{w_.gate, l.v(T::ssm_norm), hp_.rms_eps, w_.z};
  // Long prefill segments in the chunked form on tensor cores (gpu/kda_chunked.hpp), the rest below.
  a.skip_chunked = kda_chunked(a, g.max_seg_rows, s_);
  // Past the matvec rows the output projection's fp16 split comes from the norm itself, for weights the
  // split products take (f32 ones take z on SGEMM).
  const DevMatrix& out = l.m(T::attn_output);
  const bool z_split = n > kMaxMatvecTokens && out.type != GgmlType::F32 && z.kda_hd <= 128;
  StagedInput z_staged;
  // One launch for decode rows on sm90 (gpu/kda_fusion.hpp).
  if (fuse_conv) {
    if (!kda_conv_recurrent_gated_norm(a, norm, s_)) throw CudaError("kda_layer: the fused convolution did not launch");
  } else if (!kda_recurrent_gated_norm(a, norm, s_)) {
    kda_recurrent(a, s_);
    if (z_split) {
      gated_rms_norm_split(w_.o, norm.gate, norm.w, n, z.kda_nh, z.kda_hd, norm.eps, w_.xh, s_);
      z_staged = StagedInput{w_.z, z.C, n, out.cols};
    } else {
      gated_rms_norm(w_.o, norm.gate, norm.w, n, z.kda_nh, z.kda_hd, norm.eps, norm.out, s_);
    }
  }
  mark(OpGroup::kda_recurrence);
  mm_staged(out, w_.z, z.C, n, w_.y, z.D, &z_staged);
  mark(OpGroup::kda_out);
}

void LayerRunner::dsa_layer(const StepGeometry& g, const DevLayer& l, LayerState& st) {
  const ModelDims& z = d_;
  const uint32_t n = g.rows;
  // Everything that reads x, in two launches: q_a, kv_a and the indexer's weights; its k and gate.
  const MatvecProduct from_x[] = {{&l.m(T::attn_q_a), w_.qa},
                                  {&l.m(T::attn_kv_a_mqa), w_.lat, nullptr, z.kvlr},
                                  {&l.m(T::indexer_proj), w_.iw, nullptr, z.ih}};
  // A decode step's indexer beside the chain of the norms, q_b and k_b, which meets it at the sparse
  // attention (gpu/stream_branch.hpp): its keys (from x) forked here, and its weights (f32 in the
  // published files: a launch of their own) on a second branch, so that neither waits for the other;
  // its query on the chain after the norms make qr, and the selection forked after it. Eager steps
  // that time ops or trace selections keep it in line.
  const bool beside = branches_ && l.has_indexer && n <= kMaxMatvecTokens && times_ == nullptr && trace_ == nullptr;
  mm_products(from_x, l.has_indexer && !beside ? 3 : 2, w_.x, z.D, n, z.qlr);
  // Both norms and the new latents' cache write in one launch (gpu/dsa_decode_fusion.hpp). A windowed
  // step (gpu/kv_window.hpp) keeps its new rows in the host tier; otherwise they go to the slot's rows
  // on the device at their positions.
  KvWindow* window = state_.window() != nullptr && state_.window()->windowed_step() ? state_.window() : nullptr;
  DsaNormsArgs na;
  na.rows = n;
  na.eps = hp_.rms_eps;
  na.qa = w_.qa, na.qa_stride = z.qlr, na.qa_w = l.v(T::attn_q_a_norm), na.qlr = z.qlr;
  na.qr = w_.qr, na.qr_stride = z.qlr;
  na.lat = w_.lat, na.lat_stride = z.kvlr, na.lat_w = l.v(T::attn_kv_a_norm), na.kvlr = z.kvlr;
  if (window == nullptr) {
    na.row = g.row;
    na.ctx = state_.latent_rows();
    na.type = state_.latent_type();
    na.cache = st.latents;
    na.scales = st.latent_scales;
  }
  const IndexerArgs ia = l.has_indexer ? indexer_args(g, l, st) : IndexerArgs{};
  if (beside) {
    indexer_keys(ia, l, st, dsa_branch_.fork(s_));
    product_on(dsa_weights_branch_.fork(s_), *from_x[2].m, w_.x, z.D, n, w_.iw, z.ih, nullptr);
  }
  dsa_norms(na, s_);
  if (window != nullptr) window->store(l.index, w_.lat, z.kvlr, g.row, n, s_);
  StagedInput qr_split;  // q_b and the indexer's q_b read the same qr
  if (beside) {
    // The indexer's query first (a small product), so that the selection starts before the chain's q_b
    // (on a branch it waited for the keys' side stream, then for room beside q_b); the keys' stream, which
    // the selection follows, waits for it and for the weights.
    product_on(s_, l.m(T::indexer_attn_q_b), w_.qr, z.qlr, n, w_.kq, static_cast<size_t>(z.ih) * z.id, nullptr);
    const cudaStream_t side = dsa_branch_.fork(s_);
    dsa_weights_branch_.join(side);
    indexer_select(ia, side);
  }
  mm_staged(l.m(T::attn_q_b), w_.qr, z.qlr, n, w_.q, static_cast<size_t>(z.nh) * z.nope, &qr_split);
  mark(OpGroup::dsa_proj);
  if (l.has_indexer && !beside) {
    // In line, the indexer's q_b takes q_b's split of qr before the key products split x.
    mm_staged(l.m(T::indexer_attn_q_b), w_.qr, z.qlr, n, w_.kq, static_cast<size_t>(z.ih) * z.id, &qr_split);
    indexer_keys(ia, l, st, s_);
    mark(OpGroup::indexer_proj);
    indexer_select(ia, s_);
    mark(OpGroup::indexer_select);
    if (trace_ != nullptr) trace_->add_selection(l.index, ia.tokens, ia.counts, n, ia.max_tokens, s_);
  }
  mm_grouped(l.m(T::attn_k_b), z.nh, w_.q, static_cast<size_t>(z.nh) * z.nope, z.nope, n, w_.q_lat,
             static_cast<size_t>(z.nh) * z.kvlr, z.kvlr);
  mark(OpGroup::dsa_proj);
  dsa_branch_.join(s_);
  SparseMlaArgs ma;
  ma.row = g.row;
  ma.rows = n;
  ma.heads = z.nh;
  ma.rank = z.kvlr;
  ma.ctx = state_.latent_rows();
  ma.max_tokens = w_.max_selected;
  ma.scale = 1.0f / std::sqrt(static_cast<float>(z.nope));
  ma.q_lat = w_.q_lat;
  ma.latents = st.latents;
  ma.latent_scales = st.latent_scales;
  ma.latent_type = state_.latent_type();
  ma.tokens = w_.sel_tokens;
  ma.counts = w_.sel_counts;
  ma.out = w_.o_lat;
  ma.partial = w_.mla_part;
  ma.partial_rows = kMlaPartialRows;
  if (window != nullptr) {
    window->attend(l.index, st, ma, s_);
  } else {
    sparse_mla(ma, s_);
  }
  mark(OpGroup::sparse_mla);
  mm_grouped(l.m(T::attn_v_b), z.nh, w_.o_lat, static_cast<size_t>(z.nh) * z.kvlr, z.kvlr, n, w_.v,
             static_cast<size_t>(z.nh) * z.vd, z.vd);
  mm(l.m(T::attn_output), w_.v, static_cast<size_t>(z.nh) * z.vd, n, w_.y, z.D);
  mark(OpGroup::dsa_out);
}

IndexerArgs LayerRunner::indexer_args(const StepGeometry& g, const DevLayer& l, LayerState& st) const {
  const ModelDims& z = d_;
  IndexerArgs ia;
  ia.row = g.row;
  ia.seg = g.seg;
  ia.rows = g.rows;
  ia.segments = g.segments;
  ia.max_rows_per_segment = g.max_seg_rows;
  ia.heads = z.ih;
  ia.head_dim = z.id;
  ia.kpool = hp_.index_kpool;
  ia.topk = hp_.index_topk;
  ia.ctx = state_.context();
  ia.key_rows = state_.key_rows();
  ia.select_tail = hp_.index_select_tail;
  ia.kk_cache = st.keys;
  ia.gate_cache = st.gates;
  ia.ape = l.v(T::indexer_compressor_ape);
  ia.pool_cache = st.pools;
  ia.q = w_.kq;
  ia.w = w_.iw;
  ia.scores = w_.scores;  // scratch: read by the selection only
  ia.skip_whole_selections = g.rows <= kMaxMatvecTokens;
  ia.tokens = w_.sel_tokens;
  ia.counts = w_.sel_counts;
  ia.max_tokens = w_.max_selected;
  // The sparse attention's split scratch is free until it runs, after the selection.
  ia.select_scratch = w_.mla_part;
  ia.select_scratch_bytes = w_.mla_part_elems * sizeof(float);
  return ia;
}

void LayerRunner::indexer_keys(const IndexerArgs& ia, const DevLayer& l, LayerState& st, cudaStream_t stream) {
  const ModelDims& z = d_;
  const MatvecProduct k_gate[] = {{&l.m(T::indexer_attn_k), w_.kk}, {&l.m(T::indexer_compressor_gate), w_.gs}};
  if (stream == s_) {
    mm_products(k_gate, 2, w_.x, z.D, ia.rows, z.id);
  } else {
    products_on(stream, k_gate, 2, w_.x, z.D, ia.rows, z.id);
  }
  IndexerKeysArgs ka;
  ka.rows = ia.rows, ka.width = z.id, ka.eps = hp_.index_norm_eps;
  ka.kk = w_.kk, ka.kk_stride = z.id, ka.w = l.v(T::indexer_k_norm), ka.b = l.v(T::indexer_k_norm_bias);
  ka.gs = w_.gs, ka.gs_stride = z.id;
  ka.row = ia.row, ka.key_rows = state_.key_rows(), ka.keys = st.keys, ka.gates = st.gates;
  // The step's keys into the rings and the pools they complete (one launch for decode rows).
  indexer_keys_and_pools(ka, ia, stream);
}

void LayerRunner::product_on(cudaStream_t stream, const DevMatrix& m, const float* x, size_t ldx, uint32_t n, float* y,
                             size_t ldy, StagedInput* staged) {
  if (stream == s_) {
    mm_staged(m, x, ldx, n, y, ldy, staged);
    return;
  }
  const MatvecProduct p[] = {{&m, y}};
  if (!matvec_products(p, 1, x, ldx, n, ldy, stream)) throw CudaError("a product on a branch needs decode rows");
}

void LayerRunner::products_on(cudaStream_t stream, const MatvecProduct* ps, uint32_t count, const float* x, size_t ldx,
                              uint32_t n, size_t ldy) {
  if (matvec_products(ps, count, x, ldx, n, ldy, stream)) return;
  for (uint32_t i = 0; i < count; ++i) {
    product_on(stream, *ps[i].m, ps[i].x != nullptr ? ps[i].x : x, ldx, n, ps[i].y, ps[i].ldy != 0 ? ps[i].ldy : ldy,
               nullptr);
  }
}

void LayerRunner::dense_ffn(const DevMatrix& gate, const DevMatrix& up, const DevMatrix& down, uint32_t n, float* y) {
  const uint32_t F = gate.rows;
  const MatvecProduct gate_up[] = {{&gate, w_.eg}, {&up, w_.eu}};
  mm_products(gate_up, 2, w_.x, d_.D, n, F);
  if (n <= kMaxMatvecTokens) {
    MatvecArgs a;
    a.w = down;
    a.x_tok_stride = F;
    a.y = y;
    a.y_tok_stride = d_.D;
    a.tokens = n;
    matvec_swiglu(a, w_.eg, w_.eu, F, n, F, hp_.swiglu_limit, s_);
    return;
  }
  // The down projection's fp16 split straight from the SwiGLU, for weights the split products take.
  StagedInput h_staged;
  if (down.type != GgmlType::F32 && swiglu_split(w_.eg, w_.eu, n, F, hp_.swiglu_limit, w_.xh, s_)) {
    h_staged = StagedInput{w_.eg, F, n, down.cols};
  } else {
    swiglu(w_.eg, w_.eu, F, n, F, hp_.swiglu_limit, s_);
  }
  mm_staged(down, w_.eg, F, n, y, d_.D, &h_staged);
}

void LayerRunner::finish_combine(uint32_t rows) {
  if (!combine_pending_) return;
  combine_pending_ = false;
  moe_combine(combine_.eo, nullptr, combine_.weights, combine_.shared, rows, combine_.k, d_.D, w_.y, s_);
}

void LayerRunner::moe_layer(const StepGeometry& g, const DevLayer& l, bool upload_misses, bool defer_combine) {
  const ModelDims& z = d_;
  const uint32_t n = g.rows;
  RouterArgs ra;
  ra.logits = w_.rlogits;
  ra.bias = l.v(T::ffn_exp_probs_b);
  ra.rows = n;
  ra.E = z.E;
  ra.k = z.k;
  ra.n_group = hp_.n_group;
  ra.topk_group = hp_.topk_group;
  ra.norm_topk_prob = hp_.norm_topk_prob;
  ra.scaling = hp_.routed_scaling;
  ra.ids = w_.rids;
  ra.weights = w_.rweights;
  // A one-row step: the product and the route in one launch where it applies (gpu/moe_route_decode.hpp).
  if (!moe_route_decode(l.m(T::ffn_gate_inp), w_.x, w_.rlogits, ra, router_done_.as<uint32_t>(), s_)) {
    mm(l.m(T::ffn_gate_inp), w_.x, z.D, n, w_.rlogits, z.E);
    moe_route(ra, s_);
  }
  mark(OpGroup::moe_router);
  if (trace_ != nullptr) trace_->add_routes(l.index, ra.ids, n, ra.k, s_);
  const bool shared = !l.m(T::ffn_gate_shexp).empty();
  if (n <= kMaxMatvecTokens) {
    decode_experts(n, l, shared);
    combine_ = {w_.eo, w_.rweights, shared ? w_.sh : nullptr, z.k};
    combine_pending_ = true;
    if (!defer_combine) finish_combine(n);
  } else {
    if (shared) shared_expert(l, n);
    prefill_experts(n, l, upload_misses);
    moe_combine(w_.eo, w_.where, w_.rweights, shared ? w_.sh : nullptr, n, z.k, z.D, w_.y, s_);
  }
  mark(OpGroup::moe_experts);
}

void LayerRunner::shared_expert(const DevLayer& l, uint32_t n) {
  dense_ffn(l.m(T::ffn_gate_shexp), l.m(T::ffn_up_shexp), l.m(T::ffn_down_shexp), n, w_.sh);
  mark(OpGroup::moe_shared);
}

// The step's routed experts (gpu/moe_decode.hpp): an expert that several rows chose read once for
// them where the int16 kernel takes them, every other route on its own; the shared expert (`shared`)
// in the routed experts' launches where it can be (one row), else before them.
void LayerRunner::decode_experts(uint32_t n, const DevLayer& l, bool shared) {
  const ModelDims& z = d_;
  DecodeExperts a;
  if (experts_ != nullptr) {
    // Experts in the pool or in host memory, through the layer's tables.
    const ExpertShape& shape = experts_->shape(l.index);
    a.gate = shape.gate, a.up = shape.up, a.down = shape.down;
    for (int p = 0; p < 3; ++p) a.tables[p] = experts_->table(l.index, p);
    count_routes(w_.rids, n * z.k, experts_->route_counts(l.index), s_);
  } else {
    a.gate = l.m(T::ffn_gate_exps).slice_rows(0, z.I);
    a.up = l.m(T::ffn_up_exps).slice_rows(0, z.I);
    a.down = l.m(T::ffn_down_exps).slice_rows(0, z.D);
  }
  a.ids = w_.rids;
  a.x = w_.x;
  a.rows = n;
  a.k = z.k;
  a.swiglu_limit = hp_.swiglu_limit;
  a.eg = w_.eg;
  a.eu = w_.eu;
  a.eo = w_.eo;
  if (shared) {
    // The shared expert's gate and up products after the routes' in eg and eu.
    a.shared_gate = l.m(T::ffn_gate_shexp), a.shared_up = l.m(T::ffn_up_shexp), a.shared_down = l.m(T::ffn_down_shexp);
    const size_t routed = size_t{n} * z.k * z.I;
    if (routed + size_t{n} * a.shared_gate.rows <= w_.ffn_elems) {
      a.sg = w_.eg + routed, a.su = w_.eu + routed, a.sh = w_.sh;
    }
    if (!shared_expert_fused(a)) {
      a.shared_gate = {};
      shared_expert(l, n);
    }
  }
  const uint32_t tokens = shared_expert_tokens(a);
  if (tokens == 0) {
    decode_experts_per_route(a, s_);
  } else {
    decode_experts_shared(a, tokens, w_.shared_routes, s_);
  }
}

// The chunk's routes grouped by expert on the device, then one grouped GEMM for gate and up (SwiGLU
// fused) and one for down over every expert (gpu/moe_grouped.hpp); moe_combine adds them back.
void LayerRunner::prefill_experts(uint32_t n, const DevLayer& l, bool upload_misses) {
  const ModelDims& z = d_;
  const uint32_t routes = n * z.k;
  const RouteSort sort{w_.expert_offsets, w_.expert_tiles, w_.gather_idx, w_.where};
  ExpertMatrices gate, up, down;
  RouteTally tally;
  if (experts_ == nullptr) {
    const DevMatrix g = l.m(T::ffn_gate_exps), u = l.m(T::ffn_up_exps), d = l.m(T::ffn_down_exps);
    gate = {g.slice_rows(0, z.I), g.row_bytes * z.I, nullptr};
    up = {u.slice_rows(0, z.I), u.row_bytes * z.I, nullptr};
    down = {d.slice_rows(0, z.D), d.row_bytes * z.D, nullptr};
  } else {
    // Experts in the pool, the staging buffer or host memory (read over the bus by the kernels).
    if (upload_misses) experts_->wait_staged(l.index);
    const ExpertShape& shape = experts_->shape(l.index);
    const StageExperts::PrefillView v = experts_->prefill_view(l.index, upload_misses);
    gate = {shape.gate, 0, v.table[0]};
    up = {shape.up, 0, v.table[1]};
    down = {shape.down, 0, v.table[2]};
    tally = v.tally;
  }
  sort_routes(w_.rids, routes, z.k, z.E, sort, tally, s_);
  // The inputs' fp16 splits: x into the cuBLAS staging (idle here), the SwiGLU output into eu (free
  // once gate and up are done: it held up's product only when they differ).
  const SplitScratch x_split{w_.xh, w_.xl, w_.xh_elems};
  const SplitScratch h_split{w_.eu, reinterpret_cast<uint16_t*>(w_.eu) + w_.ffn_elems, w_.ffn_elems};
  grouped_gemm(gate, &up, w_.x, z.D, n, w_.gather_idx, sort, routes, z.E, hp_.swiglu_limit, w_.eg, z.I, w_.eu,
               x_split, s_);
  grouped_gemm(down, nullptr, w_.eg, z.I, routes, nullptr, sort, routes, z.E, 0.0f, w_.eo, z.D, nullptr, h_split,
               s_);
  if (experts_ != nullptr && upload_misses) experts_->release_staged(l.index);
}

void LayerRunner::plain_block(const StepGeometry& g, uint32_t il, float* h) {
  const DevLayer& l = weights_.layer(il);
  const size_t n = size_t{g.rows} * d_.D;
  rms_norm(h, d_.D, l.v(T::attn_norm), g.rows, d_.D, hp_.rms_eps, w_.x, d_.D, s_);
  dsa_layer(g, l, state_.layer(il));
  add_in_place(h, w_.y, n, s_);
  rms_norm(h, d_.D, l.v(T::ffn_norm), g.rows, d_.D, hp_.rms_eps, w_.x, d_.D, s_);
  if (l.ffn == FfnKind::dense) {
    dense_ffn(l.m(T::ffn_gate), l.m(T::ffn_up), l.m(T::ffn_down), g.rows, w_.y);
  } else {
    moe_layer(g, l, false);
  }
  add_in_place(h, w_.y, n, s_);
}

void LayerRunner::forward(model::LayerRange layers, const StepGeometry& g, const int32_t* tokens) {
  if (tokens != nullptr) {
    embed_rows(weights_.token_embd, tokens, g.rows, w_.R, d_.H, s_);
    mark(OpGroup::embed);
  }
  // A prefill chunk that uploads its missing experts stages each MoE layer's two ahead of use, so that
  // the copies run beside the layers before it.
  std::vector<uint32_t> moe;
  for (uint32_t il = layers.first; il < layers.end; ++il) {
    if (weights_.layer(il).ffn == FfnKind::moe) moe.push_back(il);
  }
  const bool upload = experts_ != nullptr && g.rows > kMaxMatvecTokens && experts_->uploads_for(g.rows);
  size_t staged = 0;
  if (upload) {
    for (; staged < std::min<size_t>(2, moe.size()); ++staged) experts_->stage_layer(moe[staged]);
  }
  // Each sublayer's mhc_post runs with the next site (one launch where gpu/mhc_decode applies, with a
  // decode step's MoE combine); the last one after the loop.
  bool post_pending = false;
  combine_pending_ = false;
  comb_branch_.abandon();
  gate_branch_.abandon();
  dsa_branch_.abandon();
  dsa_weights_branch_.abandon();
  for (uint32_t il = layers.first; il < layers.end; ++il) {
    const DevLayer& l = weights_.layer(il);
    mhc_site(g, l.m(T::hc_attn_fn), l.v(T::hc_attn_base), l.v(T::hc_attn_scale), l.v(T::attn_norm), post_pending);
    if (l.kind == LayerKind::kda) {
      kda_layer(g, l, state_.layer(il));
    } else {
      dsa_layer(g, l, state_.layer(il));
    }
    mhc_site(g, l.m(T::hc_ffn_fn), l.v(T::hc_ffn_base), l.v(T::hc_ffn_scale), l.v(T::ffn_norm), true);
    if (l.ffn == FfnKind::dense) {
      dense_ffn(l.m(T::ffn_gate), l.m(T::ffn_up), l.m(T::ffn_down), g.rows, w_.y);
      mark(OpGroup::dense_ffn);
    } else {
      moe_layer(g, l, upload, true);
      if (upload && staged < moe.size()) experts_->stage_layer(moe[staged++]);
    }
    post_pending = true;
  }
  comb_branch_.join(s_);  // the last post reads comb; a capture ends with the branch joined
  if (post_pending && combine_pending_) {
    combine_pending_ = false;
    mhc_post_combine(w_.R, combine_, w_.post, w_.comb, g.rows, d_.H, d_.D, s_);
    mark(OpGroup::mhc_post);
  } else if (post_pending) {
    mhc_post(w_.R, w_.y, w_.post, w_.comb, g.rows, d_.H, d_.D, s_);
    mark(OpGroup::mhc_post);
  }
}

}  // namespace ferry::gpu
