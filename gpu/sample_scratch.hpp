#pragma once
// The token sampler's device scratch on the last stage (gpu::sample_scratch_bytes): a plain constant,
// so that the memory plan (stage_sizes.cpp, built without CUDA) and the kernels (sampling_grid.cu,
// built as C++17, which checks that its layout fits) read the same number.
#include <cstdint>

namespace ferry::gpu {
inline constexpr uint64_t kSampleScratchBytes = uint64_t{2} << 20;
}  // namespace ferry::gpu
