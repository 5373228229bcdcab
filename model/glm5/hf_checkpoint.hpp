#pragma once
// A Hugging Face checkpoint directory opened for conversion: the tensors of its safetensors files
// (model/formats/safetensors.hpp: one model.safetensors or the shards of model.safetensors.index.json) plus
// any other *.safetensors beside them for names the main set lacks (releases ship an MTP shard that
// way), and their elements read as f32 on demand.
//
// Readable element types: F32, F16, BF16, and F8_E4M3 with block scales, the FP8 release format of
// DeepSeek-V3 and GLM: `X.weight` in float8_e4m3fn and `X.weight_scale_inv` (f32) of shape
// [ceil(rows/b0), ceil(cols/b1)], with config.json quantization_config.weight_block_size = [b0, b1]
// (128 x 128); the weight is fp8 * scale_inv of its block.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "model/formats/safetensors.hpp"
#include "model/glm5/glm5_hparams.hpp"

namespace ferry::model {

// FP8 block scales of one weight.
struct HfFp8Scale {
  const SafetensorsTensor* scale_inv = nullptr;  // [ceil(rows / block_rows), ceil(cols / block_cols)]
  uint64_t rows = 0, cols = 0;                   // the weight as a matrix: the last dim is cols
  uint32_t block_rows = 128, block_cols = 128;
};

class HfCheckpoint {
 public:
  // The error names the file and what was wrong.
  static Expected<HfCheckpoint> open(const std::filesystem::path& dir);

  HfCheckpoint(HfCheckpoint&&) noexcept = default;
  HfCheckpoint& operator=(HfCheckpoint&&) noexcept = default;

  const SafetensorsTensor* find(std::string_view name) const;
  // Every tensor by name.
  const std::map<std::string, const SafetensorsTensor*, std::less<>>& tensors() const { return by_name_; }

 private:
  HfCheckpoint() = default;
  std::vector<Safetensors> sets_;
  std::map<std::string, const SafetensorsTensor*, std::less<>> by_name_;
};

// Drops the pages of `t` from this process's memory (they stay in the page cache and come back when
// read again), so that converting a checkpoint larger than RAM keeps a small resident set.
void hf_release(const SafetensorsTensor& t);

// True for the dtypes hf_read_f32 decodes.
bool hf_readable(SafetensorsDtype dtype);

// Decodes elements [first, first + n) of `t` (row-major) into `out`. F8_E4M3 needs `scale`; the
// caller checks that the dtype is readable and the range is inside the tensor.
void hf_read_f32(const SafetensorsTensor& t, uint64_t first, uint64_t n, float* out,
                 const HfFp8Scale* scale = nullptr);

}  // namespace ferry::model
