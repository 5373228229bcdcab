#include "gpu/moe_decode.hpp"

#include <cuda_runtime.h>

#include <initializer_list>
#include <string>

#include "gpu/cuda_check.hpp"
#include "gpu/decode_fusion.hpp"

namespace ferry::gpu {
namespace {

// One thread a route: its rank among the earlier routes of its expert, the group that rank falls in
// (every `tokens` routes of an expert start a group), and its slot. Routes are few (<= 8 rows x k),
// so each thread scans them all in shared memory.
__global__ void group_routes_kernel(const int32_t* ids, uint32_t routes, uint32_t k, int32_t tokens, RouteGroups g,
                                    int32_t* where) {
  extern __shared__ int32_t sh[];
  int32_t* s_id = sh;                 // [routes]
  int32_t* s_rank = sh + routes;      // [routes] earlier routes of the same expert
  int32_t* s_size = sh + 2 * routes;  // [routes] the size of the group a route starts, else 0
  const uint32_t i = threadIdx.x;
  if (i < routes) {
    s_id[i] = ids[i];
    g.expert[i] = 0;
    g.count[i] = 0;
  }
  __syncthreads();
  int32_t rank = 0, total = 0;
  if (i < routes) {
    for (uint32_t j = 0; j < routes; ++j) {
      const bool same = s_id[j] == s_id[i];
      total += same ? 1 : 0;
      rank += same && j < i ? 1 : 0;
    }
    s_rank[i] = rank;
    s_size[i] = rank % tokens == 0 ? min(tokens, total - rank) : 0;
  }
  __syncthreads();
  if (i >= routes) return;
  const int32_t t = rank % tokens, lead_rank = rank - t;
  uint32_t lead = i;
  for (uint32_t j = 0; j < i; ++j) {
    if (s_id[j] == s_id[i] && s_rank[j] == lead_rank) lead = j;
  }
  int32_t group = 0, start = 0;
  for (uint32_t j = 0; j < lead; ++j) {
    if (s_size[j] > 0) {
      ++group;
      start += s_size[j];
    }
  }
  if (t == 0) {
    g.expert[group] = s_id[i];
    g.count[group] = s_size[i];
  }
  const size_t at = static_cast<size_t>(group) * tokens + t;
  g.tok_x[at] = static_cast<int32_t>(i / k);
  g.tok_y[at] = start + t;
  where[i] = start + t;
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

}  // namespace

void decode_experts_per_route(const DecodeExperts& a, cudaStream_t stream) {
  const uint32_t I = a.gate.rows, D = a.down.rows;
  MatvecArgs m = gate_args(a);
  m.w_group_index = a.ids;
  m.x_group_stride = a.gate.cols;
  m.x_group_div = a.k;
  m.y_group_stride = I;
  m.groups = a.rows * a.k;
  gate_and_up(m, a, stream);
  MatvecArgs d = down_args(a);
  d.w_group_index = a.ids;
  d.x_group_stride = I;
  d.y_group_stride = D;
  d.groups = a.rows * a.k;
  matvec_swiglu(d, a.eg, a.eu, I, a.rows * a.k, I, a.swiglu_limit, stream);
}

uint32_t grouped_expert_tokens(const DecodeExperts& a) {
  if (a.rows < 2 || a.rows > kMaxMatvecTokens || a.k == 0) return 0;
  const auto fits = [&](uint32_t tokens) {
    MatvecArgs g = gate_args(a);
    g.x_tok_stride = a.gate.cols;
    g.tokens = tokens;
    MatvecArgs u = g;
    u.w = a.up;
    MatvecArgs d = down_args(a);
    d.x = a.eg;
    d.x_up = a.eu;
    d.x_tok_stride = a.gate.rows;
    d.tokens = tokens;
    return matvec_quantizes_activations(g) && matvec_quantizes_activations(u) && matvec_quantizes_activations(d) &&
           a.up.rows == a.gate.rows && a.down.cols == a.gate.rows;
  };
  for (uint32_t tokens : {a.rows, 4u, 2u}) {
    if (tokens <= a.rows && fits(tokens)) return tokens;
  }
  return 0;
}

RouteGroups route_groups(int32_t* scratch, uint32_t routes, uint32_t tokens) {
  const size_t tok = size_t{routes} * tokens;
  return {scratch, scratch + routes, scratch + 2 * size_t{routes}, scratch + 2 * size_t{routes} + tok};
}

void group_routes(const int32_t* ids, uint32_t rows, uint32_t k, uint32_t tokens, int32_t* scratch, int32_t* where,
                  cudaStream_t stream) {
  const uint32_t routes = rows * k;
  if (routes == 0) return;
  if (routes > 1024 || tokens == 0 || tokens > kMaxMatvecTokens) {
    throw CudaError("group_routes: " + std::to_string(routes) + " routes at " + std::to_string(tokens) +
                    " tokens a group (at most 1024 routes, 1 to 8 tokens)");
  }
  const uint32_t threads = (routes + 31) / 32 * 32;
  group_routes_kernel<<<1, threads, 3 * routes * sizeof(int32_t), stream>>>(
      ids, routes, k, static_cast<int32_t>(tokens), route_groups(scratch, routes, tokens), where);
  FERRY_CUDA_LAUNCHED();
}

void decode_experts_grouped(const DecodeExperts& a, uint32_t tokens, int32_t* scratch, int32_t* where,
                            cudaStream_t stream) {
  const uint32_t routes = a.rows * a.k;
  group_routes(a.ids, a.rows, a.k, tokens, scratch, where, stream);
  const RouteGroups rg = route_groups(scratch, routes, tokens);
  MatvecArgs m = gate_args(a);
  m.w_group_index = rg.expert;
  m.tok_count = rg.count;
  m.tok_x = rg.tok_x;
  m.tok_y = rg.tok_y;
  m.tokens = tokens;
  m.groups = routes;  // at most one group a route; those past the last do nothing
  m.x_tok_stride = a.gate.cols;
  m.y_tok_stride = a.gate.rows;
  gate_and_up(m, a, stream);
  // The down projection over SwiGLU(gate, up) of the slots, into the same slots of eo.
  MatvecArgs d = down_args(a);
  d.w_group_index = rg.expert;
  d.tok_count = rg.count;
  d.tok_x = rg.tok_y;
  d.tok_y = rg.tok_y;
  d.tokens = tokens;
  d.groups = routes;
  d.x_tok_stride = a.gate.rows;
  d.y_tok_stride = a.down.rows;
  matvec_swiglu(d, a.eg, a.eu, a.gate.rows, routes, a.gate.rows, a.swiglu_limit, stream);
}

}  // namespace ferry::gpu
