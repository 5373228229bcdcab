#pragma once
// The routed experts of a decode step (up to kMaxMatvecTokens rows, k routes each). Per route, one
// matvec group per (row, expert), the 1-token int16 kernel: an expert that two rows chose is read
// twice. Shared (decode_experts_shared): share_routes decides per expert on the device which
// experts several rows of the step chose; those run once over all their rows (the 2-8 token kernel,
// MatvecArgs::group_count / tok_*), every other route keeps the per-route launch, its groups of
// shared experts skipped. Each route's output lands in its own row of eo with the per-route path's
// bits (the int16 kernel sums a token's products in the same lanes and order whatever the launch's
// token count), so moe_combine reads it as before.
#include <cstdint>

#include "gpu/kernels.hpp"

namespace ferry::gpu {

struct DecodeExperts {
  DevMatrix gate, up, down;  // expert 0's (rows I, I, D); the others follow
  const uint8_t* const* tables[3] = {nullptr, nullptr, nullptr};  // per expert (the pool's), or null
  const int32_t* ids = nullptr;                                   // [rows][k] routed experts
  const float* x = nullptr;                                       // [rows][D]
  uint32_t rows = 0, k = 0;
  float swiglu_limit = 0.0f;
  float* eg = nullptr;  // [rows * k][I] scratch: gate products, then SwiGLU where not fused
  float* eu = nullptr;  // [rows * k][I] scratch: up products
  float* eo = nullptr;  // [rows * k][D] route r * k + j's output in row r * k + j
  // The layer's shared expert (gate empty: none, or run apart): where shared_expert_fused holds, the
  // routed experts' gate/up launch takes its gate and up as further parts (products into sg and su)
  // where it can (fused_gate_up) and their down launch its down (SwiGLU of sg and su, into sh [D]):
  // one or two launches fewer a layer.
  DevMatrix shared_gate, shared_up, shared_down;
  float* sg = nullptr;
  float* su = nullptr;
  float* sh = nullptr;
};

// Whether decode_experts_per_route computes the shared expert too: one row (the shared expert's one
// token, as its own launches run it), gate, up and the shared gate and up of one row format, down and
// the shared down of another, or the shared expert's matrices in a format of their own where the
// int16 path's dp2a kernel mixes the two types (MatvecPart::type), the down launch on the int16 path
// (the same kernel code as the launches apart, so sh gets their bits).
bool shared_expert_fused(const DecodeExperts& a);

// The launches decode_experts_per_route makes where shared_expert_fused holds: the routed experts'
// gate and up, then the shared expert's (parts 0-3) where one launch takes their row formats, else
// the shared gate and up first as a launch of their own (as LayerRunner::dense_ffn launches them) and
// then the routed ones; the routed experts' down over SwiGLU(eg, eu), then the shared expert's over
// SwiGLU(sg, su) (parts 0-1).
void fused_gate_up(const DecodeExperts& a, cudaStream_t stream);
MatvecArgs fused_down(const DecodeExperts& a);

// Per route (and the shared expert where shared_expert_fused holds).
void decode_experts_per_route(const DecodeExperts& a, cudaStream_t stream);

// The tokens a group of a shared expert takes (more rows of one expert split into several groups):
// 2, or 4 from 3 rows on, where the int16 kernel's shared memory holds them for gate, up and down
// and the per-route launch is on the int16 path too; 0 where decode_experts_shared does not apply.
uint32_t shared_expert_tokens(const DecodeExperts& a);
// Device ints the shared path's scratch holds for `routes` routes at `tokens` a group.
inline size_t shared_route_ints(uint32_t routes, uint32_t tokens) {
  return 1 + size_t{routes} * (3 + 2 * size_t{tokens});
}

// What share_routes writes into its scratch (shared_route_ints() ints): single[i] is route i's
// expert when no other route of the step chose it, else -1; the *count groups of shared experts,
// in the order of their first routes: group g of expert expert[g] has tokens[g] <= `tokens` routes,
// token t from x row tok_x[g * tokens + t] into eo row tok_y[g * tokens + t] (its route).
struct SharedRoutes {
  int32_t *count, *single, *expert, *tokens, *tok_x, *tok_y;
};
SharedRoutes shared_routes(int32_t* scratch, uint32_t routes, uint32_t tokens);
void share_routes(const int32_t* ids, uint32_t rows, uint32_t k, uint32_t tokens, int32_t* scratch,
                  cudaStream_t stream);

// Shared where an expert has several rows, per route elsewhere; `tokens` from shared_expert_tokens().
void decode_experts_shared(const DecodeExperts& a, uint32_t tokens, int32_t* scratch, cudaStream_t stream);

}  // namespace ferry::gpu
