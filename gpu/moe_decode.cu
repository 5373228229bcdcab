#include "gpu/moe_decode.hpp"

#include <cuda_runtime.h>

#include <string>

#include "gpu/cuda_check.hpp"
#include "gpu/decode_fusion.hpp"

namespace ferry::gpu {
namespace {

// One thread a route: how many routes of the step chose its expert, its rank among the earlier ones,
// and where that puts it (single, or token rank % tokens of a group that every `tokens` routes of an
// expert start). Routes are few (<= 8 rows x k), so each thread scans them all in shared memory.
__global__ void share_routes_kernel(const int32_t* ids, uint32_t routes, uint32_t k, int32_t tokens, SharedRoutes s) {
  extern __shared__ int32_t sh[];
  int32_t* s_id = sh;                 // [routes]
  int32_t* s_rank = sh + routes;      // [routes] earlier routes of the same expert
  int32_t* s_size = sh + 2 * routes;  // [routes] the size of the group a route starts, else 0
  const uint32_t i = threadIdx.x;
  int32_t id = -1, rank = 0, total = 0;
  if (i < routes) s_id[i] = id = ids[i];
  __syncthreads();
  if (i < routes) {
    for (uint32_t j = 0; j < routes; ++j) {
      const bool same = s_id[j] == id;
      total += same ? 1 : 0;
      rank += same && j < i ? 1 : 0;
    }
    s_rank[i] = rank;
    s_size[i] = total >= 2 && rank % tokens == 0 ? min(tokens, total - rank) : 0;
    s.single[i] = total == 1 ? id : -1;
  }
  const int groups = __syncthreads_count(i < routes && total >= 2 && rank % tokens == 0);
  if (i == 0) *s.count = groups;
  if (i >= routes || total < 2) return;
  const int32_t t = rank % tokens, lead_rank = rank - t;
  uint32_t lead = i;
  for (uint32_t j = 0; j < i; ++j) {
    if (s_id[j] == id && s_rank[j] == lead_rank) lead = j;
  }
  int32_t group = 0;
  for (uint32_t j = 0; j < lead; ++j) group += s_size[j] > 0 ? 1 : 0;
  if (t == 0) {
    s.expert[group] = id;
    s.tokens[group] = s_size[i];
  }
  const size_t at = static_cast<size_t>(group) * tokens + t;
  s.tok_x[at] = static_cast<int32_t>(i / k);
  s.tok_y[at] = static_cast<int32_t>(i);
}

MatvecArgs gate_args(const DecodeExperts& a) {
  MatvecArgs m;
  m.w = a.gate;
  m.w_group_bytes = a.gate.bytes();
  m.w_group_ptrs = a.tables[0];
  m.x = a.x;
  m.y = a.eg;
  return m;
}

MatvecArgs down_args(const DecodeExperts& a) {
  MatvecArgs m;
  m.w = a.down;
  m.w_group_bytes = a.down.bytes();
  m.w_group_ptrs = a.tables[2];
  m.y = a.eo;
  return m;
}

// Route i = r * k + j: x row r, gate/up row i, output row i.
MatvecArgs per_route_gate(const DecodeExperts& a, const int32_t* ids) {
  MatvecArgs m = gate_args(a);
  m.w_group_index = ids;
  m.x_group_stride = a.gate.cols;
  m.x_group_div = a.k;
  m.y_group_stride = a.gate.rows;
  m.groups = a.rows * a.k;
  return m;
}
MatvecArgs per_route_down(const DecodeExperts& a, const int32_t* ids) {
  MatvecArgs d = down_args(a);
  d.w_group_index = ids;
  d.x_group_stride = a.gate.rows;
  d.y_group_stride = a.down.rows;
  d.groups = a.rows * a.k;
  return d;
}

// A shared expert's group: its tokens named by `r` (x rows of the gate, then the routes' rows).
void name_tokens(MatvecArgs& m, const SharedRoutes& r, uint32_t tokens, uint32_t routes, const int32_t* tok_x) {
  m.w_group_index = r.expert;
  m.group_count = r.count;
  m.tok_count = r.tokens;
  m.tok_x = tok_x;
  m.tok_y = r.tok_y;
  m.tokens = tokens;
  m.groups = routes;  // at most one group a route; the device count says how many there are
}
MatvecArgs shared_gate(const DecodeExperts& a, const SharedRoutes& r, uint32_t tokens) {
  MatvecArgs m = gate_args(a);
  name_tokens(m, r, tokens, a.rows * a.k, r.tok_x);
  m.x_tok_stride = a.gate.cols;
  m.y_tok_stride = a.gate.rows;
  return m;
}
MatvecArgs shared_down(const DecodeExperts& a, const SharedRoutes& r, uint32_t tokens) {
  MatvecArgs d = down_args(a);
  name_tokens(d, r, tokens, a.rows * a.k, r.tok_y);
  d.x_tok_stride = a.gate.rows;
  d.y_tok_stride = a.down.rows;
  return d;
}

// Gate and up as the parts of one launch where their shapes agree (gpu/decode_fusion.hpp), else one
// launch each.
void gate_and_up(MatvecArgs m, const DecodeExperts& a, cudaStream_t stream) {
  const MatvecPart up_part{a.up.data, a.tables[1], a.eu};
  if (same_matrix_shape(a.gate, a.up)) {
    m.parts = 2;
    m.more[0] = up_part;
    matvec(m, stream);
    return;
  }
  matvec(m, stream);
  m.w = a.up;
  m.w_group_bytes = a.up.bytes();
  m.w_group_ptrs = up_part.group_ptrs;
  m.y = a.eu;
  matvec(m, stream);
}

void down(MatvecArgs d, const DecodeExperts& a, cudaStream_t stream) {
  matvec_swiglu(d, a.eg, a.eu, a.gate.rows, a.rows * a.k, a.gate.rows, a.swiglu_limit, stream);
}

// Whether every launch of the shared path takes the int16 kernel (the only one that names tokens
// and skips groups): the per-route ones at one token, the shared ones at `tokens`.
bool int16_throughout(const DecodeExperts& a, uint32_t tokens) {
  const SharedRoutes r{};  // matvec_quantizes_activations looks at types, sizes and x's alignment only
  MatvecArgs g[2] = {per_route_gate(a, a.ids), shared_gate(a, r, tokens)};
  MatvecArgs d[2] = {per_route_down(a, a.ids), shared_down(a, r, tokens)};
  for (int i = 0; i < 2; ++i) {
    MatvecArgs u = g[i];
    u.w = a.up;
    d[i].x = a.eg;
    d[i].x_up = a.eu;
    if (!matvec_quantizes_activations(g[i]) || !matvec_quantizes_activations(u) || !matvec_quantizes_activations(d[i])) {
      return false;
    }
  }
  return true;
}

// The shared expert's matrix w as a single part (MatvecPart::single) into y, in its own row format
// where that is not `routed`'s.
MatvecPart single_part(const DevMatrix& w, float* y, const DevMatrix& routed) {
  MatvecPart p;
  p.data = w.data;
  p.y = y;
  p.rows = w.rows;
  p.single = true;
  if (!same_row_format(w, routed)) p.type = w.type, p.row_bytes = w.row_bytes;
  return p;
}

// The routed experts' gate and up with the shared expert's as parts 2 and 3.
MatvecArgs routed_and_shared_gate_up(const DecodeExperts& a) {
  MatvecArgs m = per_route_gate(a, a.ids);
  m.parts = 4;
  m.more[0] = {a.up.data, a.tables[1], a.eu};
  m.more[1] = single_part(a.shared_gate, a.sg, a.gate);
  m.more[2] = single_part(a.shared_up, a.su, a.gate);
  return m;
}

}  // namespace

void fused_gate_up(const DecodeExperts& a, cudaStream_t stream) {
  const MatvecArgs m = routed_and_shared_gate_up(a);
  if (matvec_quantizes_activations(m)) {
    matvec(m, stream);
    return;
  }
  const MatvecProduct shared[] = {{&a.shared_gate, a.sg}, {&a.shared_up, a.su}};
  matvec_products(shared, 2, a.x, a.gate.cols, 1, a.shared_gate.rows, stream);
  gate_and_up(per_route_gate(a, a.ids), a, stream);
}

MatvecArgs fused_down(const DecodeExperts& a) {
  MatvecArgs d = per_route_down(a, a.ids);
  d.x = a.eg;
  d.x_up = a.eu;
  d.swiglu_limit = a.swiglu_limit;
  d.parts = 2;
  d.more[0] = single_part(a.shared_down, a.sh, a.down);
  d.more[0].x = a.sg;
  d.more[0].x_up = a.su;
  return d;
}

bool shared_expert_fused(const DecodeExperts& a) {
  if (a.rows != 1 || a.k == 0 || a.shared_gate.empty() || a.sg == nullptr || a.su == nullptr || a.sh == nullptr) {
    return false;
  }
  // The shared expert's matrices in the routed ones' row format or, where the dp2a kernel takes
  // both types in one launch, in their own (MatvecPart::type); a shared gate and up that the routed
  // launch cannot take are a launch of their own (fused_gate_up; the user's mix on the tensor-core
  // kernel: IQ3_S routed gate and up, a Q5_K shared expert).
  if (!same_matrix_shape(a.gate, a.up) || a.shared_gate.cols != a.gate.cols || a.shared_up.cols != a.gate.cols ||
      a.shared_down.cols != a.down.cols || a.shared_up.rows != a.shared_gate.rows ||
      a.shared_down.cols != a.shared_gate.rows) {
    return false;
  }
  return matvec_quantizes_activations(fused_down(a)) &&
         (matvec_quantizes_activations(routed_and_shared_gate_up(a)) || same_row_format(a.shared_gate, a.shared_up));
}

void decode_experts_per_route(const DecodeExperts& a, cudaStream_t stream) {
  if (shared_expert_fused(a)) {
    fused_gate_up(a, stream);
    matvec(fused_down(a), stream);
    return;
  }
  gate_and_up(per_route_gate(a, a.ids), a, stream);
  down(per_route_down(a, a.ids), a, stream);
}

uint32_t shared_expert_tokens(const DecodeExperts& a) {
  if (a.rows < 2 || a.rows > kMaxMatvecTokens || a.k == 0) return 0;
  if (a.up.rows != a.gate.rows || a.down.cols != a.gate.rows) return 0;
  for (const uint32_t tokens : {a.rows == 2 ? 2u : 4u, 2u}) {
    if (int16_throughout(a, tokens)) return tokens;
  }
  return 0;
}

SharedRoutes shared_routes(int32_t* scratch, uint32_t routes, uint32_t tokens) {
  const size_t tok = size_t{routes} * tokens;
  int32_t* p = scratch + 1;
  return {scratch, p, p + routes, p + 2 * size_t{routes}, p + 3 * size_t{routes}, p + 3 * size_t{routes} + tok};
}

void share_routes(const int32_t* ids, uint32_t rows, uint32_t k, uint32_t tokens, int32_t* scratch,
                  cudaStream_t stream) {
  const uint32_t routes = rows * k;
  if (routes == 0 || routes > 1024 || tokens < 2 || tokens > kMaxMatvecTokens) {
    throw CudaError("share_routes: " + std::to_string(routes) + " routes at " + std::to_string(tokens) +
                    " tokens a group (1 to 1024 routes, 2 to 8 tokens)");
  }
  const uint32_t threads = (routes + 31) / 32 * 32;
  share_routes_kernel<<<1, threads, 3 * routes * sizeof(int32_t), stream>>>(
      ids, routes, k, static_cast<int32_t>(tokens), shared_routes(scratch, routes, tokens));
  FERRY_CUDA_LAUNCHED();
}

void decode_experts_shared(const DecodeExperts& a, uint32_t tokens, int32_t* scratch, cudaStream_t stream) {
  const uint32_t routes = a.rows * a.k;
  share_routes(a.ids, a.rows, a.k, tokens, scratch, stream);
  const SharedRoutes r = shared_routes(scratch, routes, tokens);
  // The routes of experts one row chose on the 1-token kernel; the groups of shared experts apart.
  MatvecArgs g = per_route_gate(a, r.single);
  g.skip_negative_index = true;
  gate_and_up(g, a, stream);
  gate_and_up(shared_gate(a, r, tokens), a, stream);
  MatvecArgs d = per_route_down(a, r.single);
  d.skip_negative_index = true;
  down(d, a, stream);
  down(shared_down(a, r, tokens), a, stream);
}

}  // namespace ferry::gpu
