#pragma once
// The routed experts of a prefill chunk as grouped GEMMs on tensor cores, with no host round trip:
// the chunk's routes are sorted by expert on the device (counts, offsets, a list of token tiles),
// then one launch per projection covers every expert: each block takes one (expert, token tile,
// row tile), decodes its expert's quantized weights into shared memory a k-tile at a time and
// multiplies them with the tile's gathered activations by WMMA (fp16 inputs, f32 accumulation; sm_70
// and later). Weights and activations are split into fp16 hi + lo/2^12 parts and three products are
// summed (hi.hi + (hi.lo + lo.hi)/2^12), as LayerRunner::mm does with cuBLAS: the result keeps ~22
// significant bits of each input, so it matches f32 arithmetic (the CPU reference) where plain fp16
// operands flip top tokens of small models.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "gpu/kernels.hpp"

namespace ferry::gpu {

inline constexpr uint32_t kGroupedTileRows = 64;    // weight rows (outputs) of a block
inline constexpr uint32_t kGroupedTileTokens = 64;  // sorted rows (tokens) of a block
inline constexpr uint32_t kMaxGroupedExperts = 1024;

// One projection of every expert: expert e's matrix is `m` (its type and shape; data unused when
// `table` is set) at table[e] when set (a pool slot, staging buffer or mapped host copy), else at
// m.data + e * stride.
struct ExpertMatrices {
  DevMatrix m;
  size_t stride = 0;
  const uint8_t* const* table = nullptr;
};

// The device-side grouping of a chunk's routes (route i = row * k + j), filled by sort_routes.
struct RouteSort {
  uint32_t* offsets = nullptr;  // [E + 1] first sorted row of each expert; offsets[E] = routes
  uint32_t* tiles = nullptr;    // [E + 1] first token tile of each expert; tiles[E] = tiles in all
  int32_t* gather = nullptr;    // [routes] sorted row -> the token row it reads
  int32_t* where = nullptr;     // [routes] route -> its sorted row (moe_combine reads it)
};

// What the expert tiers count of a prefill (StageExperts): per expert, its class for this chunk
// (0 in the pool, 1 uploaded into a staging buffer, 2 read mapped from host memory); per used
// expert, counters[class] += its routes and, for classes 1 and 2, counters[2 + class] += bytes.
struct RouteTally {
  const uint8_t* category = nullptr;  // [E]; null: nothing is counted
  uint64_t expert_bytes = 0;
  unsigned long long* counters = nullptr;  // [5]
};

// Groups `routes` routes (ids from moe_route: each in [0, E)) of k per row by expert, in one block.
// E <= kMaxGroupedExperts (checked). The order of an expert's rows is not fixed (atomics); results
// do not depend on it (each output column of the GEMM is computed on its own).
void sort_routes(const int32_t* ids, uint32_t routes, uint32_t k, uint32_t E, const RouteSort& out,
                 const RouteTally& tally, cudaStream_t stream);

// Where grouped_gemm splits its input: two parts (hi, lo) of `elems` fp16 values each. Parts 16-byte
// aligned with rows of a multiple of 8 columns take the fast copies; others are read by element.
struct SplitScratch {
  void* hi = nullptr;
  void* lo = nullptr;
  size_t elems = 0;
};

// Which kernel grouped_gemm runs: the best the weights and the device have (Q4_K / Q5_K / IQ3_S on sm80+ code: the
// int8 tensor-core kernel of gpu/moe_grouped_int8.hpp, with the decode matvec's int16 numerics;
// otherwise the fp16 WMMA kernel above), or the fp16 kernel always (its tests, the Volta path).
enum class GroupedPath { best, fp16 };

// Sorted row p of expert e: y[p] = W_e x[gather[p]] (x[p] with gather null), rows of y `ldy` apart;
// x has x_rows rows, `ldx` apart. With `up`: y[p] = swiglu(gate_e x, up_e x) clamped at `limit` as
// swiglu() does; when gate and up differ in type or shape, up_scratch (like y) takes the up product
// and swiglu() runs after. x is split into `split` first (x_rows x cols halves a part, checked; the
// int8 path keeps its int16 rows there instead): each row once, not once per tile that reads it. `routes` and E bound the tile list (grid size); the
// offsets are read on the device.
void grouped_gemm(const ExpertMatrices& w, const ExpertMatrices* up, const float* x, size_t ldx, uint32_t x_rows,
                  const int32_t* gather, const RouteSort& sort, uint32_t routes, uint32_t E, float limit, float* y,
                  size_t ldy, float* up_scratch, const SplitScratch& split, cudaStream_t stream,
                  GroupedPath path = GroupedPath::best);

}  // namespace ferry::gpu
