#pragma once
// The MoE router of decode rows in one launch (issue 15): its f32 product and the route. Apart, the
// product (matvec(), launched plainly: no PDL for the general kernel) and moe_route (one block a row,
// ~4 us of latency a layer) are two launches in the chain; here the product's blocks ask for their
// weights before the PDL wait, and the last block to finish routes every row.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpu/kernels.hpp"

namespace ferry::gpu {

// logits = W x for one row x (logits [E]; a.logits is not read), matvec()'s bits (its 8-warp split of
// an f32 row and its order), then moe_route(a)'s ids and weights from them (gpu/moe_route.cuh).
// `done` is a device counter of the launch's finished blocks: zero before, left zero after; launches
// that share one run one after another (one stream). Inside a PdlScope it launches with PDL. Returns
// false (launching nothing) unless a.rows is 1, W is f32 of E rows of 2,048 to 8,192 columns (a
// multiple of 8, 16-byte aligned as x is) that matvec() gives its general kernel at 8 warps a row,
// E <= 512, and the route's shape is one moe_route takes: the caller then runs the product and
// moe_route.
bool moe_route_decode(const DevMatrix& w, const float* x, float* logits, const RouterArgs& a, uint32_t* done,
                      cudaStream_t stream);

}  // namespace ferry::gpu
