#pragma once
// The scratch a CUDA stage's step runs in, sized once for its largest step: the mHC streams, every
// intermediate of its layers' kernels, the fp16 staging of the prefill GEMMs, and (on the last
// stage) the head's logits. Only the parts the stage's layers use are allocated.
#include <cstdint>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "model/glm5/glm5_hparams.hpp"
#include "model/stage.hpp"

namespace ferry::gpu {

// The model's widths, as the kernels take them.
struct ModelDims {
  uint32_t D, H, mix, V, C, kda_nh, kda_hd, K, qlr, kvlr, nh, nope, vd, ih, id, kp, F, I, E, k, S;
  explicit ModelDims(const model::Glm5Hparams& hp)
      : D(hp.hidden_size), H(hp.hc_mult), mix((2 + hp.hc_mult) * hp.hc_mult), V(hp.vocab_size),
        C(hp.kda_heads * hp.kda_head_dim), kda_nh(hp.kda_heads), kda_hd(hp.kda_head_dim), K(hp.conv_kernel),
        qlr(hp.q_lora_rank), kvlr(hp.kv_lora_rank), nh(hp.n_heads), nope(hp.qk_nope_head_dim), vd(hp.v_head_dim),
        ih(hp.index_n_heads), id(hp.index_head_dim), kp(std::max<uint32_t>(1, hp.index_kpool)), F(hp.dense_ffn),
        I(hp.moe_ffn), E(hp.n_experts), k(hp.n_experts_used), S(hp.moe_ffn * hp.n_shared_experts) {}
  // Floats of one row's streams: what a stage hands to the next.
  uint64_t stream_floats() const { return uint64_t{H} * D; }
};

// (row, split) slots of the sparse attention's scratch: up to 8 decode rows split 16 ways.
inline constexpr uint32_t kMlaPartialRows = kMaxMatvecTokens * 16;

struct Workspace {
  // Throws CudaError when the device has no room.
  Workspace(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t max_rows, uint32_t context);
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  uint64_t bytes() const { return bytes_; }

  uint32_t max_rows = 0;
  uint32_t max_selected = 0;  // token positions one row's sparse attention may select
  float *R = nullptr, *x = nullptr, *y = nullptr, *mix = nullptr, *post = nullptr, *comb = nullptr;
  // KDA
  float *qkv_raw = nullptr, *qkv = nullptr, *fa = nullptr, *f = nullptr, *beta = nullptr, *ga = nullptr,
        *gate = nullptr, *o = nullptr, *z = nullptr;
  // DSA
  float *qa = nullptr, *qr = nullptr, *q = nullptr, *lat = nullptr, *q_lat = nullptr, *o_lat = nullptr, *v = nullptr,
        *kq = nullptr, *kk = nullptr, *gs = nullptr, *iw = nullptr, *scores = nullptr, *mla_part = nullptr;
  size_t mla_part_elems = 0;  // floats of mla_part: sparse MLA's split partials, the indexer's selection scratch
  int32_t *sel_tokens = nullptr, *sel_counts = nullptr;
  // FFN and MoE
  size_t ffn_elems = 0;  // floats of eg and of eu each
  float *eg = nullptr, *eu = nullptr, *rlogits = nullptr, *rweights = nullptr, *eo = nullptr, *sh = nullptr;
  int32_t *rids = nullptr, *gather_idx = nullptr, *where = nullptr;
  uint32_t *expert_offsets = nullptr, *expert_tiles = nullptr;  // a prefill's routes grouped by expert (RouteSort)
  int32_t* shared_routes = nullptr;  // a decode step's experts that several rows chose (gpu/moe_decode.hpp)
  // fp16 staging of the prefill GEMMs: activations, and dequantised weights in row chunks; xl follows xh
  // (xh_elems on) and wl follows wh in one buffer each
  void *xh = nullptr, *xl = nullptr, *wh = nullptr, *wl = nullptr;
  size_t xh_elems = 0, wh_elems = 0;
  // The e4m3 corrections' (where e4m3_split_ready, else null): the input's e4m3 rows ([lo | hi], xh_elems each
  // half), and the scales' words: a weight chunk's descale and amax scratch, then the input's at word 4
  // (LayerRunner::mm_staged).
  void* x8 = nullptr;
  uint32_t* e4m3_words = nullptr;
  // the head (last stage)
  float *xo = nullptr, *logits = nullptr;
  uint32_t logit_rows = 0;
  void* sample_scratch = nullptr;  // sample_rows's, zeroed
  void* cublas_ws = nullptr;
  static constexpr size_t kCublasWorkspace = size_t{32} << 20;

 private:
  template <class T>
  T* alloc(size_t count);
  std::vector<DeviceBuffer> buffers_;
  uint64_t bytes_ = 0;
};

}  // namespace ferry::gpu
