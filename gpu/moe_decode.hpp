#pragma once
// The routed experts of a decode step (up to kMaxMatvecTokens rows, k routes each). Per route, one
// matvec group per (row, expert): an expert that two rows chose is read twice. Grouped, the step's
// routes are grouped by expert on the device (group_routes) and each expert's gate, up and down run
// once over all the rows routed to it (int16 matvec with 2-8 tokens named by MatvecArgs::tok_*):
// its weights are read once a step. Both give each route's output the same bits (the int16 kernel
// sums a token's products in the same lanes and order whatever the token count); they differ in
// where it lands, the `where` that moe_combine reads.
#include <cstdint>

#include "gpu/kernels.hpp"

namespace ferry::gpu {

struct DecodeExperts {
  DevMatrix gate, up, down;                            // expert 0's (rows I, I, D); the others follow
  const uint8_t* const* tables[3] = {nullptr, nullptr, nullptr};  // per expert (the pool's), or null
  const int32_t* ids = nullptr;                        // [rows][k] routed experts
  const float* x = nullptr;                            // [rows][D]
  uint32_t rows = 0, k = 0;
  float swiglu_limit = 0.0f;
  float* eg = nullptr;  // [rows * k][I] scratch: gate products, then SwiGLU where not fused
  float* eu = nullptr;  // [rows * k][I] scratch: up products
  float* eo = nullptr;  // [rows * k][D] each route's output
};

// Per route: route r * k + j's output in eo row r * k + j (moe_combine's `where` null).
void decode_experts_per_route(const DecodeExperts& a, cudaStream_t stream);

// The tokens a grouped launch takes per expert (more rows of one expert split into several groups):
// the step's rows, or fewer where the int16 kernel's shared memory does not hold them; 0 where the
// grouped path does not apply (one row, or weights the int16 path does not read).
uint32_t grouped_expert_tokens(const DecodeExperts& a);
// Device ints the grouped path's scratch holds for `routes` routes at `tokens` a group.
inline size_t route_group_ints(uint32_t routes, uint32_t tokens) { return size_t{routes} * (3 + 2 * size_t{tokens}); }

// The routes' groups (written by group_routes into `scratch`, route_group_ints() ints): group g
// (g < routes; groups past the last have count 0) of expert expert[g] has count[g] <= tokens routes,
// token t from x row tok_x[g * tokens + t] into slot tok_y[g * tokens + t]; where[i] is route i's slot.
// Groups follow the first route of each, tokens the route order; slots are 0..routes-1 group after group.
struct RouteGroups {
  int32_t *expert, *count, *tok_x, *tok_y;
};
RouteGroups route_groups(int32_t* scratch, uint32_t routes, uint32_t tokens);
void group_routes(const int32_t* ids, uint32_t rows, uint32_t k, uint32_t tokens, int32_t* scratch, int32_t* where,
                  cudaStream_t stream);

// Grouped: route i's output in eo row where[i]; `tokens` from grouped_expert_tokens() (>= 1).
void decode_experts_grouped(const DecodeExperts& a, uint32_t tokens, int32_t* scratch, int32_t* where,
                            cudaStream_t stream);

}  // namespace ferry::gpu
