#pragma once
// Device-side decoding of GGUF weight blocks, shared by the matrix-vector kernels and the
// dequantisers. A row is cut into units (one or two 16-byte loads of quants plus their scales);
// decode_unit<T> turns unit u of a row into f32 values, in runs of RL contiguous columns starting
// at run_col<T>(u, r). The arithmetic follows model/formats/quant_dequant.cpp (d*scale first, then times
// the quant, minus dmin*min), so the values match the CPU reference up to FMA rounding.
#include <cuda_fp16.h>

#include <cstdint>

namespace ferry::gpu::qd {

// ggml type ids (model/formats/ggml_type.hpp), plus an f32 path for rows not a multiple of 8.
enum : int { kF32 = 0, kF16 = 1, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kIQ3_S = 21, kIQ4_XS = 23,
             kBF16 = 30, kF32Scalar = 1000 };

template <int T> struct Traits;
template <> struct Traits<kF32> { static constexpr int UE = 8, RUNS = 1, RL = 8; };
template <> struct Traits<kF32Scalar> { static constexpr int UE = 1, RUNS = 1, RL = 1; };
template <> struct Traits<kF16> { static constexpr int UE = 8, RUNS = 1, RL = 8; };
template <> struct Traits<kBF16> { static constexpr int UE = 8, RUNS = 1, RL = 8; };
template <> struct Traits<kQ8_0> { static constexpr int UE = 32, RUNS = 2, RL = 16; };
template <> struct Traits<kQ4_K> { static constexpr int UE = 32, RUNS = 2, RL = 16; };
template <> struct Traits<kQ5_K> { static constexpr int UE = 32, RUNS = 2, RL = 16; };
template <> struct Traits<kQ6_K> { static constexpr int UE = 64, RUNS = 4, RL = 16; };
template <> struct Traits<kIQ4_XS> { static constexpr int UE = 32, RUNS = 2, RL = 16; };
template <> struct Traits<kIQ3_S> { static constexpr int UE = 32, RUNS = 2, RL = 16; };

__device__ __forceinline__ float h2f(uint32_t bits16) { return __half2float(__ushort_as_half(static_cast<unsigned short>(bits16))); }
__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
__device__ __forceinline__ uint32_t ld_u32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
// Byte k (0..3) of w as a float, exactly, without an int-to-float conversion instruction.
__device__ __forceinline__ float byte_f(uint32_t w, int k) {
  return __int_as_float(__byte_perm(w, 0x4B000000u, 0x7440u + k)) - 8388608.0f;
}
// Four bytes read from a 2-byte aligned address.
__device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t* p) { return ld_u16(p) | (ld_u16(p + 2) << 16); }

__device__ __forceinline__ void k4_scale_min(const uint8_t* q, int j, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

template <int T> __device__ __forceinline__ uint32_t run_col(uint32_t u, int r);
template <> __device__ __forceinline__ uint32_t run_col<kF32>(uint32_t u, int) { return 8 * u; }
template <> __device__ __forceinline__ uint32_t run_col<kF32Scalar>(uint32_t u, int) { return u; }
template <> __device__ __forceinline__ uint32_t run_col<kF16>(uint32_t u, int) { return 8 * u; }
template <> __device__ __forceinline__ uint32_t run_col<kBF16>(uint32_t u, int) { return 8 * u; }
template <> __device__ __forceinline__ uint32_t run_col<kQ8_0>(uint32_t u, int r) { return 32 * u + 16 * r; }
// K-quant units: 8 per block; unit j covers 16 columns of sub-block 2*(j/2) and the same 16 of 2*(j/2)+1.
template <> __device__ __forceinline__ uint32_t run_col<kQ4_K>(uint32_t u, int r) {
  const uint32_t j = u & 7;
  return 256 * (u >> 3) + 64 * (j >> 1) + 16 * (j & 1) + 32 * r;
}
template <> __device__ __forceinline__ uint32_t run_col<kQ5_K>(uint32_t u, int r) { return run_col<kQ4_K>(u, r); }
template <> __device__ __forceinline__ uint32_t run_col<kQ6_K>(uint32_t u, int r) {
  const uint32_t j = u & 3;
  return 256 * (u >> 2) + 128 * (j >> 1) + 16 * (j & 1) + 32 * r;
}
template <> __device__ __forceinline__ uint32_t run_col<kIQ4_XS>(uint32_t u, int r) { return 32 * u + 16 * r; }
template <> __device__ __forceinline__ uint32_t run_col<kIQ3_S>(uint32_t u, int r) { return 32 * u + 16 * r; }

template <int T>
__device__ __forceinline__ void decode_unit(const uint8_t* row, uint32_t u, float* v, const uint32_t* grid,
                                            const int8_t* kvalues);

template <>
__device__ __forceinline__ void decode_unit<kF32>(const uint8_t* row, uint32_t u, float* v, const uint32_t*, const int8_t*) {
  const float4* p = reinterpret_cast<const float4*>(row) + 2 * u;
  const float4 a = p[0], b = p[1];
  v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
template <>
__device__ __forceinline__ void decode_unit<kF32Scalar>(const uint8_t* row, uint32_t u, float* v, const uint32_t*,
                                                        const int8_t*) {
  v[0] = reinterpret_cast<const float*>(row)[u];
}
template <>
__device__ __forceinline__ void decode_unit<kF16>(const uint8_t* row, uint32_t u, float* v, const uint32_t*, const int8_t*) {
  const uint4 q = reinterpret_cast<const uint4*>(row)[u];
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = h2f(w[i] & 0xffff);
    v[2 * i + 1] = h2f(w[i] >> 16);
  }
}
template <>
__device__ __forceinline__ void decode_unit<kBF16>(const uint8_t* row, uint32_t u, float* v, const uint32_t*, const int8_t*) {
  const uint4 q = reinterpret_cast<const uint4*>(row)[u];
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(w[i] << 16);
    v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
template <>
__device__ __forceinline__ void decode_unit<kQ8_0>(const uint8_t* row, uint32_t u, float* v, const uint32_t*, const int8_t*) {
  const uint8_t* b = row + 34 * u;
  const float d = h2f(ld_u16(b));
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    // Signed bytes: flip the sign bit to get q + 128 as an unsigned byte, then subtract 128.
    const uint32_t w = ld_u32_a2(b + 2 + 4 * i) ^ 0x80808080u;
#pragma unroll
    for (int k = 0; k < 4; ++k) v[4 * i + k] = (byte_f(w, k) - 128.0f) * d;
  }
}
template <>
__device__ __forceinline__ void decode_unit<kQ4_K>(const uint8_t* row, uint32_t u, float* v, const uint32_t*, const int8_t*) {
  const uint8_t* b = row + 144 * (u >> 3);
  const uint32_t j = u & 7, c = j >> 1, half = j & 1;
  const uint32_t dd = ld_u32(b);
  const float d = h2f(dd & 0xffff), dmin = h2f(dd >> 16);
  int sc1, m1, sc2, m2;
  k4_scale_min(b + 4, 2 * c, sc1, m1);
  k4_scale_min(b + 4, 2 * c + 1, sc2, m2);
  const float d1 = d * static_cast<float>(sc1), mm1 = dmin * static_cast<float>(m1);
  const float d2 = d * static_cast<float>(sc2), mm2 = dmin * static_cast<float>(m2);
  const uint4 q = *reinterpret_cast<const uint4*>(b + 16 + 32 * c + 16 * half);
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t lo = w[i] & 0x0f0f0f0fu, hi = (w[i] >> 4) & 0x0f0f0f0fu;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[4 * i + k] = d1 * byte_f(lo, k) - mm1;
      v[16 + 4 * i + k] = d2 * byte_f(hi, k) - mm2;
    }
  }
}
template <>
__device__ __forceinline__ void decode_unit<kQ5_K>(const uint8_t* row, uint32_t u, float* v, const uint32_t*, const int8_t*) {
  const uint8_t* b = row + 176 * (u >> 3);
  const uint32_t j = u & 7, c = j >> 1, half = j & 1;
  const uint32_t dd = ld_u32(b);
  const float d = h2f(dd & 0xffff), dmin = h2f(dd >> 16);
  int sc1, m1, sc2, m2;
  k4_scale_min(b + 4, 2 * c, sc1, m1);
  k4_scale_min(b + 4, 2 * c + 1, sc2, m2);
  const float d1 = d * static_cast<float>(sc1), mm1 = dmin * static_cast<float>(m1);
  const float d2 = d * static_cast<float>(sc2), mm2 = dmin * static_cast<float>(m2);
  const uint4 q = *reinterpret_cast<const uint4*>(b + 48 + 32 * c + 16 * half);
  const uint4 h = *reinterpret_cast<const uint4*>(b + 16 + 16 * half);
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
  const uint32_t hw[4] = {h.x, h.y, h.z, h.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t lo = (w[i] & 0x0f0f0f0fu) | (((hw[i] >> (2 * c)) & 0x01010101u) << 4);
    const uint32_t hi = ((w[i] >> 4) & 0x0f0f0f0fu) | (((hw[i] >> (2 * c + 1)) & 0x01010101u) << 4);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[4 * i + k] = d1 * byte_f(lo, k) - mm1;
      v[16 + 4 * i + k] = d2 * byte_f(hi, k) - mm2;
    }
  }
}
template <>
__device__ __forceinline__ void decode_unit<kQ6_K>(const uint8_t* row, uint32_t u, float* v, const uint32_t*, const int8_t*) {
  const uint8_t* b = row + 210 * (u >> 2);
  const uint32_t j = u & 3, n = j >> 1, half = j & 1;
  const float d = h2f(ld_u16(b + 208));
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * n + half);
  const float ds[4] = {d * static_cast<float>(sc[0]), d * static_cast<float>(sc[2]), d * static_cast<float>(sc[4]),
                       d * static_cast<float>(sc[6])};
  const uint8_t* ql = b + 64 * n + 16 * half;
  const uint8_t* qh = b + 128 + 32 * n + 16 * half;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t l0 = ld_u32_a2(ql + 4 * i), l1 = ld_u32_a2(ql + 32 + 4 * i), h = ld_u32_a2(qh + 4 * i);
    const uint32_t q1 = (l0 & 0x0f0f0f0fu) | ((h & 0x03030303u) << 4);
    const uint32_t q2 = (l1 & 0x0f0f0f0fu) | (((h >> 2) & 0x03030303u) << 4);
    const uint32_t q3 = ((l0 >> 4) & 0x0f0f0f0fu) | (((h >> 4) & 0x03030303u) << 4);
    const uint32_t q4 = ((l1 >> 4) & 0x0f0f0f0fu) | (((h >> 6) & 0x03030303u) << 4);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[4 * i + k] = ds[0] * (byte_f(q1, k) - 32.0f);
      v[16 + 4 * i + k] = ds[1] * (byte_f(q2, k) - 32.0f);
      v[32 + 4 * i + k] = ds[2] * (byte_f(q3, k) - 32.0f);
      v[48 + 4 * i + k] = ds[3] * (byte_f(q4, k) - 32.0f);
    }
  }
}
template <>
__device__ __forceinline__ void decode_unit<kIQ4_XS>(const uint8_t* row, uint32_t u, float* v, const uint32_t*,
                                                     const int8_t* kvalues) {
  const uint8_t* b = row + 136 * (u >> 3);
  const uint32_t ib = u & 7;
  const float d = h2f(ld_u16(b));
  const uint32_t scales_h = ld_u16(b + 2);
  const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xf) | (((scales_h >> (2 * ib)) & 3) << 4);
  const float dl = d * static_cast<float>(ls - 32);
  const uint2 q0 = *reinterpret_cast<const uint2*>(b + 8 + 16 * ib);
  const uint2 q1 = *reinterpret_cast<const uint2*>(b + 16 + 16 * ib);
  const uint32_t w[4] = {q0.x, q0.y, q1.x, q1.y};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t byte = (w[i] >> (8 * k)) & 0xff;
      v[4 * i + k] = dl * static_cast<float>(kvalues[byte & 0xf]);
      v[16 + 4 * i + k] = dl * static_cast<float>(kvalues[byte >> 4]);
    }
  }
}
template <>
__device__ __forceinline__ void decode_unit<kIQ3_S>(const uint8_t* row, uint32_t u, float* v, const uint32_t* grid,
                                                    const int8_t*) {
  const uint8_t* b = row + 110 * (u >> 3);
  const uint32_t ib = u & 7;
  const float d = h2f(ld_u16(b));
  const float db = d * static_cast<float>(1 + 2 * ((b[106 + ib / 2] >> (4 * (ib % 2))) & 0xf));
  const uint32_t qh = b[66 + ib];
  const uint32_t signs = ld_u32_a2(b + 74 + 4 * ib);
  const uint32_t qs_lo = ld_u32_a2(b + 2 + 8 * ib), qs_hi = ld_u32_a2(b + 6 + 8 * ib);
#pragma unroll
  for (int g = 0; g < 8; ++g) {
    const uint32_t qs = ((g < 4 ? qs_lo : qs_hi) >> (8 * (g & 3))) & 0xff;
    const uint32_t entry = grid[qs | (((qh >> g) & 1) << 8)];
    const uint32_t sign_bits = signs >> (4 * g);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float mag = db * byte_f(entry, k);
      v[4 * g + k] = __uint_as_float(__float_as_uint(mag) ^ (((sign_bits >> k) & 1) << 31));
    }
  }
}

// Pieces: 8 consecutive values of a block, piece p its columns [8p, 8p + 8), for the block types whose
// values a lane can take that way from 8 bytes of quants (the prefill dequantisation to fp16: a warp's 32
// pieces are 256 consecutive outputs, stored as whole 512-byte runs without shared memory). decode_piece
// does decode_unit's operations on the same bytes, so it gives its values bit for bit.
template <int T> struct Piece { static constexpr bool kHas = false; };
template <> struct Piece<kQ8_0> { static constexpr bool kHas = true; static constexpr uint32_t QK = 32, BB = 34; };
template <> struct Piece<kQ4_K> { static constexpr bool kHas = true; static constexpr uint32_t QK = 256, BB = 144; };
template <> struct Piece<kQ5_K> { static constexpr bool kHas = true; static constexpr uint32_t QK = 256, BB = 176; };
template <> struct Piece<kQ6_K> { static constexpr bool kHas = true; static constexpr uint32_t QK = 256, BB = 210; };

template <int T> __device__ __forceinline__ void decode_piece(const uint8_t* b, uint32_t p, float* v);

template <>
__device__ __forceinline__ void decode_piece<kQ8_0>(const uint8_t* b, uint32_t p, float* v) {
  const float d = h2f(ld_u16(b));
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t w = ld_u32_a2(b + 2 + 8 * p + 4 * i) ^ 0x80808080u;
#pragma unroll
    for (int k = 0; k < 4; ++k) v[4 * i + k] = (byte_f(w, k) - 128.0f) * d;
  }
}
// Q4_K / Q5_K: columns 64c + [0, 32) are the low nibbles of quant bytes 32c + [0, 32) (sub-block 2c), columns
// 64c + [32, 64) their high nibbles (sub-block 2c + 1); Q5_K's fifth bit of byte l is bit s of qh[l].
template <int T>
__device__ __forceinline__ void decode_piece_k45(const uint8_t* b, uint32_t p, float* v) {
  const uint32_t c = p >> 3, high = (p >> 2) & 1, l0 = 8 * (p & 3), s = 2 * c + high;
  const uint32_t dd = ld_u32(b);
  const float d = h2f(dd & 0xffff), dmin = h2f(dd >> 16);
  int sc, m;
  k4_scale_min(b + 4, static_cast<int>(s), sc, m);
  const float d1 = d * static_cast<float>(sc), mm1 = dmin * static_cast<float>(m);
  const uint2 q = *reinterpret_cast<const uint2*>(b + (T == kQ5_K ? 48 : 16) + 32 * c + l0);
  const uint32_t w[2] = {q.x, q.y};
  uint32_t hb[2] = {0, 0};
  if constexpr (T == kQ5_K) {
    const uint2 h = *reinterpret_cast<const uint2*>(b + 16 + l0);
    hb[0] = ((h.x >> s) & 0x01010101u) << 4;
    hb[1] = ((h.y >> s) & 0x01010101u) << 4;
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t nib = ((w[i] >> (4 * high)) & 0x0f0f0f0fu) | hb[i];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[4 * i + k] = d1 * byte_f(nib, k) - mm1;
  }
}
template <>
__device__ __forceinline__ void decode_piece<kQ4_K>(const uint8_t* b, uint32_t p, float* v) {
  decode_piece_k45<kQ4_K>(b, p, v);
}
template <>
__device__ __forceinline__ void decode_piece<kQ5_K>(const uint8_t* b, uint32_t p, float* v) {
  decode_piece_k45<kQ5_K>(b, p, v);
}
// Q6_K: columns 128n + 32g + [0, 32): the low (g = 0, 1) or high (g = 2, 3) nibbles of ql[64n + 32 (g & 1) + l]
// with bits 2g, 2g + 1 of qh[32n + l], scale sc[8n + l / 16 + 2g].
template <>
__device__ __forceinline__ void decode_piece<kQ6_K>(const uint8_t* b, uint32_t p, float* v) {
  const uint32_t n = p >> 4, g = (p >> 2) & 3, l0 = 8 * (p & 3);
  const float d = h2f(ld_u16(b + 208));
  const float ds = d * static_cast<float>(reinterpret_cast<const int8_t*>(b)[192 + 8 * n + (l0 >> 4) + 2 * g]);
  const uint8_t* ql = b + 64 * n + 32 * (g & 1) + l0;
  const uint8_t* qh = b + 128 + 32 * n + l0;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t l = ld_u32_a2(ql + 4 * i), h = ld_u32_a2(qh + 4 * i);
    const uint32_t q = ((l >> (4 * (g >> 1))) & 0x0f0f0f0fu) | (((h >> (2 * g)) & 0x03030303u) << 4);
#pragma unroll
    for (int k = 0; k < 4; ++k) v[4 * i + k] = ds * (byte_f(q, k) - 32.0f);
  }
}

}  // namespace ferry::gpu::qd
