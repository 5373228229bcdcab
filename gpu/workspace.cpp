#include "gpu/workspace.hpp"

#include <algorithm>

#include "gpu/kernels.hpp"
#include "gpu/moe_decode.hpp"
#include "model/glm5/glm5_tensors.hpp"

namespace ferry::gpu {

template <class T>
T* Workspace::alloc(size_t count) {
  buffers_.emplace_back(std::max<size_t>(count * sizeof(T), 16));
  bytes_ += buffers_.back().bytes();
  return buffers_.back().as<T>();
}

Workspace::Workspace(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t rows, uint32_t context)
    : max_rows(rows) {
  const ModelDims d(hp);
  const size_t M = rows;
  bool any_kda = false, any_dsa = false, any_moe = false;
  for (uint32_t l = layers.first; l < layers.end; ++l) {
    (model::glm5_layer_kind(hp, l) == model::LayerKind::kda ? any_kda : any_dsa) = true;
    any_moe = any_moe || model::glm5_ffn_kind(hp, l) == model::FfnKind::moe;
  }
  max_selected = hp.index_topk / d.kp * d.kp + d.kp;
  R = alloc<float>(M * d.H * d.D);
  x = alloc<float>(M * d.D);
  y = alloc<float>(M * d.D);
  mix = alloc<float>(M * d.mix);
  post = alloc<float>(M * d.H);
  comb = alloc<float>(M * d.H * d.H);
  if (any_kda) {
    qkv_raw = alloc<float>(M * 3 * d.C);
    qkv = alloc<float>(M * 3 * d.C);
    fa = alloc<float>(M * d.kda_hd);
    f = alloc<float>(M * d.C);
    beta = alloc<float>(M * d.kda_nh);
    ga = alloc<float>(M * d.kda_hd);
    gate = alloc<float>(M * d.C);
    o = alloc<float>(M * d.C);
    z = alloc<float>(M * d.C);
  }
  if (any_dsa) {
    qa = alloc<float>(M * d.qlr);
    qr = alloc<float>(M * d.qlr);
    q = alloc<float>(M * d.nh * d.nope);
    lat = alloc<float>(M * d.kvlr);
    q_lat = alloc<float>(M * d.nh * d.kvlr);
    o_lat = alloc<float>(M * d.nh * d.kvlr);
    mla_part_elems = size_t{kMlaPartialRows} * d.nh * (d.kvlr + 2);
    mla_part = alloc<float>(mla_part_elems);
    v = alloc<float>(M * d.nh * d.vd);
    kq = alloc<float>(M * d.ih * d.id);
    kk = alloc<float>(M * d.id);
    gs = alloc<float>(M * d.id);
    iw = alloc<float>(M * d.ih);
    scores = alloc<float>(M * (context / d.kp + 1));
    sel_tokens = alloc<int32_t>(M * max_selected);
    sel_counts = alloc<int32_t>(M);
  }
  const size_t ffn_rows = std::max<size_t>({d.F, d.S, any_moe ? size_t{d.k} * d.I : 0});
  ffn_elems = M * ffn_rows;
  eg = alloc<float>(ffn_elems);
  eu = alloc<float>(ffn_elems);
  if (any_moe) {
    rlogits = alloc<float>(M * d.E);
    rweights = alloc<float>(M * d.k);
    rids = alloc<int32_t>(M * d.k);
    eo = alloc<float>(M * d.k * d.D);
    sh = alloc<float>(M * d.D);
    gather_idx = alloc<int32_t>(M * d.k);
    where = alloc<int32_t>(M * d.k);
    expert_offsets = alloc<uint32_t>(d.E + 1);
    expert_tiles = alloc<uint32_t>(d.E + 1);
    const uint32_t decode_rows = std::min<uint32_t>(rows, kMaxMatvecTokens);
    shared_routes = alloc<int32_t>(shared_route_ints(decode_rows * d.k, kMaxMatvecTokens));
  }
  const size_t max_cols = std::max<size_t>({d.D, d.C, size_t{d.nh} * d.vd, d.F, d.I, d.qlr, d.kvlr, d.nope,
                                            size_t{d.H} * d.D});
  // Each pair one buffer, lo after hi: LayerRunner::mm lays rows of both halves side by side over it.
  xh_elems = M * max_cols;
  xh = alloc<uint16_t>(2 * xh_elems);
  xl = static_cast<uint16_t*>(xh) + xh_elems;
  wh_elems = size_t{32} << 20;
  wh = alloc<uint16_t>(2 * wh_elems);
  wl = static_cast<uint16_t*>(wh) + wh_elems;
  if (e4m3_split_ready()) {
    x8 = alloc<uint8_t>(2 * xh_elems);
    e4m3_words = alloc<uint32_t>(8);
  }
  if (layers.end >= hp.n_layers) {  // the last stage; past it, with the MTP block
    logit_rows = static_cast<uint32_t>(std::clamp<size_t>((size_t{128} << 20) / d.V, 8, M));
    xo = alloc<float>(size_t{logit_rows} * d.D);
    logits = alloc<float>(size_t{logit_rows} * d.V);
    sample_scratch = alloc<uint8_t>(sample_scratch_bytes());
    FERRY_CUDA(cudaMemset(sample_scratch, 0, sample_scratch_bytes()));
  }
  cublas_ws = alloc<uint8_t>(kCublasWorkspace);
}

}  // namespace ferry::gpu
