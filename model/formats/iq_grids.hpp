#pragma once
// Lookup tables of ggml's IQ quant types (format constants; generated into iq_grids.cpp by
// tools/gen_iq_grids.py from the gguf package's own data).
#include <cstdint>

namespace ferry::model {

// IQ2_XXS: 256 entries, each 8 element magnitudes (bytes 0x08, 0x19 or 0x2b), element j in byte j.
extern const uint64_t kIq2xxsGrid[256];
// IQ3_S: 512 entries, each 4 element magnitudes (odd values 1..15), element j in byte j.
extern const uint32_t kIq3sGrid[512];
// IQ2 sign patterns: 7 stored bits, the 8th makes the count of negative signs even.
extern const uint8_t kIq2xsSigns[128];
// IQ4_NL / IQ4_XS non-linear levels.
extern const int8_t kIq4nlValues[16];

}  // namespace ferry::model
