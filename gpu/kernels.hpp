#pragma once
// Host-side entry points of the CUDA kernels (gpu/*.cu). Every function enqueues work on `stream`
// and returns without synchronising; a bad launch throws CudaError. Activations are f32, row-major,
// one row per token. Weights stay in their GGUF block layout on the device (DevMatrix).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/kv_type.hpp"
#include "model/formats/ggml_type.hpp"

namespace ferry::gpu {

// A weight matrix on the device: `rows` rows of `cols` elements, each row `row_bytes` of GGUF blocks.
struct DevMatrix {
  model::GgmlType type = model::GgmlType::F32;
  const uint8_t* data = nullptr;
  uint32_t rows = 0;
  uint32_t cols = 0;
  size_t row_bytes = 0;

  bool empty() const { return data == nullptr; }
  size_t bytes() const { return row_bytes * rows; }
  DevMatrix slice_rows(size_t first, size_t count) const {
    DevMatrix m = *this;
    m.data = data + first * row_bytes;
    m.rows = static_cast<uint32_t>(count);
    return m;
  }
};

// Types the device kernels read (the rest are refused when weights are uploaded).
bool device_supports(model::GgmlType type);

// Copies the IQ lookup grids to the current device; once per device before IQ kernels run.
void upload_quant_tables();
// The current device's copy of the IQ3_S grid (model::kIq3sGrid), for kernels that read IQ3_S blocks.
const uint32_t* iq3s_grid_address();

// The code of this build that the current device runs, as the driver loaded it: "sm_90", or "sm_90 from
// compute_70 PTX" when the driver compiled it from an older architecture's PTX (the Volta build on a
// newer GPU). Throws CudaError when the build has nothing the device can run.
std::string kernel_image();

// Multiprocessors of the current device (asked once per device): launchers size their grids by it.
int current_sm_count();
// The shared memory a block of the current device may opt in to, in bytes (asked once per device).
int current_smem_optin();

// y[t][r] = W[r] . x[t] for one matrix or a batch of groups (heads, experts).
// A further matrix of MatvecArgs::w's type and columns in the same launch: its weights (data, or
// per-group pointers as w_group_ptrs), its output (y's group stride), its input (x's strides; null:
// the same x), its rows, its output's token stride (0: w's, y_tok_stride) and its SwiGLU up input
// (x_up's strides; null: the launch's x_up).
// With `single`, the part is one matrix (data) over the launch's tokens, as a launch of one group
// would run it: the blocks of every group take its rows, no group index, table or skip applies, x and
// y are read and written at group 0 (the MoE layer's shared expert beside the routed experts). Only
// where matvec_quantizes_activations() holds and no groups are named on the device.
struct MatvecPart {
  const uint8_t* data = nullptr;
  const uint8_t* const* group_ptrs = nullptr;
  float* y = nullptr;
  const float* x = nullptr;
  uint32_t rows = 0;
  size_t y_tok_stride = 0;
  const float* x_up = nullptr;
  bool single = false;
  // A single part's own row format where its type is not the launch's (w's): the type and its row
  // bytes (0: w's format), w's columns. Only on the int16 path's dp2a kernel at one token, both types
  // among Q5_K, Q6_K, IQ4_XS and IQ3_S (matvec_quantizes_activations): a shared expert of another
  // type than the routed experts' in their launches.
  model::GgmlType type = model::GgmlType::F32;
  size_t row_bytes = 0;
};
inline constexpr uint32_t kMaxMatvecParts = 4;

struct MatvecArgs {
  DevMatrix w;
  size_t w_group_bytes = 0;             // offset between groups' matrices
  const int32_t* w_group_index = nullptr;  // when set, group g reads matrix w_group_index[g]
  // When set, matrix m starts at w_group_ptrs[m] (device or mapped host memory: an expert in the pool
  // or in the host store) instead of w.data + m * w_group_bytes.
  const uint8_t* const* w_group_ptrs = nullptr;
  const float* x = nullptr;
  size_t x_tok_stride = 0;              // elements between tokens' x
  size_t x_group_stride = 0;            // elements between groups' x (group g uses g / x_group_div)
  uint32_t x_group_div = 1;
  float* y = nullptr;
  size_t y_tok_stride = 0;
  size_t y_group_stride = 0;
  uint32_t tokens = 1;                  // 1..kMaxMatvecTokens
  uint32_t groups = 1;
  bool f32_activations = false;         // keep x in f32 even where the int16 path applies
  // Parts 1.. of a grouped launch (q/k/v, gate/up, the routed and shared experts' gate and up): part
  // p > 0 is more[p - 1].
  uint32_t parts = 1;
  MatvecPart more[kMaxMatvecParts - 1];
  // When set, the input is SwiGLU(x, x_up) as swiglu() computes it (x_up has x's strides): the down
  // projection reads the gate and up products. Only where matvec_quantizes_activations() holds.
  const float* x_up = nullptr;
  float swiglu_limit = 0.0f;
  // Groups whose tokens are named on the device (gpu/moe_decode.hpp: an expert over the rows of a
  // step that chose it), all set or none, only where matvec_quantizes_activations() holds: the
  // launch has min(*group_count, groups) groups, spread over all its blocks; group g has
  // tok_count[g] <= tokens tokens, token t reads x row tok_x[g * tokens + t] (x_tok_stride apart)
  // and writes y row tok_y[g * tokens + t] (y_tok_stride apart); x_group_stride and y_group_stride 0.
  const int32_t* group_count = nullptr;
  const int32_t* tok_count = nullptr;
  const int32_t* tok_x = nullptr;
  const int32_t* tok_y = nullptr;
  // On the int16 path, a group whose w_group_index is negative does nothing (a route the launch above
  // takes instead).
  bool skip_negative_index = false;
};
inline constexpr uint32_t kMaxMatvecTokens = 8;
void matvec(const MatvecArgs& a, cudaStream_t stream);
// Whether matvec() quantizes this call's activations to int16 (Q4_K, Q5_K, Q6_K, IQ4_XS or IQ3_S
// weights in rows of whole 256-blocks, whose inputs fit in shared memory): each x is then rounded
// to a multiple of amax/32767 of its 32-value block.
bool matvec_quantizes_activations(const MatvecArgs& a);

// Dequantises rows [row0, row0 + rows) of `w` into dst (row-major fp16, rows dst_ld apart; 0: `cols`).
// With dst_lo, also the rounding remainder times 2^12 (hi + lo/4096 holds ~22 significant bits): the
// prefill GEMMs add the products with it so that they match f32 arithmetic.
void dequantize_to_half(const DevMatrix& w, size_t row0, size_t rows, void* dst_half, cudaStream_t stream,
                        void* dst_lo = nullptr, size_t dst_ld = 0);
inline constexpr float kHalfLoScale = 4096.0f;
// ---- The e4m3 corrections of the prefill products (sm89+, LayerRunner::mm_staged; half_split.cuh's scale) ----
// Whether this device and build run them: compute capability 8.9 or newer and the conversions' code built for it.
bool e4m3_split_ready();
// Rows [row0, row0 + rows) of `w` as each row's fp16 hi values (dequantize_to_half's), then its e4m3 values, then
// its e4m3 lo parts (rows dst_ld = 2 cols halves apart), times one power of two from the rows' largest |value|
// (found first into *amax unless amax_known: a previous call's for the same rows), its inverse into *descale.
// False, with nothing launched, for types or rows without the pieces kernel.
bool dequantize_to_e4m3_split(const DevMatrix& w, size_t row0, size_t rows, void* dst, size_t dst_ld, uint32_t* amax,
                              float* descale, bool amax_known, cudaStream_t stream);
// The e4m3 form of an fp16 split staged as mm_staged's input rows (`rows` of [lo | hi], `cols` each, ld halves
// apart): dst rows of 2 cols bytes, [lo | hi] times one power of two from the hi values' largest |value| (its
// inverse into *descale; *amax is scratch). cols a multiple of 8, pointers 16-byte aligned.
void half_split_to_e4m3(const void* src, size_t ld, size_t rows, size_t cols, void* dst, uint32_t* amax, float* descale,
                        cudaStream_t stream);
// Dequantises to f32 (tests and the embedding lookup).
void dequantize_to_float(const DevMatrix& w, size_t row0, size_t rows, float* dst, cudaStream_t stream);
// dst[i][c] = src[i][c] as fp16 for i < rows, c < cols (src rows `src_stride` apart, dst rows dst_ld
// apart; 0: `cols`); dst_lo as above.
void float_to_half(const float* src, size_t src_stride, size_t rows, size_t cols, void* dst_half, cudaStream_t stream,
                   void* dst_lo = nullptr, size_t dst_ld = 0);
// float_to_half over `groups` column blocks of each source row, each its own output row: output row r * groups + g
// is the `cols` values at src + r * src_stride + g * group_stride (LayerRunner::mm_grouped's heads).
void float_to_half_groups(const float* src, size_t src_stride, size_t group_stride, size_t rows, uint32_t groups,
                          size_t cols, void* dst_half, cudaStream_t stream, void* dst_lo = nullptr, size_t dst_ld = 0);

}  // namespace ferry::gpu

namespace ferry::gpu {

// Per-row bookkeeping of a step, on the device: rows of one slot form a segment of consecutive
// positions [seg_start, seg_start + seg_len).
struct RowInfo {
  const int32_t* slot = nullptr;       // [rows]
  const int32_t* pos = nullptr;        // [rows] position of the row in its slot's sequence
  const int32_t* seg_first_row = nullptr;  // [rows] the first row of the row's segment
};
struct SegInfo {
  const int32_t* slot = nullptr;       // [segments]
  const int32_t* start = nullptr;      // [segments] first position
  const int32_t* len = nullptr;        // [segments] rows
  const int32_t* first_row = nullptr;  // [segments]
};

// ---- element-wise and per-row ops (gpu/ops.cu) ----
// dst[i][c*D + d] = token_embd[tokens[i]][d] for c < copies (the mHC streams start equal).
void embed_rows(const DevMatrix& embd, const int32_t* tokens, uint32_t rows, float* dst, uint32_t copies,
                cudaStream_t stream);
// out[i] = x[i] * rsqrt(mean(x[i]^2) + eps) * w   (w may be null); rows `stride` apart, in == out allowed.
void rms_norm(const float* x, size_t x_stride, const float* w, uint32_t rows, uint32_t n, float eps, float* out,
              size_t out_stride, cudaStream_t stream);
// (x - mean) * rsqrt(var + eps) * w + b over n, per row.
void layer_norm(const float* x, size_t x_stride, const float* w, const float* b, uint32_t rows, uint32_t n, float eps,
                float* out, size_t out_stride, cudaStream_t stream);

struct MhcArgs {
  const float* streams = nullptr;  // [rows][H*D]
  const float* mix = nullptr;      // [rows][(2+H)*H]: fn @ streams (before the 1/rms of the input norm)
  const float* base = nullptr;     // [(2+H)*H]
  const float* scale = nullptr;    // [3]
  const float* norm_w = nullptr;   // [D]: the sublayer's input RMSNorm weight
  uint32_t rows = 0, H = 0, D = 0, iters = 0;
  float rms_eps = 1e-5f, hc_eps = 1e-6f;
  float* x = nullptr;              // [rows][D]: rmsnorm(sum_h pre[h] * streams[h]) * norm_w
  float* post = nullptr;           // [rows][H]
  float* comb = nullptr;           // [rows][H*H]
};
void mhc_pre(const MhcArgs& a, cudaStream_t stream);
// streams[h'] = post[h'] * y + sum_h comb[h][h'] * streams[h], in place.
void mhc_post(float* streams, const float* y, const float* post, const float* comb, uint32_t rows, uint32_t H,
              uint32_t D, cudaStream_t stream);
// out[j] = rmsnorm(mean_h streams[rows_idx[j]][h]) * w  for j < n.
void hc_head(const float* streams, const int32_t* rows_idx, uint32_t n, uint32_t H, uint32_t D, const float* w,
             float eps, float* out, cudaStream_t stream);

// gate[i] = silu(min(gate[i], L)) * clamp(up[i], -L, L) over rows x n (rows `stride` apart).
void swiglu(float* gate, const float* up, size_t stride, uint32_t rows, uint32_t n, float limit, cudaStream_t stream);
// swiglu()'s values over rows of n laid end to end, written as the fp16 split of LayerRunner::mm_staged's input
// (half_split.cuh: row i's lo values, then its hi values, rows 2 n apart) instead of over gate. False (nothing
// launched) where n is not a multiple of 8 or a pointer not 16-byte aligned.
bool swiglu_split(const float* gate, const float* up, uint32_t rows, uint32_t n, float limit, void* lo_hi,
                  cudaStream_t stream);

struct RouterArgs {
  const float* logits = nullptr;  // [rows][E]
  const float* bias = nullptr;    // [E] e_score_correction_bias
  uint32_t rows = 0, E = 0, k = 0, n_group = 1, topk_group = 1;
  bool norm_topk_prob = true;
  float scaling = 1.0f;
  int32_t* ids = nullptr;         // [rows][k]
  float* weights = nullptr;       // [rows][k]
};
void moe_route(const RouterArgs& a, cudaStream_t stream);
// y[r] = shared[r] + sum_j weights[r][j] * expert_out[slot(r, j)], slot = where ? where[r*k+j] : r*k+j.
void moe_combine(const float* expert_out, const int32_t* where, const float* weights, const float* shared,
                 uint32_t rows, uint32_t k, uint32_t D, float* y, cudaStream_t stream);
// counts[ids[i]] += 1 for i < n (the routes of a step, per expert).
void count_routes(const int32_t* ids, uint32_t n, uint32_t* counts, cudaStream_t stream);
// table[index] = value, in stream order (a pointer of an expert table, set without a host buffer).
void set_table_entry(const uint8_t** table, uint32_t index, const uint8_t* value, cudaStream_t stream);

// Writes rows' vectors into a per-slot cache of `ctx` rows per slot, a ring:
// cache[(slot*ctx + pos % ctx)*width + c] = src[i*src_stride + c].
void scatter_to_cache(const float* src, size_t src_stride, RowInfo rows, uint32_t n_rows, uint32_t width,
                      uint32_t ctx, float* cache, cudaStream_t stream);

// ---- KDA (gpu/kda.cu) ----
struct KdaArgs {
  RowInfo row;
  SegInfo seg;
  uint32_t rows = 0, segments = 0;
  uint32_t heads = 0, head_dim = 0, kernel = 4;
  float* qkv = nullptr;             // [rows][3C] projections in, convolved + activated + normalised out
  float* qkv_raw = nullptr;         // [rows][3C] scratch: the projections as they came
  const float* conv_w = nullptr;    // [3C][kernel]
  float* conv_state = nullptr;      // [slots][3C][kernel-1]
  const float* f = nullptr;         // [rows][C] f_b(f_a(x))
  const float* dt_bias = nullptr;   // [C]
  const float* a = nullptr;         // [heads] ssm_a = -exp(A_log)
  float lower_bound = -5.0f;
  const float* beta = nullptr;      // [rows][heads] b_proj(x), before the sigmoid
  float* state = nullptr;           // [slots][heads][head_dim][head_dim]
  float* out = nullptr;             // [rows][C]
  bool skip_chunked = false;        // kda_recurrent leaves the segments kda_chunked ran (gpu/kda_chunked.hpp)
};
void kda_conv(const KdaArgs& a, cudaStream_t stream);
// kda_conv's two ways, the same bits: one launch of a warp per (segment, head) for decode rows (up to
// kMaxMatvecTokens); otherwise a warp per (group of rows, head), then the state's update.
void kda_conv_decode(const KdaArgs& a, cudaStream_t stream);
void kda_conv_rows(const KdaArgs& a, cudaStream_t stream);
void kda_recurrent(const KdaArgs& a, cudaStream_t stream);
// out[i][h] = rmsnorm(o[i][h]) * w * sigmoid(gate[i][h]) per head of `head_dim`.
void gated_rms_norm(const float* o, const float* gate, const float* w, uint32_t rows, uint32_t heads,
                    uint32_t head_dim, float eps, float* out, cudaStream_t stream);
// gated_rms_norm's values as the fp16 split of LayerRunner::mm_staged's input (half_split.cuh): row i's lo values,
// then its hi values, rows 2 * heads * head_dim apart. Head dims up to 128.
void gated_rms_norm_split(const float* o, const float* gate, const float* w, uint32_t rows, uint32_t heads,
                          uint32_t head_dim, float eps, void* lo_hi, cudaStream_t stream);

// ---- DSA (gpu/dsa.cu) ----
struct IndexerArgs {
  RowInfo row;
  SegInfo seg;
  uint32_t rows = 0, segments = 0, max_rows_per_segment = 0;
  uint32_t heads = 0, head_dim = 0, kpool = 1, topk = 0, ctx = 0;
  bool select_tail = true;
  uint32_t key_rows = 0;              // rows per slot of kk_cache and gate_cache, a ring (position % key_rows)
  const float* kk_cache = nullptr;    // [slots][key_rows][head_dim]
  const float* gate_cache = nullptr;  // [slots][key_rows][head_dim]
  const float* ape = nullptr;         // [kpool][head_dim]
  float* pool_cache = nullptr;        // [slots][ctx/kpool][head_dim]
  const float* q = nullptr;           // [rows][heads*head_dim]
  const float* w = nullptr;           // [rows][heads] weights_proj(x) (scaled here)
  float* scores = nullptr;            // [rows][ctx/kpool] scratch
  int32_t* tokens = nullptr;          // [rows][max_tokens] selected positions out
  int32_t* counts = nullptr;          // [rows]
  uint32_t max_tokens = 0;            // topk + kpool - 1 (or more)
  // Device memory free while the selection runs; decode steps deeper than 8,192 pools select in two
  // launches through it when it is large enough (gpu/indexer_decode.hpp), else in one.
  void* select_scratch = nullptr;
  size_t select_scratch_bytes = 0;
  // Decode steps: a slot whose rows select every visible pool (at most topk / kpool of them) gets no
  // scores (gpu/indexer_decode.hpp); the selection is the same.
  bool skip_whole_selections = false;
};
void indexer_pool_keys(const IndexerArgs& a, cudaStream_t stream);
// Throws unless the key ring holds what a segment's new pools read (kpool - 1 rows before it, to its end).
void check_pool_ring(const IndexerArgs& a);
// a.tokens / a.counts of every row (gpu/dsa.cu's selection rule): decode steps on gpu/indexer_decode.hpp's
// kernels, prefill rows' scores on tensor cores (gpu/indexer_prefill.hpp) where they apply, else the
// per-row kernels, then the selection on a block a row (indexer_select_rows).
void indexer_select(const IndexerArgs& a, cudaStream_t stream);

struct SparseMlaArgs {
  RowInfo row;
  uint32_t rows = 0, heads = 0, rank = 0, ctx = 0, max_tokens = 0;
  float scale = 1.0f;
  const float* q_lat = nullptr;      // [rows][heads][rank]
  const void* latents = nullptr;     // [slots][ctx][rank] in latent_type (config/kv_type.hpp)
  const float* latent_scales = nullptr;  // int8: [slots][ctx]
  config::KvType latent_type = config::KvType::f32;
  const int32_t* tokens = nullptr;   // [rows][max_tokens]
  const int32_t* counts = nullptr;   // [rows]
  float* out = nullptr;              // [rows][heads][rank]
  // Scratch for splitting a row's selection over several blocks (decode): partial_rows (row, split)
  // slots of heads x (rank + 2) floats; without it every block walks its whole selection.
  float* partial = nullptr;
  uint32_t partial_rows = 0;
  // Rows the split count is chosen for (0: rows): a step attended in groups of its rows (the resident
  // window) splits each row as the whole step would, so that its sums run in the same order.
  uint32_t split_rows = 0;
};
void sparse_mla(const SparseMlaArgs& a, cudaStream_t stream);
// Rows of `src` (the step's new latents) into the latent cache in `type` (kv/kv_codec.hpp: the CPU
// backend's encoding, bit for bit from the same floats): row r at slot * ctx + position, or at row r
// when `rows` has no slots (a staging buffer).
void store_latents(const float* src, size_t src_stride, RowInfo rows, uint32_t n_rows, uint32_t width, uint32_t ctx,
                   config::KvType type, void* cache, float* scales, cudaStream_t stream);

// ---- sampling (gpu/sampling.cu) ----
// One row to choose a token for, in device memory: the host writes these with a step's other inputs,
// so a captured graph reads each step's parameters.
struct SampleRow {
  int32_t logit_row = 0;       // row of `logits`
  float temperature = 0.0f;    // <= 0: argmax (ties: the lowest id)
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint32_t top_k = 0;
  uint32_t position = 0;       // of the token drawn
  uint64_t seed = 0;
};
// out[j] = the token model::sample_token chooses from logits row rows[j].logit_row with rows[j]'s
// parameters, bit for bit the same (vocab <= 2^31). Each row runs on as many blocks as its vocabulary
// needs (gpu/sampling_grid.cu), in `scratch`: sample_scratch_bytes() of device memory, zeroed once
// when allocated, which every launch leaves zeroed again; one stream at a time may use it.
size_t sample_scratch_bytes();
void sample_rows(const float* logits, uint32_t vocab, const SampleRow* rows, uint32_t n, int32_t* out, void* scratch,
                 cudaStream_t stream);
// Where the last many-block launch on `scratch` spent its time: the SM clock of its first block at
// each phase mark (gpu/sampling_grid.cu says where they are). Read by the timing tests, after the
// launch has finished.
struct SamplePhases {
  std::vector<uint64_t> clocks;
};
SamplePhases sample_phases(const void* scratch);
// The same tokens, one thread block per row (gpu/sampling.cu): what sample_rows does for a
// vocabulary beyond what the device holds at once on many blocks.
void sample_rows_by_block(const float* logits, uint32_t vocab, const SampleRow* rows, uint32_t n, int32_t* out,
                          cudaStream_t stream);

}  // namespace ferry::gpu

namespace ferry::gpu {
// ---- synthetic weights (gpu/synthetic.cu) ----
// Fills `rows` rows of a matrix of `type` with deterministic pseudo-random blocks whose values spread
// about +-amplitude (centred), from (seed, tensor_id). F32/F16/BF16 rows hold uniform values.
void synth_fill(model::GgmlType type, uint8_t* data, size_t rows, uint32_t cols, size_t row_bytes, uint64_t seed,
                uint64_t tensor_id, float amplitude, cudaStream_t stream);
// The tensor_id of a synthetic tensor (role, block; -1 for whole-model ones) or of one routed expert
// of it: wherever the tensor or the expert is made, its bytes are the same.
inline uint64_t synthetic_tensor_id(uint8_t role, int32_t layer, uint32_t expert) {
  return (uint64_t{role} + 1) << 48 | (static_cast<uint64_t>(int64_t{layer} + 1) << 24) | (uint64_t{expert} + 1);
}
}  // namespace ferry::gpu
