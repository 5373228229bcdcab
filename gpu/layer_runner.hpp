#pragma once
// The layer kernels' orchestration on one stage: what runs in which order for a step's rows through
// layers [first, end) — the mHC sites, KDA and DSA attention, dense and MoE FFNs — over the stage's
// weights, slot state and workspace, on its compute stream. The math is in the kernels (gpu/*.cu).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <utility>

#include "gpu/cuda_blas.hpp"
#include "gpu/cuda_blas_lt.hpp"
#include "gpu/decode_fusion.hpp"
#include "gpu/device_weights.hpp"
#include "gpu/mhc_decode.hpp"
#include "gpu/op_times.hpp"
#include "gpu/stage_experts.hpp"
#include "gpu/stage_state.hpp"
#include "gpu/step_input.hpp"
#include "gpu/step_trace.hpp"
#include "gpu/stream_branch.hpp"
#include "gpu/workspace.hpp"

namespace ferry::gpu {

class LayerRunner {
 public:
  // `experts`: the stage's expert pool and tables, or null when its routed experts are all resident.
  LayerRunner(const model::Glm5Hparams& hp, const DeviceWeights& weights, StageState& state, Workspace& work,
              StageExperts* experts, blas::Handle cublas, cudaStream_t stream);

  // Rows through layers [first, end) in place in the workspace's streams (work.R); a first stage
  // embeds `tokens` (device) into them first.
  void forward(model::LayerRange layers, const StepGeometry& g, const int32_t* tokens);
  // y[t][ldy] = W x[t] for t < n: the matvec kernels for up to 8 rows, else cuBLAS GEMMs.
  void mm(const DevMatrix& m, const float* x, size_t ldx, uint32_t n, float* y, size_t ldy);
  // The MTP block's layer `il` (a DSA layer with its FFN) over the residual rows h [rows][D] in place:
  // a plain pre-norm residual block, without mHC mixers (gpu/mtp_block.hpp).
  void plain_block(const StepGeometry& g, uint32_t il, float* h);
  // Marks the end of each op group on `t` from now on (eager steps only: gpu/op_times.hpp); null: none.
  void set_op_times(OpTimes* t) { times_ = t; }
  // Appends each DSA selection and MoE route made from now on to `t` (eager steps only); null: none.
  void set_trace(StepTrace* t) { trace_ = t; }
  // Whether decode steps fork their side work onto branches (CudaStageOptions::decode_branches).
  void set_decode_branches(bool on) { branches_ = on; }

 private:
  // An input that mm_staged split into the fp16 staging (work.xh / xl), so that later products of the
  // same input skip the conversion. Held by a caller only while nothing else writes the staging or the
  // input (nothing but such products runs between its uses).
  struct StagedInput {
    const float* x = nullptr;
    size_t ldx = 0;
    uint32_t n = 0, cols = 0;
    bool e4m3 = false;  // its e4m3 form is in work.x8 too
    bool same_input(const StagedInput& o) const { return x == o.x && ldx == o.ldx && n == o.n && cols == o.cols; }
  };
  // mm(), past the matvec rows reusing the split that `staged` names (and naming the one it makes there).
  void mm_staged(const DevMatrix& m, const float* x, size_t ldx, uint32_t n, float* y, size_t ldy,
                 StagedInput* staged);
  void mm_grouped(const DevMatrix& m, uint32_t groups, const float* x, size_t ldx, size_t xg, uint32_t n, float* y,
                  size_t ldy, size_t yg);
  // Products of matrices over the same x: one decode launch where their shapes agree, else mm() each,
  // each distinct input split to fp16 once (`staged`: a split the caller keeps across calls; null: this
  // call's own).
  void mm_products(const MatvecProduct* ps, uint32_t count, const float* x, size_t ldx, uint32_t n, size_t ldy,
                   StagedInput* staged = nullptr);
  void mark(OpGroup g) {
    if (times_ != nullptr) times_->mark(g, s_);
  }
  void mark(OpPart p) {
    if (times_ != nullptr) times_->part(p, s_);
  }
  // One mHC site; post_first: the previous sublayer's mhc_post (its y, post, comb) goes first.
  void mhc_site(const StepGeometry& g, const DevMatrix& fn, const float* base, const float* scale, const float* norm_w,
                bool post_first);
  void kda_layer(const StepGeometry& g, const DevLayer& l, LayerState& st);
  void dsa_layer(const StepGeometry& g, const DevLayer& l, LayerState& st);
  IndexerArgs indexer_args(const StepGeometry& g, const DevLayer& l, LayerState& st) const;
  // The indexer's key and gate products of x, then the step's keys into the rings and pools, on `stream`.
  void indexer_keys(const IndexerArgs& ia, const DevLayer& l, LayerState& st, cudaStream_t stream);
  // mm_staged's product on s_; on another stream (a branch's), the matvec of decode rows.
  void product_on(cudaStream_t stream, const DevMatrix& m, const float* x, size_t ldx, uint32_t n, float* y,
                  size_t ldy, StagedInput* staged);
  // Decode rows' products of one x on a branch's stream: one launch where matvec_products takes them, else
  // product_on each.
  void products_on(cudaStream_t stream, const MatvecProduct* ps, uint32_t count, const float* x, size_t ldx,
                   uint32_t n, size_t ldy);
  void dense_ffn(const DevMatrix& gate, const DevMatrix& up, const DevMatrix& down, uint32_t n, float* y);
  // defer_combine: a decode step leaves the combine to the next mHC site (combine_), which makes the
  // post's y itself where it can (gpu/mhc_decode.hpp); finish_combine() launches it where not.
  void moe_layer(const StepGeometry& g, const DevLayer& l, bool upload_misses, bool defer_combine = false);
  void finish_combine(uint32_t rows);
  // The routed experts of a decode step (up to 8 rows): every (row, expert) pair one group of a launch.
  void decode_experts(uint32_t n, const DevLayer& l, bool shared);
  void shared_expert(const DevLayer& l, uint32_t n);
  // A prefill chunk's: rows grouped by expert on the host, one GEMM triple per expert.
  void prefill_experts(uint32_t n, const DevLayer& l, bool upload_misses);

  const model::Glm5Hparams& hp_;
  ModelDims d_;
  const DeviceWeights& weights_;
  StageState& state_;
  Workspace& w_;
  StageExperts* experts_;
  blas::Handle cublas_;
  // The corrections of mm_staged's split products as one e4m3 product (null: the fp16 one of depth 2K).
  std::unique_ptr<blas::lt::Fp8Gemm> e4m3_;
  // Each weight chunk's descale and largest |value| (16 bytes a chunk), found at its first product: the weights
  // do not change, and the pass would decode them twice a product.
  std::map<std::pair<const uint8_t*, size_t>, uint32_t> e4m3_chunks_;
  DeviceBuffer e4m3_scales_;
  static constexpr uint32_t kE4m3Chunks = 4096;
  // The depth from which mm_staged takes the e4m3 corrections: the fp16 form's error grows with the depth (f32
  // accumulation) and e4m3's relative one does not, so at the fixtures' depths (64-512) the gap is widest: there
  // eval-ref's mean KL against the CPU rose from ~1e-12 to 1e-8 - 7e-5 (top-1 unchanged; gpu/PERF.md, h104). The
  // GLM products' depths are 1,536-16,384, where the products are long enough for the rate to matter.
  static constexpr size_t kE4m3MinDepth = 1024;
  cudaStream_t s_;
  OpTimes* times_ = nullptr;
  StepTrace* trace_ = nullptr;
  bool combine_pending_ = false;  // w_.y is combine_'s sum, not yet made
  MoeCombineIn combine_;
  // Decode steps' side work on forked branches (gpu/stream_branch.hpp): the fused sites' comb, made
  // beside the sublayer (gpu/mhc_decode.hpp), KDA's gate products beside q/k/v, a DSA layer's indexer
  // (its keys and selection; its weights on a branch of their own) beside the norms, q_b and k_b.
  bool branches_ = true;
  MhcCombBranch comb_branch_;
  StreamBranch gate_branch_, dsa_branch_, dsa_weights_branch_;
  DeviceBuffer router_done_{sizeof(uint32_t)};  // moe_route_decode's count of finished blocks
};

}  // namespace ferry::gpu
