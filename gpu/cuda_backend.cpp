// The CUDA backend: weights and state on the device, the forward pass as a sequence of kernels and
// cuBLAS calls on one stream. This file is the orchestration (what runs in which order); the math is
// in the kernels (gpu/*.cu). Longer than the house limit because one Impl holds the whole stage:
// weights, state, workspace and the layer sequence read best in one place.
#include "gpu/cuda_backend.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <stdexcept>
#include <string>

#include "gpu/cuda_blas.hpp"
#include "gpu/cuda_check.hpp"
#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "model/glm5/glm5_tensors.hpp"
#include "model/glm5/glm5_weights.hpp"

namespace ferry::gpu {
namespace {

using model::FfnKind;
using model::GgmlType;
using model::LayerKind;

// (row, split) slots of the sparse attention's scratch: up to 8 decode rows split 16 ways.
constexpr uint32_t kMlaPartialRows = kMaxMatvecTokens * 16;

struct DevLayer {
  LayerKind kind = LayerKind::kda;
  FfnKind ffn = FfnKind::dense;
  bool has_indexer = false;
  const float *attn_norm = nullptr, *ffn_norm = nullptr;
  DevMatrix hc_attn_fn, hc_ffn_fn;
  const float *hc_attn_base = nullptr, *hc_attn_scale = nullptr, *hc_ffn_base = nullptr, *hc_ffn_scale = nullptr;
  // KDA
  DevMatrix attn_q, attn_k, attn_v, f_a, f_b, g_a, g_b, beta;
  const float *conv = nullptr, *ssm_a = nullptr, *dt_bias = nullptr, *ssm_norm = nullptr;
  DevMatrix attn_output;
  // DSA
  DevMatrix q_a, q_b, kv_a, k_b, v_b, idx_q_b, idx_k, idx_proj, idx_gate;
  const float *q_a_norm = nullptr, *kv_a_norm = nullptr, *idx_k_norm = nullptr, *idx_k_bias = nullptr, *idx_ape = nullptr;
  // FFN
  DevMatrix ffn_gate, ffn_up, ffn_down, router, gate_exps, up_exps, down_exps, gate_sh, up_sh, down_sh;
  const float* router_bias = nullptr;
  // per-slot state
  float *conv_state = nullptr, *kda_state = nullptr;
  float *latents = nullptr, *kk_cache = nullptr, *gate_cache = nullptr, *pool_cache = nullptr;
};

// Sizes of everything the forward pass keeps or uses, from the hyper-parameters.
struct Dims {
  uint32_t D, H, mix, V, C, kda_nh, kda_hd, K, qlr, kvlr, nh, nope, vd, ih, id, kp, F, I, E, k, S;
  explicit Dims(const model::Glm5Hparams& hp)
      : D(hp.hidden_size), H(hp.hc_mult), mix((2 + hp.hc_mult) * hp.hc_mult), V(hp.vocab_size),
        C(hp.kda_heads * hp.kda_head_dim), kda_nh(hp.kda_heads), kda_hd(hp.kda_head_dim), K(hp.conv_kernel),
        qlr(hp.q_lora_rank), kvlr(hp.kv_lora_rank), nh(hp.n_heads), nope(hp.qk_nope_head_dim), vd(hp.v_head_dim),
        ih(hp.index_n_heads), id(hp.index_head_dim), kp(hp.index_kpool), F(hp.dense_ffn), I(hp.moe_ffn),
        E(hp.n_experts), k(hp.n_experts_used), S(hp.moe_ffn * hp.n_shared_experts) {}
};

}  // namespace

struct CudaBackend::Impl {
  model::Glm5Hparams hp;
  Dims d;
  CudaBackendOptions opt;
  bool synthetic = false;
  std::string name;
  std::string kernels;  // kernel_image(): the device code the driver loaded
  std::unique_ptr<Stream> stream;
  blas::Handle cublas = nullptr;
  std::vector<DeviceBuffer> buffers;  // every allocation, freed with the backend
  uint64_t weight_bytes = 0, state_bytes = 0, work_bytes = 0, peak_used = 0;

  DevMatrix token_embd, output;
  const float* output_norm = nullptr;
  std::vector<DevLayer> layers;
  std::vector<uint32_t> slot_tokens;  // tokens each slot holds

  // workspace, sized for opt.max_step_rows rows
  struct Work {
    float *R, *x, *y, *mix, *post, *comb;
    float *qkv_raw, *qkv, *fa, *f, *beta, *ga, *gate, *o, *z;
    float *qa, *qr, *q, *lat, *q_lat, *o_lat, *v, *kq, *kk, *gs, *iw, *scores, *mla_part;
    int32_t *sel_tokens, *sel_counts;
    float *rlogits, *rweights, *eg, *eu, *eo, *sh, *xg;
    int32_t *rids, *gather_idx, *where;
    void *xh, *xl, *wh, *wl;
    size_t wh_elems;
    float *xo, *logits;
    uint32_t logit_rows;
    int32_t *meta;  // tokens, slot, pos, seg_first | seg slot, start, len, first | logit rows | SampleRows | sampled
    void* cublas_ws;
  } w{};
  uint32_t max_tokens = 0;  // per-row selection capacity
  PinnedBuffer meta_host, sampled_host, ids_host;
  std::map<uint32_t, GraphExec> graphs;   // decode graphs by row count
  std::map<uint32_t, int> graph_seen;

  explicit Impl(const model::Glm5Hparams& h, const CudaBackendOptions& o) : hp(h), d(h), opt(o) {}
  ~Impl() {
    if (cublas != nullptr) blas::api().destroy(cublas);
  }

  cudaStream_t s() const { return stream->get(); }
  // Where the step's SampleRows (8-byte aligned) and the chosen tokens sit in w.meta, in ints.
  static_assert(sizeof(SampleRow) == 8 * sizeof(int32_t));
  size_t sample_rows_at() const { return (9 * size_t{opt.max_step_rows} + 1) / 2 * 2; }
  size_t sampled_at() const { return sample_rows_at() + 8 * size_t{opt.max_step_rows}; }

  template <class T>
  T* alloc(size_t count, uint64_t* counter) {
    buffers.emplace_back(std::max<size_t>(count * sizeof(T), 16));
    if (counter) *counter += buffers.back().bytes();
    return buffers.back().as<T>();
  }
  void note_peak() {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) peak_used = std::max<uint64_t>(peak_used, total_b - free_b);
  }

  void init_device() {
    if (opt.max_slots == 0 || opt.max_context == 0 || opt.max_step_rows == 0) {
      throw std::invalid_argument("CUDA backend: max_slots, max_context and max_step_rows must be positive");
    }
    int count = 0;
    FERRY_CUDA(cudaGetDeviceCount(&count));
    if (opt.device < 0 || opt.device >= count) {
      throw CudaError("CUDA device " + std::to_string(opt.device) + " does not exist (" + std::to_string(count) + " visible)");
    }
    FERRY_CUDA(cudaSetDevice(opt.device));
    cudaDeviceProp prop{};
    FERRY_CUDA(cudaGetDeviceProperties(&prop, opt.device));
    name = prop.name;
    kernels = kernel_image();
    stream = std::make_unique<Stream>();
    FERRY_CUBLAS(blas::api().create(&cublas));
    FERRY_CUBLAS(blas::api().set_stream(cublas, s()));
    upload_quant_tables();
    slot_tokens.assign(opt.max_slots, 0);
  }

  // ---- weights ----
  const float* upload_vec(const std::vector<float>& v) {
    if (v.empty()) return nullptr;
    float* p = alloc<float>(v.size(), &weight_bytes);
    FERRY_CUDA(cudaMemcpy(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
    return p;
  }
  DevMatrix upload_matrix(const model::WeightMatrix& m, const char* what) {
    if (m.empty()) return {};
    if (!device_supports(m.type)) {
      throw CudaError(std::string("weight ") + what + " has ggml type " + std::string(model::ggml_type_traits(m.type).name) +
                      ", which the CUDA kernels cannot read");
    }
    DevMatrix dm;
    dm.type = m.type;
    dm.rows = static_cast<uint32_t>(m.rows);
    dm.cols = static_cast<uint32_t>(m.cols);
    dm.row_bytes = m.row_bytes;
    uint8_t* p = alloc<uint8_t>(m.row_bytes * m.rows, &weight_bytes);
    FERRY_CUDA(cudaMemcpy(p, m.data, m.row_bytes * m.rows, cudaMemcpyHostToDevice));
    dm.data = p;
    return dm;
  }

  void load(const model::Glm5Weights& wts) {
    token_embd = upload_matrix(wts.token_embd, "token_embd");
    output = upload_matrix(wts.output, "output");
    output_norm = upload_vec(wts.output_norm);
    layers.resize(hp.n_layers);
    for (uint32_t il = 0; il < hp.n_layers; ++il) {
      const model::Glm5LayerWeights& s = wts.layers[il];
      DevLayer& l = layers[il];
      l.kind = s.kind;
      l.ffn = s.ffn;
      l.has_indexer = s.has_indexer;
      l.attn_norm = upload_vec(s.attn_norm);
      l.ffn_norm = upload_vec(s.ffn_norm);
      l.hc_attn_fn = upload_matrix(s.hc_attn_fn, "hc_attn_fn");
      l.hc_ffn_fn = upload_matrix(s.hc_ffn_fn, "hc_ffn_fn");
      l.hc_attn_base = upload_vec(s.hc_attn_base);
      l.hc_attn_scale = upload_vec(s.hc_attn_scale);
      l.hc_ffn_base = upload_vec(s.hc_ffn_base);
      l.hc_ffn_scale = upload_vec(s.hc_ffn_scale);
      if (s.kind == LayerKind::kda) {
        l.attn_q = upload_matrix(s.attn_q, "attn_q");
        l.attn_k = upload_matrix(s.attn_k, "attn_k");
        l.attn_v = upload_matrix(s.attn_v, "attn_v");
        l.f_a = upload_matrix(s.ssm_f_a, "ssm_f_a");
        l.f_b = upload_matrix(s.ssm_f_b, "ssm_f_b");
        l.g_a = upload_matrix(s.ssm_g_a, "ssm_g_a");
        l.g_b = upload_matrix(s.ssm_g_b, "ssm_g_b");
        l.beta = upload_matrix(s.ssm_beta, "ssm_beta");
        std::vector<float> conv(s.conv_q);
        conv.insert(conv.end(), s.conv_k.begin(), s.conv_k.end());
        conv.insert(conv.end(), s.conv_v.begin(), s.conv_v.end());
        l.conv = upload_vec(conv);
        l.ssm_a = upload_vec(s.ssm_a);
        l.dt_bias = upload_vec(s.ssm_dt_bias);
        l.ssm_norm = upload_vec(s.ssm_norm);
      } else {
        l.q_a = upload_matrix(s.attn_q_a, "attn_q_a");
        l.q_b = upload_matrix(s.attn_q_b, "attn_q_b");
        l.kv_a = upload_matrix(s.attn_kv_a, "attn_kv_a_mqa");
        l.k_b = upload_matrix(s.attn_k_b, "attn_k_b");
        l.v_b = upload_matrix(s.attn_v_b, "attn_v_b");
        l.q_a_norm = upload_vec(s.q_a_norm);
        l.kv_a_norm = upload_vec(s.kv_a_norm);
        if (s.has_indexer) {
          l.idx_q_b = upload_matrix(s.idx_q_b, "indexer.attn_q_b");
          l.idx_k = upload_matrix(s.idx_k, "indexer.attn_k");
          l.idx_proj = upload_matrix(s.idx_proj, "indexer.proj");
          l.idx_gate = upload_matrix(s.idx_gate, "indexer_compressor_gate");
          l.idx_k_norm = upload_vec(s.idx_k_norm);
          l.idx_k_bias = upload_vec(s.idx_k_norm_bias);
          l.idx_ape = upload_vec(s.idx_ape);
        }
      }
      l.attn_output = upload_matrix(s.attn_output, "attn_output");
      if (s.ffn == FfnKind::dense) {
        l.ffn_gate = upload_matrix(s.ffn_gate, "ffn_gate");
        l.ffn_up = upload_matrix(s.ffn_up, "ffn_up");
        l.ffn_down = upload_matrix(s.ffn_down, "ffn_down");
      } else {
        l.router = upload_matrix(s.router, "ffn_gate_inp");
        l.router_bias = upload_vec(s.router_bias);
        l.gate_exps = upload_matrix(s.gate_exps, "ffn_gate_exps");
        l.up_exps = upload_matrix(s.up_exps, "ffn_up_exps");
        l.down_exps = upload_matrix(s.down_exps, "ffn_down_exps");
        l.gate_sh = upload_matrix(s.gate_shexp, "ffn_gate_shexp");
        l.up_sh = upload_matrix(s.up_shexp, "ffn_up_shexp");
        l.down_sh = upload_matrix(s.down_shexp, "ffn_down_shexp");
      }
    }
  }

  // Synthetic: matrices made on the device, small f32 state made here with plausible values.
  uint64_t synth_seed = 1, synth_id = 0;
  GgmlType synth_type = GgmlType::Q4_K;
  uint64_t host_rng = 0;
  float host_uniform() {  // in [-1, 1)
    host_rng += 0x9e3779b97f4a7c15ull;
    uint64_t z = host_rng;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
  }
  DevMatrix synth_matrix(uint64_t rows, uint64_t cols, bool keep_f32) {
    GgmlType t = keep_f32 ? GgmlType::F32 : synth_type;
    if (cols % model::ggml_type_traits(t).block_elems != 0) t = cols % 32 == 0 ? GgmlType::Q8_0 : GgmlType::F32;
    DevMatrix m;
    m.type = t;
    m.rows = static_cast<uint32_t>(rows);
    m.cols = static_cast<uint32_t>(cols);
    m.row_bytes = *model::ggml_bytes(t, cols);
    uint8_t* p = alloc<uint8_t>(m.row_bytes * rows, &weight_bytes);
    synth_fill(t, p, rows, m.cols, m.row_bytes, synth_seed, synth_id++, std::sqrt(3.0f / static_cast<float>(cols)), s());
    m.data = p;
    return m;
  }
  const float* synth_vec(size_t n, float centre, float spread) {
    std::vector<float> v(n);
    for (float& x : v) x = centre + spread * host_uniform();
    return upload_vec(v);
  }

  void make_synthetic(const SyntheticModel& sm) {
    synthetic = true;
    synth_seed = sm.seed;
    synth_type = sm.type;
    host_rng = sm.seed;
    if (!device_supports(sm.type)) {
      throw CudaError("synthetic weights of type " + std::string(model::ggml_type_traits(sm.type).name) +
                      ": the CUDA kernels cannot read it");
    }
    const Dims& z = d;
    token_embd = synth_matrix(z.V, z.D, false);
    output = synth_matrix(z.V, z.D, false);
    output_norm = synth_vec(z.D, 1.0f, 0.1f);
    layers.resize(hp.n_layers);
    for (uint32_t il = 0; il < hp.n_layers; ++il) {
      DevLayer& l = layers[il];
      l.kind = model::glm5_layer_kind(hp, il);
      l.ffn = model::glm5_ffn_kind(hp, il);
      l.has_indexer = model::glm5_has_indexer(hp, il);
      l.attn_norm = synth_vec(z.D, 1.0f, 0.1f);
      l.ffn_norm = synth_vec(z.D, 1.0f, 0.1f);
      l.hc_attn_fn = synth_matrix(z.mix, z.H * z.D, true);
      l.hc_ffn_fn = synth_matrix(z.mix, z.H * z.D, true);
      l.hc_attn_base = synth_vec(z.mix, 0.0f, 0.5f);
      l.hc_attn_scale = synth_vec(3, 1.0f, 0.2f);
      l.hc_ffn_base = synth_vec(z.mix, 0.0f, 0.5f);
      l.hc_ffn_scale = synth_vec(3, 1.0f, 0.2f);
      if (l.kind == LayerKind::kda) {
        l.attn_q = synth_matrix(z.C, z.D, false);
        l.attn_k = synth_matrix(z.C, z.D, false);
        l.attn_v = synth_matrix(z.C, z.D, false);
        l.f_a = synth_matrix(z.kda_hd, z.D, false);
        l.f_b = synth_matrix(z.C, z.kda_hd, false);
        l.g_a = synth_matrix(z.kda_hd, z.D, false);
        l.g_b = synth_matrix(z.C, z.kda_hd, false);
        l.beta = synth_matrix(z.kda_nh, z.D, false);
        l.conv = synth_vec(static_cast<size_t>(3) * z.C * z.K, 0.0f, 0.5f);
        std::vector<float> a(z.kda_nh);
        for (float& x : a) x = -std::exp(0.5f + 0.5f * host_uniform());
        l.ssm_a = upload_vec(a);
        l.dt_bias = synth_vec(z.C, -3.0f, 1.0f);
        l.ssm_norm = synth_vec(z.kda_hd, 1.0f, 0.1f);
        l.attn_output = synth_matrix(z.D, z.C, false);
      } else {
        l.q_a = synth_matrix(z.qlr, z.D, false);
        l.q_b = synth_matrix(static_cast<uint64_t>(z.nh) * z.nope, z.qlr, false);
        l.kv_a = synth_matrix(z.kvlr, z.D, false);
        l.k_b = synth_matrix(static_cast<uint64_t>(z.nh) * z.kvlr, z.nope, false);
        l.v_b = synth_matrix(static_cast<uint64_t>(z.nh) * z.vd, z.kvlr, false);
        l.q_a_norm = synth_vec(z.qlr, 1.0f, 0.1f);
        l.kv_a_norm = synth_vec(z.kvlr, 1.0f, 0.1f);
        if (l.has_indexer) {
          l.idx_q_b = synth_matrix(static_cast<uint64_t>(z.ih) * z.id, z.qlr, false);
          l.idx_k = synth_matrix(z.id, z.D, false);
          l.idx_proj = synth_matrix(z.ih, z.D, true);
          l.idx_gate = synth_matrix(z.id, z.D, false);
          l.idx_k_norm = synth_vec(z.id, 1.0f, 0.1f);
          l.idx_k_bias = synth_vec(z.id, 0.0f, 0.1f);
          l.idx_ape = synth_vec(static_cast<size_t>(z.kp) * z.id, 0.0f, 0.5f);
        }
        l.attn_output = synth_matrix(z.D, static_cast<uint64_t>(z.nh) * z.vd, false);
      }
      if (l.ffn == FfnKind::dense) {
        l.ffn_gate = synth_matrix(z.F, z.D, false);
        l.ffn_up = synth_matrix(z.F, z.D, false);
        l.ffn_down = synth_matrix(z.D, z.F, false);
      } else {
        l.router = synth_matrix(z.E, z.D, true);
        l.router_bias = synth_vec(z.E, 0.0f, 0.01f);
        l.gate_exps = synth_matrix(static_cast<uint64_t>(z.E) * z.I, z.D, false);
        l.up_exps = synth_matrix(static_cast<uint64_t>(z.E) * z.I, z.D, false);
        l.down_exps = synth_matrix(static_cast<uint64_t>(z.E) * z.D, z.I, false);
        if (z.S > 0) {
          l.gate_sh = synth_matrix(z.S, z.D, false);
          l.up_sh = synth_matrix(z.S, z.D, false);
          l.down_sh = synth_matrix(z.D, z.S, false);
        }
      }
    }
    stream->synchronize();
  }

  // ---- state and workspace ----
  void allocate_state_and_work() {
    const Dims& z = d;
    const size_t slots = opt.max_slots, ctx = opt.max_context;
    const uint32_t kp = std::max<uint32_t>(1, z.kp);
    for (DevLayer& l : layers) {
      if (l.kind == LayerKind::kda) {
        l.conv_state = alloc<float>(slots * 3 * z.C * (z.K - 1), &state_bytes);
        l.kda_state = alloc<float>(slots * z.kda_nh * z.kda_hd * z.kda_hd, &state_bytes);
      } else {
        l.latents = alloc<float>(slots * ctx * z.kvlr, &state_bytes);
        if (l.has_indexer) {
          l.kk_cache = alloc<float>(slots * ctx * z.id, &state_bytes);
          l.gate_cache = alloc<float>(slots * ctx * z.id, &state_bytes);
          l.pool_cache = alloc<float>(slots * (ctx / kp + 1) * z.id, &state_bytes);
        }
      }
    }
    zero_all_state();
    max_tokens = hp.index_topk / kp * kp + kp;
    const size_t M = opt.max_step_rows;
    uint64_t* wb = &work_bytes;
    w.R = alloc<float>(M * z.H * z.D, wb);
    w.x = alloc<float>(M * z.D, wb);
    w.y = alloc<float>(M * z.D, wb);
    w.mix = alloc<float>(M * z.mix, wb);
    w.post = alloc<float>(M * z.H, wb);
    w.comb = alloc<float>(M * z.H * z.H, wb);
    const bool any_kda = std::any_of(layers.begin(), layers.end(), [](const DevLayer& l) { return l.kind == LayerKind::kda; });
    const bool any_dsa = std::any_of(layers.begin(), layers.end(), [](const DevLayer& l) { return l.kind == LayerKind::dsa; });
    const bool any_moe = std::any_of(layers.begin(), layers.end(), [](const DevLayer& l) { return l.ffn == FfnKind::moe; });
    if (any_kda) {
      w.qkv_raw = alloc<float>(M * 3 * z.C, wb);
      w.qkv = alloc<float>(M * 3 * z.C, wb);
      w.fa = alloc<float>(M * z.kda_hd, wb);
      w.f = alloc<float>(M * z.C, wb);
      w.beta = alloc<float>(M * z.kda_nh, wb);
      w.ga = alloc<float>(M * z.kda_hd, wb);
      w.gate = alloc<float>(M * z.C, wb);
      w.o = alloc<float>(M * z.C, wb);
      w.z = alloc<float>(M * z.C, wb);
    }
    if (any_dsa) {
      w.qa = alloc<float>(M * z.qlr, wb);
      w.qr = alloc<float>(M * z.qlr, wb);
      w.q = alloc<float>(M * z.nh * z.nope, wb);
      w.lat = alloc<float>(M * z.kvlr, wb);
      w.q_lat = alloc<float>(M * z.nh * z.kvlr, wb);
      w.o_lat = alloc<float>(M * z.nh * z.kvlr, wb);
      w.mla_part = alloc<float>(size_t{kMlaPartialRows} * z.nh * (z.kvlr + 2), wb);
      w.v = alloc<float>(M * z.nh * z.vd, wb);
      w.kq = alloc<float>(M * z.ih * z.id, wb);
      w.kk = alloc<float>(M * z.id, wb);
      w.gs = alloc<float>(M * z.id, wb);
      w.iw = alloc<float>(M * z.ih, wb);
      w.scores = alloc<float>(M * (ctx / kp + 1), wb);
      w.sel_tokens = alloc<int32_t>(M * max_tokens, wb);
      w.sel_counts = alloc<int32_t>(M, wb);
    }
    size_t ffn_rows = std::max<size_t>(z.F, z.S);
    w.eg = alloc<float>(M * std::max<size_t>(ffn_rows, any_moe ? static_cast<size_t>(z.k) * z.I : 0), wb);
    w.eu = alloc<float>(M * std::max<size_t>(ffn_rows, any_moe ? static_cast<size_t>(z.k) * z.I : 0), wb);
    if (any_moe) {
      w.rlogits = alloc<float>(M * z.E, wb);
      w.rweights = alloc<float>(M * z.k, wb);
      w.rids = alloc<int32_t>(M * z.k, wb);
      w.eo = alloc<float>(M * z.k * z.D, wb);
      w.sh = alloc<float>(M * z.D, wb);
      w.xg = alloc<float>(M * z.k * z.D, wb);
      w.gather_idx = alloc<int32_t>(M * z.k, wb);
      w.where = alloc<int32_t>(M * z.k, wb);
      ids_host = PinnedBuffer(M * z.k * sizeof(int32_t));
    }
    // fp16 staging for the prefill GEMMs: activations, and dequantised weights in row chunks.
    size_t max_cols = std::max<size_t>({z.D, z.C, static_cast<size_t>(z.nh) * z.vd, z.F, z.I, z.qlr, z.kvlr, z.nope,
                                        static_cast<size_t>(z.H) * z.D});
    w.xh = alloc<uint16_t>(M * max_cols, wb);
    w.xl = alloc<uint16_t>(M * max_cols, wb);
    w.wh_elems = size_t{32} << 20;
    w.wh = alloc<uint16_t>(w.wh_elems, wb);
    w.wl = alloc<uint16_t>(w.wh_elems, wb);
    w.logit_rows = static_cast<uint32_t>(std::clamp<size_t>((size_t{128} << 20) / z.V, 8, M));
    w.xo = alloc<float>(static_cast<size_t>(w.logit_rows) * z.D, wb);
    w.logits = alloc<float>(static_cast<size_t>(w.logit_rows) * z.V, wb);
    const size_t meta_ints = sampled_at() + M;
    w.meta = alloc<int32_t>(meta_ints, wb);
    meta_host = PinnedBuffer(meta_ints * sizeof(int32_t));
    sampled_host = PinnedBuffer(M * sizeof(int32_t));
    w.cublas_ws = alloc<uint8_t>(size_t{32} << 20, wb);
    FERRY_CUBLAS(blas::api().set_workspace(cublas, w.cublas_ws, size_t{32} << 20));
    FERRY_CUDA(cudaDeviceSynchronize());
    note_peak();
  }

  void zero_slot(uint32_t slot) {
    const Dims& z = d;
    for (DevLayer& l : layers) {
      if (l.kind != LayerKind::kda) continue;
      const size_t conv = static_cast<size_t>(3) * z.C * (z.K - 1), st = static_cast<size_t>(z.kda_nh) * z.kda_hd * z.kda_hd;
      FERRY_CUDA(cudaMemsetAsync(l.conv_state + slot * conv, 0, conv * sizeof(float), s()));
      FERRY_CUDA(cudaMemsetAsync(l.kda_state + slot * st, 0, st * sizeof(float), s()));
    }
  }
  void zero_all_state() {
    for (uint32_t sl = 0; sl < opt.max_slots; ++sl) zero_slot(sl);
    FERRY_CUDA(cudaStreamSynchronize(s()));
  }

  // ---- matrix products ----
  // y[t][ldy] = W x[t] for t < n: the matvec kernels for up to 8 rows, else cuBLAS: fp32 SGEMM for f32
  // weights; for the rest, tensor-core fp16 GEMMs with fp32 accumulation over split operands
  // (W_hi x_hi + (W_hi x_lo + W_lo x_hi) / 2^12), which keeps f32 accuracy: plain fp16 operands flip
  // the top token of small models against the CPU reference.
  void mm(const DevMatrix& m, const float* x, size_t ldx, uint32_t n, float* y, size_t ldy) {
    if (n == 0 || m.rows == 0) return;
    if (n <= kMaxMatvecTokens) {
      MatvecArgs a;
      a.w = m;
      a.x = x;
      a.x_tok_stride = ldx;
      a.y = y;
      a.y_tok_stride = ldy;
      a.tokens = n;
      matvec(a, s());
      return;
    }
    const float one = 1.0f, zero = 0.0f;
    if (m.type == GgmlType::F32) {
      FERRY_CUBLAS(blas::api().sgemm(cublas, blas::op_t, blas::op_n, static_cast<int>(m.rows), static_cast<int>(n),
                                     static_cast<int>(m.cols), &one, reinterpret_cast<const float*>(m.data),
                                     static_cast<int>(m.row_bytes / 4), x, static_cast<int>(ldx), &zero, y,
                                     static_cast<int>(ldy)));
      return;
    }
    float_to_half(x, ldx, n, m.cols, w.xh, s(), w.xl);
    const size_t chunk = std::max<size_t>(1, w.wh_elems / m.cols);
    const float lo = 1.0f / kHalfLoScale;
    for (size_t r0 = 0; r0 < m.rows; r0 += chunk) {
      const size_t rows = std::min<size_t>(chunk, m.rows - r0);
      dequantize_to_half(m, r0, rows, w.wh, s(), w.wl);
      auto gemm = [&](const void* a, const void* b, const float* alpha, const float* beta) {
        FERRY_CUBLAS(blas::api().gemm_ex(cublas, blas::op_t, blas::op_n, static_cast<int>(rows), static_cast<int>(n),
                                         static_cast<int>(m.cols), alpha, a, CUDA_R_16F, static_cast<int>(m.cols), b,
                                         CUDA_R_16F, static_cast<int>(m.cols), beta, y + r0, CUDA_R_32F,
                                         static_cast<int>(ldy), blas::compute_32f, blas::gemm_default));
      };
      gemm(w.wh, w.xh, &one, &zero);
      gemm(w.wh, w.xl, &lo, &one);
      gemm(w.wl, w.xh, &lo, &one);
    }
  }

  // Per-group products: group g multiplies rows [g*rows_per_group, ...) of `m` with x + g*xg.
  void mm_grouped(const DevMatrix& m, uint32_t groups, const float* x, size_t ldx, size_t xg, uint32_t n, float* y,
                  size_t ldy, size_t yg) {
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
      matvec(a, s());
      return;
    }
    for (uint32_t g = 0; g < groups; ++g) mm(m.slice_rows(static_cast<size_t>(g) * rpg, rpg), x + g * xg, ldx, n, y + g * yg, ldy);
  }

  // ---- layers ----
  struct StepGeometry {
    uint32_t rows = 0, segments = 0, max_seg_rows = 0;
    RowInfo row;
    SegInfo seg;
  };

  void mhc_site(const StepGeometry& g, const DevMatrix& fn, const float* base, const float* scale, const float* norm_w) {
    mm(fn, w.R, static_cast<size_t>(d.H) * d.D, g.rows, w.mix, d.mix);
    MhcArgs a;
    a.streams = w.R;
    a.mix = w.mix;
    a.base = base;
    a.scale = scale;
    a.norm_w = norm_w;
    a.rows = g.rows;
    a.H = d.H;
    a.D = d.D;
    a.iters = hp.hc_sinkhorn_iters;
    a.rms_eps = hp.rms_eps;
    a.hc_eps = hp.hc_eps;
    a.x = w.x;
    a.post = w.post;
    a.comb = w.comb;
    mhc_pre(a, s());
  }

  void kda_layer(const StepGeometry& g, DevLayer& l) {
    const Dims& z = d;
    const uint32_t n = g.rows;
    mm(l.attn_q, w.x, z.D, n, w.qkv_raw, 3 * z.C);
    mm(l.attn_k, w.x, z.D, n, w.qkv_raw + z.C, 3 * z.C);
    mm(l.attn_v, w.x, z.D, n, w.qkv_raw + 2 * z.C, 3 * z.C);
    KdaArgs a;
    a.row = g.row;
    a.seg = g.seg;
    a.rows = n;
    a.segments = g.segments;
    a.heads = z.kda_nh;
    a.head_dim = z.kda_hd;
    a.kernel = z.K;
    a.qkv = w.qkv;
    a.qkv_raw = w.qkv_raw;
    a.conv_w = l.conv;
    a.conv_state = l.conv_state;
    kda_conv(a, s());
    mm(l.f_a, w.x, z.D, n, w.fa, z.kda_hd);
    mm(l.f_b, w.fa, z.kda_hd, n, w.f, z.C);
    mm(l.beta, w.x, z.D, n, w.beta, z.kda_nh);
    a.f = w.f;
    a.dt_bias = l.dt_bias;
    a.a = l.ssm_a;
    a.lower_bound = hp.kda_lower_bound;
    a.beta = w.beta;
    a.state = l.kda_state;
    a.out = w.o;
    kda_recurrent(a, s());
    mm(l.g_a, w.x, z.D, n, w.ga, z.kda_hd);
    mm(l.g_b, w.ga, z.kda_hd, n, w.gate, z.C);
    gated_rms_norm(w.o, w.gate, l.ssm_norm, n, z.kda_nh, z.kda_hd, hp.rms_eps, w.z, s());
    mm(l.attn_output, w.z, z.C, n, w.y, z.D);
  }

  void dsa_layer(const StepGeometry& g, DevLayer& l) {
    const Dims& z = d;
    const uint32_t n = g.rows;
    const uint32_t ctx = opt.max_context;
    mm(l.q_a, w.x, z.D, n, w.qa, z.qlr);
    rms_norm(w.qa, z.qlr, l.q_a_norm, n, z.qlr, hp.rms_eps, w.qr, z.qlr, s());
    mm(l.q_b, w.qr, z.qlr, n, w.q, static_cast<size_t>(z.nh) * z.nope);
    mm(l.kv_a, w.x, z.D, n, w.lat, z.kvlr);
    rms_norm(w.lat, z.kvlr, l.kv_a_norm, n, z.kvlr, hp.rms_eps, w.lat, z.kvlr, s());
    scatter_to_cache(w.lat, z.kvlr, g.row, n, z.kvlr, ctx, l.latents, s());
    if (l.has_indexer) {
      mm(l.idx_q_b, w.qr, z.qlr, n, w.kq, static_cast<size_t>(z.ih) * z.id);
      mm(l.idx_k, w.x, z.D, n, w.kk, z.id);
      layer_norm(w.kk, z.id, l.idx_k_norm, l.idx_k_bias, n, z.id, hp.index_norm_eps, w.kk, z.id, s());
      mm(l.idx_gate, w.x, z.D, n, w.gs, z.id);
      mm(l.idx_proj, w.x, z.D, n, w.iw, z.ih);
      scatter_to_cache(w.kk, z.id, g.row, n, z.id, ctx, l.kk_cache, s());
      scatter_to_cache(w.gs, z.id, g.row, n, z.id, ctx, l.gate_cache, s());
      IndexerArgs ia;
      ia.row = g.row;
      ia.seg = g.seg;
      ia.rows = n;
      ia.segments = g.segments;
      ia.max_rows_per_segment = g.max_seg_rows;
      ia.heads = z.ih;
      ia.head_dim = z.id;
      ia.kpool = z.kp;
      ia.topk = hp.index_topk;
      ia.ctx = ctx;
      ia.select_tail = hp.index_select_tail;
      ia.kk_cache = l.kk_cache;
      ia.gate_cache = l.gate_cache;
      ia.ape = l.idx_ape;
      ia.pool_cache = l.pool_cache;
      ia.q = w.kq;
      ia.w = w.iw;
      ia.scores = w.scores;
      ia.tokens = w.sel_tokens;
      ia.counts = w.sel_counts;
      ia.max_tokens = max_tokens;
      indexer_pool_keys(ia, s());
      indexer_select(ia, s());
    }
    mm_grouped(l.k_b, z.nh, w.q, static_cast<size_t>(z.nh) * z.nope, z.nope, n, w.q_lat,
               static_cast<size_t>(z.nh) * z.kvlr, z.kvlr);
    SparseMlaArgs ma;
    ma.row = g.row;
    ma.rows = n;
    ma.heads = z.nh;
    ma.rank = z.kvlr;
    ma.ctx = ctx;
    ma.max_tokens = max_tokens;
    ma.scale = 1.0f / std::sqrt(static_cast<float>(z.nope));
    ma.q_lat = w.q_lat;
    ma.latents = l.latents;
    ma.tokens = w.sel_tokens;
    ma.counts = w.sel_counts;
    ma.out = w.o_lat;
    ma.partial = w.mla_part;
    ma.partial_rows = kMlaPartialRows;
    sparse_mla(ma, s());
    mm_grouped(l.v_b, z.nh, w.o_lat, static_cast<size_t>(z.nh) * z.kvlr, z.kvlr, n, w.v,
               static_cast<size_t>(z.nh) * z.vd, z.vd);
    mm(l.attn_output, w.v, static_cast<size_t>(z.nh) * z.vd, n, w.y, z.D);
  }

  void dense_ffn(const DevMatrix& gate, const DevMatrix& up, const DevMatrix& down, uint32_t n, float* y) {
    const uint32_t F = gate.rows;
    mm(gate, w.x, d.D, n, w.eg, F);
    mm(up, w.x, d.D, n, w.eu, F);
    swiglu(w.eg, w.eu, F, n, F, hp.swiglu_limit, s());
    mm(down, w.eg, F, n, y, d.D);
  }

  void moe_layer(const StepGeometry& g, DevLayer& l) {
    const Dims& z = d;
    const uint32_t n = g.rows, k = z.k;
    mm(l.router, w.x, z.D, n, w.rlogits, z.E);
    RouterArgs ra;
    ra.logits = w.rlogits;
    ra.bias = l.router_bias;
    ra.rows = n;
    ra.E = z.E;
    ra.k = k;
    ra.n_group = hp.n_group;
    ra.topk_group = hp.topk_group;
    ra.norm_topk_prob = hp.norm_topk_prob;
    ra.scaling = hp.routed_scaling;
    ra.ids = w.rids;
    ra.weights = w.rweights;
    moe_route(ra, s());
    const bool shared = !l.gate_sh.empty();
    if (shared) dense_ffn(l.gate_sh, l.up_sh, l.down_sh, n, w.sh);
    const DevMatrix ge = l.gate_exps.slice_rows(0, z.I), ue = l.up_exps.slice_rows(0, z.I), de = l.down_exps.slice_rows(0, z.D);
    if (n <= kMaxMatvecTokens) {
      // Decode: every (row, chosen expert) pair is one group of a single launch; no host round trip.
      MatvecArgs a;
      a.w = ge;
      a.w_group_bytes = ge.bytes();
      a.w_group_index = w.rids;
      a.x = w.x;
      a.x_group_stride = z.D;
      a.x_group_div = k;
      a.y = w.eg;
      a.y_group_stride = z.I;
      a.groups = n * k;
      matvec(a, s());
      a.w = ue;
      a.y = w.eu;
      matvec(a, s());
      swiglu(w.eg, w.eu, z.I, n * k, z.I, hp.swiglu_limit, s());
      a.w = de;
      a.w_group_bytes = de.bytes();
      a.x = w.eg;
      a.x_group_stride = z.I;
      a.x_group_div = 1;
      a.y = w.eo;
      a.y_group_stride = z.D;
      matvec(a, s());
      moe_combine(w.eo, nullptr, w.rweights, shared ? w.sh : nullptr, n, k, z.D, w.y, s());
      return;
    }
    // Prefill: rows grouped by expert (the routes come to the host once), one product per expert.
    int32_t* ids = ids_host.as<int32_t>();
    FERRY_CUDA(cudaMemcpyAsync(ids, w.rids, static_cast<size_t>(n) * k * sizeof(int32_t), cudaMemcpyDeviceToHost, s()));
    FERRY_CUDA(cudaStreamSynchronize(s()));
    std::vector<uint32_t> count(z.E + 1, 0);
    for (size_t i = 0; i < static_cast<size_t>(n) * k; ++i) {
      if (ids[i] < 0 || static_cast<uint32_t>(ids[i]) >= z.E) throw CudaError("MoE router produced an invalid expert id");
      ++count[static_cast<size_t>(ids[i]) + 1];
    }
    std::vector<uint32_t> offset(z.E + 1, 0);
    for (uint32_t e = 0; e < z.E; ++e) offset[e + 1] = offset[e] + count[e + 1];
    std::vector<int32_t> gather(static_cast<size_t>(n) * k), where(static_cast<size_t>(n) * k);
    std::vector<uint32_t> fill(offset.begin(), offset.end() - 1);
    for (size_t i = 0; i < static_cast<size_t>(n) * k; ++i) {
      const uint32_t at = fill[static_cast<size_t>(ids[i])]++;
      gather[at] = static_cast<int32_t>(i / k);
      where[i] = static_cast<int32_t>(at);
    }
    FERRY_CUDA(cudaMemcpyAsync(w.gather_idx, gather.data(), gather.size() * sizeof(int32_t), cudaMemcpyHostToDevice, s()));
    FERRY_CUDA(cudaMemcpyAsync(w.where, where.data(), where.size() * sizeof(int32_t), cudaMemcpyHostToDevice, s()));
    gather_rows(w.x, w.gather_idx, n * k, z.D, w.xg, s());
    for (uint32_t e = 0; e < z.E; ++e) {
      const uint32_t c = offset[e + 1] - offset[e];
      if (c == 0) continue;
      const size_t o = offset[e];
      mm(l.gate_exps.slice_rows(static_cast<size_t>(e) * z.I, z.I), w.xg + o * z.D, z.D, c, w.eg + o * z.I, z.I);
      mm(l.up_exps.slice_rows(static_cast<size_t>(e) * z.I, z.I), w.xg + o * z.D, z.D, c, w.eu + o * z.I, z.I);
    }
    swiglu(w.eg, w.eu, z.I, n * k, z.I, hp.swiglu_limit, s());
    for (uint32_t e = 0; e < z.E; ++e) {
      const uint32_t c = offset[e + 1] - offset[e];
      if (c == 0) continue;
      const size_t o = offset[e];
      mm(l.down_exps.slice_rows(static_cast<size_t>(e) * z.D, z.D), w.eg + o * z.I, z.I, c, w.eo + o * z.D, z.D);
    }
    moe_combine(w.eo, w.where, w.rweights, shared ? w.sh : nullptr, n, k, z.D, w.y, s());
    // The host vectors above are read by copies already enqueued: wait before they go away.
    FERRY_CUDA(cudaStreamSynchronize(s()));
  }

  // Embedding through the last layer for the rows staged in w.meta.
  void forward(const StepGeometry& g, const int32_t* tokens) {
    embed_rows(token_embd, tokens, g.rows, w.R, d.H, s());
    for (DevLayer& l : layers) {
      mhc_site(g, l.hc_attn_fn, l.hc_attn_base, l.hc_attn_scale, l.attn_norm);
      if (l.kind == LayerKind::kda) {
        kda_layer(g, l);
      } else {
        dsa_layer(g, l);
      }
      mhc_post(w.R, w.y, w.post, w.comb, g.rows, d.H, d.D, s());
      mhc_site(g, l.hc_ffn_fn, l.hc_ffn_base, l.hc_ffn_scale, l.ffn_norm);
      if (l.ffn == FfnKind::dense) {
        dense_ffn(l.ffn_gate, l.ffn_up, l.ffn_down, g.rows, w.y);
      } else {
        moe_layer(g, l);
      }
      mhc_post(w.R, w.y, w.post, w.comb, g.rows, d.H, d.D, s());
    }
  }

  // Logits of `count` rows listed at `row_idx` (device) into w.logits.
  void logits(const int32_t* row_idx, uint32_t count) {
    hc_head(w.R, row_idx, count, d.H, d.D, output_norm, hp.rms_eps, w.xo, s());
    mm(output, w.xo, d.D, count, w.logits, d.V);
  }

  std::vector<model::SlotResult> step(const std::vector<model::SlotRows>& rows);
  void run_chunk(const std::vector<model::SlotRows>& rows, std::vector<model::SlotResult>& out);
};

// One step: validates every row against the slots' state, then runs the rows in chunks of at most
// max_step_rows (a long prefill is split into consecutive pieces of the same slot).
std::vector<model::SlotResult> CudaBackend::Impl::step(const std::vector<model::SlotRows>& rows) {
  std::set<uint32_t> seen;
  for (const model::SlotRows& r : rows) {
    if (r.slot >= opt.max_slots) throw std::invalid_argument("slot " + std::to_string(r.slot) + " does not exist");
    if (!seen.insert(r.slot).second) throw std::invalid_argument("slot " + std::to_string(r.slot) + " appears twice in one step");
    const uint32_t held = r.start == 0 ? 0 : slot_tokens[r.slot];
    if (r.start != held) {
      throw std::invalid_argument("slot " + std::to_string(r.slot) + ": rows start at " + std::to_string(r.start) +
                                  " but the slot holds " + std::to_string(slot_tokens[r.slot]) + " tokens");
    }
    if (uint64_t{r.start} + r.tokens.size() > opt.max_context) {
      throw std::invalid_argument("slot " + std::to_string(r.slot) + ": position " +
                                  std::to_string(uint64_t{r.start} + r.tokens.size()) + " exceeds max_context " +
                                  std::to_string(opt.max_context));
    }
    for (int32_t t : r.tokens) {
      if (t < 0 || static_cast<uint32_t>(t) >= d.V) throw std::invalid_argument("token id " + std::to_string(t) + " is outside the vocabulary");
    }
  }
  std::vector<model::SlotResult> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) out[i].slot = rows[i].slot;
  // Split into chunks: whole slots while they fit, a long slot in pieces (only its last piece samples).
  std::vector<model::SlotRows> chunk;
  std::vector<size_t> chunk_src;
  std::vector<bool> chunk_last;  // the piece holds its row's last token
  uint32_t used = 0;
  auto flush = [&] {
    if (chunk.empty()) return;
    std::vector<model::SlotResult> res(chunk.size());
    run_chunk(chunk, res);
    for (size_t i = 0; i < chunk.size(); ++i) {
      model::SlotResult& dst = out[chunk_src[i]];
      if (chunk_last[i] && rows[chunk_src[i]].sample) dst.sampled = res[i].sampled;
      if (!res[i].logits.empty()) dst.logits.insert(dst.logits.end(), res[i].logits.begin(), res[i].logits.end());
    }
    chunk.clear();
    chunk_src.clear();
    chunk_last.clear();
    used = 0;
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    const model::SlotRows& r = rows[i];
    if (r.tokens.empty()) continue;
    size_t done = 0;
    while (done < r.tokens.size()) {
      if (used == opt.max_step_rows) flush();
      const size_t take = std::min<size_t>(r.tokens.size() - done, opt.max_step_rows - used);
      model::SlotRows piece;
      piece.slot = r.slot;
      piece.start = r.start + static_cast<uint32_t>(done);
      piece.tokens.assign(r.tokens.begin() + static_cast<ptrdiff_t>(done), r.tokens.begin() + static_cast<ptrdiff_t>(done + take));
      const bool last = done + take == r.tokens.size();
      piece.logits_all = r.logits_all;
      piece.sample = r.sample && last;
      piece.sampling = r.sampling;
      // A piece before the last wants logits only for logits_all.
      if (!last && !r.logits_all) piece.sample = true, piece.sampling = model::SamplingParams{};
      chunk.push_back(std::move(piece));
      chunk_src.push_back(i);
      chunk_last.push_back(last);
      used += static_cast<uint32_t>(take);
      done += take;
    }
  }
  flush();
  for (const model::SlotRows& r : rows) {
    if (!r.tokens.empty()) slot_tokens[r.slot] = r.start + static_cast<uint32_t>(r.tokens.size());
  }
  return out;
}

void CudaBackend::Impl::run_chunk(const std::vector<model::SlotRows>& rows, std::vector<model::SlotResult>& out) {
  const size_t M = opt.max_step_rows;
  int32_t* mh = meta_host.as<int32_t>();
  int32_t* h_tokens = mh;
  int32_t* h_slot = mh + M;
  int32_t* h_pos = mh + 2 * M;
  int32_t* h_first = mh + 3 * M;
  int32_t* h_sslot = mh + 4 * M;
  int32_t* h_sstart = mh + 5 * M;
  int32_t* h_slen = mh + 6 * M;
  int32_t* h_sfirst = mh + 7 * M;
  int32_t* h_lrows = mh + 8 * M;
  StepGeometry g;
  SampleRow* h_sample = reinterpret_cast<SampleRow*>(mh + sample_rows_at());
  // Rows whose logits are needed (a token chosen from them, or returned), in order; wants[j] has its
  // logits in row j % w.logit_rows of w.logits and its choice in h_sample[j].
  struct Want {
    size_t chunk_row;
    uint32_t row;
    bool keep;  // the logits go back to the caller
    bool draw;  // the caller takes the chosen token
  };
  std::vector<Want> wants;
  bool all_decode = true, any_restart = false;
  for (size_t i = 0; i < rows.size(); ++i) {
    const model::SlotRows& r = rows[i];
    const uint32_t n = static_cast<uint32_t>(r.tokens.size());
    if (r.start == 0) {
      zero_slot(r.slot);
      any_restart = true;
    }
    h_sslot[g.segments] = static_cast<int32_t>(r.slot);
    h_sstart[g.segments] = static_cast<int32_t>(r.start);
    h_slen[g.segments] = static_cast<int32_t>(n);
    h_sfirst[g.segments] = static_cast<int32_t>(g.rows);
    for (uint32_t t = 0; t < n; ++t) {
      h_tokens[g.rows + t] = r.tokens[t];
      h_slot[g.rows + t] = static_cast<int32_t>(r.slot);
      h_pos[g.rows + t] = static_cast<int32_t>(r.start + t);
      h_first[g.rows + t] = static_cast<int32_t>(g.rows);
    }
    for (uint32_t t = r.logits_all ? 0 : n - 1; t < n; ++t) {
      const bool draw = t + 1 == n && r.sample;
      SampleRow& sr = h_sample[wants.size()];
      sr = SampleRow{};
      sr.logit_row = static_cast<int32_t>(wants.size() % w.logit_rows);
      if (draw) {
        sr.temperature = r.sampling.temperature;
        sr.top_p = r.sampling.top_p;
        sr.min_p = r.sampling.min_p;
        sr.top_k = r.sampling.top_k;
        sr.seed = r.sampling.seed;
        sr.position = r.start + n;
      }
      wants.push_back({i, g.rows + t, r.logits_all || !r.sample, draw});
    }
    if (n != 1 || r.logits_all || !r.sample) all_decode = false;
    g.max_seg_rows = std::max(g.max_seg_rows, n);
    g.rows += n;
    ++g.segments;
  }
  for (size_t j = 0; j < wants.size(); ++j) h_lrows[j] = static_cast<int32_t>(wants[j].row);
  // One copy: everything above, the sampling parameters included.
  const size_t meta_ints = sample_rows_at() + 8 * wants.size();
  FERRY_CUDA(cudaMemcpyAsync(w.meta, mh, meta_ints * sizeof(int32_t), cudaMemcpyHostToDevice, s()));
  g.row = {w.meta + M, w.meta + 2 * M, w.meta + 3 * M};
  g.seg = {w.meta + 4 * M, w.meta + 5 * M, w.meta + 6 * M, w.meta + 7 * M};
  const int32_t* d_lrows = w.meta + 8 * M;
  const SampleRow* d_sample = reinterpret_cast<const SampleRow*>(w.meta + sample_rows_at());
  int32_t* d_sampled = w.meta + sampled_at();
  int32_t* sampled = sampled_host.as<int32_t>();

  // Decode of up to 8 rows, greedy or sampled: one graph per row count, captured on the second
  // sighting (the first runs eagerly and settles lazy initialisation). The graph reads the rows'
  // tokens, positions and sampling parameters from w.meta, and only the chosen tokens come back.
  const bool graphable = opt.graphs && all_decode && !any_restart && g.rows <= kMaxMatvecTokens &&
                         wants.size() == g.rows && g.rows <= w.logit_rows;
  if (graphable) {
    GraphExec& ge = graphs[g.rows];
    if (!ge.ready() && graph_seen[g.rows]++ >= 1) {
      FERRY_CUDA(cudaStreamBeginCapture(s(), cudaStreamCaptureModeThreadLocal));
      try {
        forward(g, w.meta);
        logits(d_lrows, g.rows);
        sample_rows(w.logits, d.V, d_sample, g.rows, d_sampled, s());
      } catch (...) {
        cudaGraph_t broken = nullptr;
        cudaStreamEndCapture(s(), &broken);
        if (broken) cudaGraphDestroy(broken);
        throw;
      }
      ge.end_capture(s());
    }
    if (ge.ready()) {
      ge.launch(s());
    } else {
      forward(g, w.meta);
      logits(d_lrows, g.rows);
      sample_rows(w.logits, d.V, d_sample, g.rows, d_sampled, s());
    }
    FERRY_CUDA(cudaMemcpyAsync(sampled, d_sampled, g.rows * sizeof(int32_t), cudaMemcpyDeviceToHost, s()));
    FERRY_CUDA(cudaStreamSynchronize(s()));
    for (size_t i = 0; i < rows.size(); ++i) out[i].sampled = sampled[i];
    note_peak();
    return;
  }

  forward(g, w.meta);
  // Logits in chunks of w.logit_rows rows, tokens chosen on the device; logits travel to the host
  // only for the rows that return them.
  std::vector<float> host_logits;
  for (size_t j0 = 0; j0 < wants.size(); j0 += w.logit_rows) {
    const uint32_t cnt = static_cast<uint32_t>(std::min<size_t>(w.logit_rows, wants.size() - j0));
    logits(d_lrows + j0, cnt);
    sample_rows(w.logits, d.V, d_sample + j0, cnt, d_sampled, s());
    FERRY_CUDA(cudaMemcpyAsync(sampled, d_sampled, cnt * sizeof(int32_t), cudaMemcpyDeviceToHost, s()));
    const bool any_keep = std::any_of(wants.begin() + j0, wants.begin() + j0 + cnt, [](const Want& x) { return x.keep; });
    if (any_keep) {
      host_logits.resize(static_cast<size_t>(cnt) * d.V);
      FERRY_CUDA(cudaMemcpyAsync(host_logits.data(), w.logits, host_logits.size() * sizeof(float), cudaMemcpyDeviceToHost, s()));
    }
    FERRY_CUDA(cudaStreamSynchronize(s()));
    for (uint32_t j = 0; j < cnt; ++j) {
      const Want& wt = wants[j0 + j];
      model::SlotResult& res = out[wt.chunk_row];
      const float* lg = host_logits.data() + static_cast<size_t>(j) * d.V;
      if (wt.keep) res.logits.insert(res.logits.end(), lg, lg + d.V);
      if (wt.draw) res.sampled = sampled[j];
    }
  }
  note_peak();
}

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaBackend::~CudaBackend() = default;

std::unique_ptr<CudaBackend> CudaBackend::from_weights(const model::Glm5Weights& weights, const CudaBackendOptions& opt) {
  auto impl = std::make_unique<Impl>(weights.hparams(), opt);
  impl->init_device();
  impl->load(weights);
  impl->allocate_state_and_work();
  return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(impl)));
}

std::unique_ptr<CudaBackend> CudaBackend::synthetic(const SyntheticModel& model, const CudaBackendOptions& opt) {
  const std::vector<std::string> problems = model.hparams.validate();
  if (!problems.empty()) throw std::invalid_argument("synthetic model: " + problems.front());
  auto impl = std::make_unique<Impl>(model.hparams, opt);
  impl->init_device();
  impl->make_synthetic(model);
  impl->allocate_state_and_work();
  return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(impl)));
}

const model::Glm5Hparams& CudaBackend::hparams() const { return impl_->hp; }
uint32_t CudaBackend::max_slots() const { return impl_->opt.max_slots; }
uint32_t CudaBackend::max_context() const { return impl_->opt.max_context; }

void CudaBackend::reset_slot(uint32_t slot) {
  if (slot >= impl_->opt.max_slots) throw std::invalid_argument("slot " + std::to_string(slot) + " does not exist");
  impl_->slot_tokens[slot] = 0;
  impl_->zero_slot(slot);
  FERRY_CUDA(cudaStreamSynchronize(impl_->s()));
}

std::vector<model::SlotResult> CudaBackend::step(const std::vector<model::SlotRows>& rows) { return impl_->step(rows); }

std::string CudaBackend::describe() const {
  return "cuda:" + std::to_string(impl_->opt.device) + " " + impl_->name + " (kernels " + impl_->kernels + ", cuBLAS " +
         blas::api().library + ")" + (impl_->synthetic ? " (SYNTHETIC weights)" : "");
}

bool CudaBackend::synthetic_weights() const { return impl_->synthetic; }
std::string CudaBackend::device_name() const { return impl_->name; }

DeviceMemoryReport CudaBackend::memory() const {
  impl_->note_peak();
  return {impl_->weight_bytes, impl_->state_bytes, impl_->work_bytes, impl_->peak_used};
}

uint64_t CudaBackend::decode_bytes_per_token(uint64_t depth) const {
  const Impl& m = *impl_;
  const Dims& z = m.d;
  uint64_t b = m.output.bytes() + m.token_embd.row_bytes + static_cast<uint64_t>(z.D) * 4;
  for (const DevLayer& l : m.layers) {
    for (const DevMatrix* x : {&l.hc_attn_fn, &l.hc_ffn_fn, &l.attn_q, &l.attn_k, &l.attn_v, &l.f_a, &l.f_b, &l.g_a,
                               &l.g_b, &l.beta, &l.attn_output, &l.q_a, &l.q_b, &l.kv_a, &l.k_b, &l.v_b, &l.idx_q_b,
                               &l.idx_k, &l.idx_proj, &l.idx_gate, &l.ffn_gate, &l.ffn_up, &l.ffn_down, &l.router,
                               &l.gate_sh, &l.up_sh, &l.down_sh}) {
      b += x->bytes();
    }
    if (l.ffn == FfnKind::moe) {
      b += static_cast<uint64_t>(z.k) * (l.gate_exps.bytes() + l.up_exps.bytes() + l.down_exps.bytes()) / z.E;
    }
    if (l.kind == LayerKind::kda) {
      b += 2ull * z.kda_nh * z.kda_hd * z.kda_hd * 4;  // recurrent state read and written
    } else {
      const uint64_t kp = std::max<uint32_t>(1, z.kp);
      const uint64_t attended = std::min<uint64_t>(depth + 1, m.hp.index_topk + kp - 1);
      b += attended * z.kvlr * 4;                          // selected latents
      if (l.has_indexer) b += (depth + 1) / kp * z.id * 4;  // pool keys scored
    }
  }
  return b;
}

double measure_copy_bandwidth(int device, uint64_t bytes, int reps) {
  FERRY_CUDA(cudaSetDevice(device));
  DeviceBuffer a(bytes), b(bytes);
  Stream st;
  FERRY_CUDA(cudaMemsetAsync(a.get(), 1, bytes, st.get()));
  for (int i = 0; i < 3; ++i) FERRY_CUDA(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, st.get()));
  std::vector<float> ms;
  Event e0, e1;
  for (int i = 0; i < std::max(reps, 1); ++i) {
    e0.record(st.get());
    FERRY_CUDA(cudaMemcpyAsync(i % 2 ? a.get() : b.get(), i % 2 ? b.get() : a.get(), bytes, cudaMemcpyDeviceToDevice, st.get()));
    e1.record(st.get());
    st.synchronize();
    ms.push_back(e1.since(e0));
  }
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  return 2.0 * static_cast<double>(bytes) / (med * 1e-3);
}

}  // namespace ferry::gpu
