#pragma once
// Reference conversions between f32 and ggml's block formats (GGUF tensor data).
//
// Dequantization is bit-exact with the PyPI `gguf` package's numpy dequantizers (which follow ggml's
// dequantize_row_* in ggml-quants.c). Quantization follows ggml's quantize_row_*_ref algorithms.
// Both work on whole blocks: `n` must be a multiple of ggml_type_traits(type).block_elems, and the
// block side holds ggml_bytes(type, n) bytes (callers size buffers with ggml_bytes).
#include <cstddef>

#include "model/formats/ggml_type.hpp"

namespace ferry::model {

bool can_dequantize(GgmlType type);
bool can_quantize(GgmlType type);

// Decodes `n` elements of `type` from `src` into `dst`. Throws std::invalid_argument when
// !can_dequantize(type) or `n` is not a whole number of blocks (a caller bug: check first).
void dequantize_row(GgmlType type, const void* src, float* dst, size_t n);

// Encodes `n` f32 values as `type` into `dst`. Throws std::invalid_argument when !can_quantize(type)
// or `n` is not a whole number of blocks. Block types expect finite input: a NaN or infinity gives
// a well-defined but meaningless block (Q8_0: a NaN scale); F16/BF16 keep non-finite values.
void quantize_row(GgmlType type, const float* src, void* dst, size_t n);

// The same with an importance matrix: `importance` holds one weight per element of `src` (for a
// matrix, the imatrix row repeated per row), and the quantizer minimises the error weighted by it,
// as ggml's quantize_iq4_xs / quantize_iq3_s do with quant_weights. Types for which ferry has no
// weighted quantizer (see quantize_takes_importance) throw std::invalid_argument when `importance`
// is not null; nullptr gives quantize_row's result.
bool quantize_takes_importance(GgmlType type);
void quantize_row(GgmlType type, const float* src, void* dst, size_t n, const float* importance);

}  // namespace ferry::model
