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

}  // namespace ferry::gpu::mma
