#pragma once
// Integer tensor-core products (issue 15): one warp's mma.sync m16n8k32 over 8-bit operands with
// int32 sums, sm80+ (Ampere, Hopper). The sums are exact, so int16 activations taken as two 8-bit
// halves (hi * 256 + lo) give the same integers as the int16 decode kernels' dp2a sums: products
// over quantized weights keep their CPU parity without the fp16 hi/lo split's three products.
//
// Fragments, with lane = 4 * g + q (g = lane / 4, q = lane % 4); each 32-bit register holds four
// consecutive k of one row (A) or column (B), lowest byte first:
//   A (16 x 32, rows m, k): a[0] row g, k 4q..4q+3; a[1] row g + 8, k 4q..; a[2] row g, k 16 + 4q..;
//                           a[3] row g + 8, k 16 + 4q..
//   B (32 x 8, k, columns n): b[0] column g, k 4q..4q+3; b[1] column g, k 16 + 4q..
//   C (16 x 8): c[0], c[1] row g, columns 2q, 2q + 1; c[2], c[3] row g + 8, the same columns.
// A dot product is the same whatever order its k run in, so a kernel may give a register any four
// k of its own choosing, as long as A's and B's registers agree (weights laid out as their bytes
// lie, activations permuted to match).
//
// Code built for an earlier architecture (the Volta build, or its compute_70 PTX JIT-compiled on a
// newer device) has no such instruction: there the products trap, and hosts choose their kernels by
// code_built_for(kernel, 8) (gpu/pdl.hpp).
#include <cstdint>

namespace ferry::gpu::mma {

struct FragA {
  uint32_t r[4];
};
struct FragB {
  uint32_t r[2];
};
struct FragC {
  int32_t r[4];
};

// d = c + a * b; SignedA / SignedB say whether A's / B's bytes are s8 or u8. C is an input apart from
// D, so a C that many products share (a constant) stays in its registers instead of being copied
// into each D first.
template <bool SignedA, bool SignedB>
__device__ __forceinline__ void mma_k32(FragC& d, const FragA& a, const FragB& b, const FragC& c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define FERRY_MMA_K32(AT, BT)                                                                       \
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32." AT "." BT ".s32 "                           \
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"               \
               : "=r"(d.r[0]), "=r"(d.r[1]), "=r"(d.r[2]), "=r"(d.r[3])                             \
               : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]),      \
                 "r"(c.r[0]), "r"(c.r[1]), "r"(c.r[2]), "r"(c.r[3]))
  if constexpr (SignedA && SignedB) {
    FERRY_MMA_K32("s8", "s8");
  } else if constexpr (SignedA) {
    FERRY_MMA_K32("s8", "u8");
  } else if constexpr (SignedB) {
    FERRY_MMA_K32("u8", "s8");
  } else {
    FERRY_MMA_K32("u8", "u8");
  }
#undef FERRY_MMA_K32
#else
  (void)d;
  (void)a;
  (void)b;
  (void)c;
  __trap();
#endif
}

// d = a * b with a zero C operand (RZ in the instruction: no registers zeroed for it), the
// signedness of mma_k32.
template <bool SignedA, bool SignedB>
__device__ __forceinline__ void mma_k32_zero_c(FragC& d, const FragA& a, const FragB& b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define FERRY_MMA_K32_ZERO_C(AT, BT)                                                                  \
  asm("mma.sync.aligned.m16n8k32.row.col.s32." AT "." BT ".s32 "                                    \
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"                         \
      : "=r"(d.r[0]), "=r"(d.r[1]), "=r"(d.r[2]), "=r"(d.r[3])                                      \
      : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]), "r"(0))
  if constexpr (SignedA && SignedB) {
    FERRY_MMA_K32_ZERO_C("s8", "s8");
  } else if constexpr (SignedA) {
    FERRY_MMA_K32_ZERO_C("s8", "u8");
  } else if constexpr (SignedB) {
    FERRY_MMA_K32_ZERO_C("u8", "s8");
  } else {
    FERRY_MMA_K32_ZERO_C("u8", "u8");
  }
#undef FERRY_MMA_K32_ZERO_C
#else
  (void)d;
  (void)a;
  (void)b;
  __trap();
#endif
}

// d = c + a * b over tf32 operands with f32 sums (m16n8k4, sm80+): the K-quant minimum terms beside
// the int8 products (an integer min times a block sum split into two tf32 parts). Fragments: a[0] row
// g, k q; a[1] row g + 8, k q; b column g, k q; c, d as FragC's (f32 bits).
__device__ __forceinline__ void mma_tf32_k4(uint32_t (&d)[4], const uint32_t (&a)[2], uint32_t b,
                                            const uint32_t (&c)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("mma.sync.aligned.m16n8k4.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
               "{%7, %8, %9, %10};"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(b), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
#else
  (void)d;
  (void)a;
  (void)b;
  (void)c;
  __trap();
#endif
}

// Four 8 x 16-byte matrices from shared memory in one instruction (ldmatrix .x4, sm75+): lanes 8i..8i
// + 7 give the 16-byte-aligned row addresses of matrix i, and register i of lane 4 * g + q is word q
// of matrix i's row g, what a 32-bit shared load of that word would give (fragment layouts above).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
#else
  (void)r;
  (void)row;
  __trap();
#endif
}

// Hopper's warpgroup MMA (wgmma.mma_async, sm_90a only: a file built for that target alone, its hosts
// choosing it on devices of compute capability 9.0; elsewhere these trap). A warpgroup (4 warps
// 4k..4k + 3) multiplies A, 64 x 32 bytes from registers, by B, 32 bytes x N from shared memory as a
// descriptor says, into d = A * B (int32; the products start from zero). Warp w of the group holds
// A's rows 16w.. as an m16n8k32 fragment (FragA's layout) and d's rows 16w.., d[4n + k] being
// FragC's r[k] of columns 8n..: so the warp's parts are those of mma.sync's tiles. The product runs
// asynchronously: its registers must not be touched between wgmma_fence, the issue and the
// wgmma_wait that sees its group done (fence_operand pins them for the compiler).
__device__ __forceinline__ void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#else
  __trap();
#endif
}

// Waits until at most `Pending` of the warpgroup's committed groups are in flight.
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(Pending) : "memory");
#else
  __trap();
#endif
}

// Orders this thread's earlier shared-memory writes (stores, completed cp.async copies) before later
// reads of the asynchronous proxy, through which wgmma reads its shared operands; a barrier after it
// extends that to the block.
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#else
  __trap();
#endif
}

// Keeps a register where an asynchronous product reads or writes it, in order with the asm around it.
__device__ __forceinline__ void fence_operand(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
__device__ __forceinline__ void fence_operand(int32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

// A shared-memory matrix descriptor without swizzling: core matrices of 8 rows x 16 bytes, each 128
// contiguous bytes, at `start`; `k_bytes` between neighbours along k (the leading dimension), `mn_bytes`
// between neighbours along the rows (the stride dimension). Offsets in 16-byte units, 14 bits each.
__device__ __forceinline__ uint64_t smem_desc(const void* start, uint32_t k_bytes, uint32_t mn_bytes) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(start));
  return static_cast<uint64_t>((a >> 4) & 0x3fff) | static_cast<uint64_t>((k_bytes >> 4) & 0x3fff) << 16 |
         static_cast<uint64_t>((mn_bytes >> 4) & 0x3fff) << 32;
}

// d[0 .. N / 2) = A * B, m64nNk32 (N 8, 16, 24 or 32), A's / B's bytes s8 or u8 as SignedA / SignedB say.
template <int N, bool SignedA, bool SignedB, int M>
__device__ __forceinline__ void wgmma_k32(int32_t (&d)[M], const uint32_t (&a)[4], uint64_t b) {
  static_assert((N == 8 || N == 16 || N == 24 || N == 32) && N / 2 <= M, "wgmma_k32: N is 8, 16, 24 or 32");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FERRY_WGMMA_N8(AT, BT)                                                              \
  asm volatile("wgmma.mma_async.sync.aligned.m64n8k32.s32." AT "." BT " {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, 0;" \
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b))
#define FERRY_WGMMA_N16(AT, BT)                                                              \
  asm volatile("wgmma.mma_async.sync.aligned.m64n16k32.s32." AT "." BT " {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, 0;" \
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]), "=r"(d[4]), "=r"(d[5]), "=r"(d[6]), "=r"(d[7]) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b))
#define FERRY_WGMMA_N24(AT, BT)                                                              \
  asm volatile("wgmma.mma_async.sync.aligned.m64n24k32.s32." AT "." BT " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11}, {%12, %13, %14, %15}, %16, 0;" \
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]), "=r"(d[4]), "=r"(d[5]), "=r"(d[6]), "=r"(d[7]), "=r"(d[8]), "=r"(d[9]), "=r"(d[10]), "=r"(d[11]) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b))
#define FERRY_WGMMA_N32(AT, BT)                                                              \
  asm volatile("wgmma.mma_async.sync.aligned.m64n32k32.s32." AT "." BT " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, 0;" \
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]), "=r"(d[4]), "=r"(d[5]), "=r"(d[6]), "=r"(d[7]), "=r"(d[8]), "=r"(d[9]), "=r"(d[10]), "=r"(d[11]), "=r"(d[12]), "=r"(d[13]), "=r"(d[14]), "=r"(d[15]) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b))
#define FERRY_WGMMA_TYPES(AT, BT)        \
  if constexpr (N == 8) {                  \
    FERRY_WGMMA_N8(AT, BT);                \
  } else if constexpr (N == 16) {          \
    FERRY_WGMMA_N16(AT, BT);               \
  } else if constexpr (N == 24) {          \
    FERRY_WGMMA_N24(AT, BT);               \
  } else {                                 \
    FERRY_WGMMA_N32(AT, BT);               \
  }
  if constexpr (SignedA && SignedB) {
    FERRY_WGMMA_TYPES("s8", "s8");
  } else if constexpr (SignedA) {
    FERRY_WGMMA_TYPES("s8", "u8");
  } else if constexpr (SignedB) {
    FERRY_WGMMA_TYPES("u8", "s8");
  } else {
    FERRY_WGMMA_TYPES("u8", "u8");
  }
#undef FERRY_WGMMA_TYPES
#undef FERRY_WGMMA_N8
#undef FERRY_WGMMA_N16
#undef FERRY_WGMMA_N24
#undef FERRY_WGMMA_N32
#else
  (void)d;
  (void)a;
  (void)b;
  __trap();
#endif
}

}  // namespace ferry::gpu::mma
