// Synthetic weights for benchmarks: valid GGUF blocks from a counter-based hash, made in place on the
// device. The values are not a trained model's, but their sizes are sane (centred, about
// +-amplitude), so activations stay finite and every kernel does its real work.
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "gpu/cuda_check.hpp"
#include "gpu/kernels.hpp"

namespace ferry::gpu {
namespace {

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
__device__ __forceinline__ float unit_float(uint64_t h) { return static_cast<float>(h >> 40) * (1.0f / 16777216.0f); }

__device__ void put_half(uint8_t* p, float v) {
  const unsigned short h = __half_as_ushort(__float2half_rn(v));
  p[0] = static_cast<uint8_t>(h & 0xff);
  p[1] = static_cast<uint8_t>(h >> 8);
}

// Packs 6-bit scales and mins of 8 sub-blocks as Q4_K/Q5_K store them.
__device__ void pack_k4(uint8_t* q, const int* sc, const int* m) {
  for (int j = 0; j < 4; ++j) {
    q[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    q[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
    q[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xf) | ((m[j + 4] & 0xf) << 4));
  }
}

// One thread per block (or per element of plain types).
__global__ void synth_kernel(int type, uint8_t* data, size_t rows, uint32_t cols, size_t row_bytes, uint32_t block_elems,
                             uint32_t block_bytes, uint64_t seed, float amp) {
  const size_t per_row = cols / block_elems;
  const size_t total = rows * per_row;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint8_t* b = data + (i / per_row) * row_bytes + (i % per_row) * block_bytes;
    uint64_t h = mix64(seed ^ mix64(i));
    auto next = [&h]() { h = mix64(h); return h; };
    switch (type) {
      case 0: {  // F32
        *reinterpret_cast<float*>(b) = (2.0f * unit_float(next()) - 1.0f) * amp;
        break;
      }
      case 1: {  // F16
        put_half(b, (2.0f * unit_float(next()) - 1.0f) * amp);
        break;
      }
      case 30: {  // BF16
        const float v = (2.0f * unit_float(next()) - 1.0f) * amp;
        const uint32_t u = __float_as_uint(v);
        const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        b[0] = static_cast<uint8_t>(r & 0xff);
        b[1] = static_cast<uint8_t>(r >> 8);
        break;
      }
      case 8: {  // Q8_0: symmetric int8
        put_half(b, amp / 127.0f);
        for (int k = 0; k < 32; k += 8) {
          const uint64_t r = next();
          for (int j = 0; j < 8; ++j) b[2 + k + j] = static_cast<uint8_t>(r >> (8 * j));
        }
        break;
      }
      case 12:    // Q4_K: value = d*sc*q - dmin*m with m ~ sc*(qmax/2) so that values centre on 0
      case 13: {  // Q5_K
        const bool five = type == 13;
        const int qmax = five ? 31 : 15;
        int sc[8], m[8];
        const uint64_t r = next();
        for (int j = 0; j < 8; ++j) {
          sc[j] = (five ? 2 : 4) + static_cast<int>((r >> (4 * j)) & 3);
          m[j] = (sc[j] * qmax + 1) / 2;
        }
        const float d = amp / (static_cast<float>(five ? 4 : 6) * qmax * 0.5f);
        put_half(b, d);
        put_half(b + 2, d);
        pack_k4(b + 4, sc, m);
        const int qbytes = five ? 160 : 128;  // Q5_K: qh[32] then qs[128], both random
        for (int k = 0; k < qbytes; k += 8) {
          const uint64_t v = next();
          for (int j = 0; j < 8; ++j) b[16 + k + j] = static_cast<uint8_t>(v >> (8 * j));
        }
        break;
      }
      case 14: {  // Q6_K: (q - 32) * d * scale, scales 8..15
        for (int k = 0; k < 192; k += 8) {
          const uint64_t v = next();
          for (int j = 0; j < 8; ++j) b[k + j] = static_cast<uint8_t>(v >> (8 * j));
        }
        const uint64_t s = next();
        for (int j = 0; j < 16; ++j) b[192 + j] = static_cast<uint8_t>(8 + ((s >> (4 * j)) & 7));
        put_half(b + 208, amp / (32.0f * 11.5f));
        break;
      }
      case 23: {  // IQ4_XS: d * (ls - 32) * kvalue, ls in 40..47
        put_half(b, amp / (8.0f * 127.0f) * 10.0f);
        b[2] = 0xaa;  // high scale bits: 2 for every sub-block (ls = 32 + 8 + low)
        b[3] = 0xaa;
        const uint64_t s = next();
        for (int j = 0; j < 4; ++j) b[4 + j] = static_cast<uint8_t>(s >> (8 * j));
        for (int k = 0; k < 128; k += 8) {
          const uint64_t v = next();
          for (int j = 0; j < 8; ++j) b[8 + k + j] = static_cast<uint8_t>(v >> (8 * j));
        }
        break;
      }
      case 21: {  // IQ3_S: random grid indices, signs and scales
        put_half(b, amp / (15.0f * 16.0f));
        for (int k = 2; k < 110; k += 8) {
          const uint64_t v = next();
          for (int j = 0; j < 8 && k + j < 110; ++j) b[k + j] = static_cast<uint8_t>(v >> (8 * j));
        }
        break;
      }
      default:
        break;
    }
  }
}

}  // namespace

void synth_fill(model::GgmlType type, uint8_t* data, size_t rows, uint32_t cols, size_t row_bytes, uint64_t seed,
                uint64_t tensor_id, float amplitude, cudaStream_t stream) {
  const auto traits = model::ggml_type_traits(type);
  if (!device_supports(type) || cols % traits.block_elems != 0) {
    throw CudaError("synthetic weights: cannot make " + std::string(traits.name) + " rows of " + std::to_string(cols));
  }
  const size_t blocks = rows * (cols / traits.block_elems);
  if (blocks == 0) return;
  const unsigned grid = static_cast<unsigned>(std::min<size_t>((blocks + 255) / 256, 65535 * 8));
  uint64_t s = seed * 0x9e3779b97f4a7c15ull ^ (tensor_id + 1) * 0xd1b54a32d192ed03ull;
  synth_kernel<<<grid, 256, 0, stream>>>(static_cast<int>(type), data, rows, cols, row_bytes, traits.block_elems,
                                         traits.block_bytes, s, amplitude);
  FERRY_CUDA_LAUNCHED();
}

}  // namespace ferry::gpu
