#include "gpu/expert_source.hpp"

#include <cmath>
#include <cstring>

#include "gpu/stage_sizes.hpp"
#include "model/glm5/glm5_tensors.hpp"
#include "model/glm5/glm5_weights.hpp"

namespace ferry::gpu {
namespace {

using T = model::Glm5Tensor;
constexpr T kParts[3] = {T::ffn_gate_exps, T::ffn_up_exps, T::ffn_down_exps};

ExpertShape make_shape(const DevMatrix (&parts)[3]) {
  ExpertShape s;
  s.gate = parts[0];
  s.up = parts[1];
  s.down = parts[2];
  s.up_offset = s.gate.bytes();
  s.down_offset = s.up_offset + s.up.bytes();
  s.bytes = s.down_offset + s.down.bytes();
  return s;
}

class FileExperts final : public ExpertSource {
 public:
  explicit FileExperts(const model::Glm5Weights& w) : w_(w) {}
  ExpertShape shape(uint32_t layer) const override {
    DevMatrix parts[3];
    for (int p = 0; p < 3; ++p) {
      const model::WeightMatrix& m = w_.matrix(kParts[p], static_cast<int32_t>(layer));
      parts[p].type = m.type;
      parts[p].rows = static_cast<uint32_t>(m.rows / w_.hparams().n_experts);
      parts[p].cols = static_cast<uint32_t>(m.cols);
      parts[p].row_bytes = m.row_bytes;
    }
    return make_shape(parts);
  }
  void write(uint32_t layer, uint32_t expert, uint8_t* dst, bool on_device, cudaStream_t stream) override {
    const ExpertShape s = shape(layer);
    const uint64_t offsets[3] = {0, s.up_offset, s.down_offset};
    const DevMatrix* parts[3] = {&s.gate, &s.up, &s.down};
    for (int p = 0; p < 3; ++p) {
      const uint8_t* src = w_.matrix(kParts[p], static_cast<int32_t>(layer)).data + expert * parts[p]->bytes();
      if (on_device) {
        FERRY_CUDA(cudaMemcpyAsync(dst + offsets[p], src, parts[p]->bytes(), cudaMemcpyHostToDevice, stream));
      } else {
        std::memcpy(dst + offsets[p], src, parts[p]->bytes());
      }
    }
    if (on_device) FERRY_CUDA(cudaStreamSynchronize(stream));  // the source is pageable
  }

 private:
  const model::Glm5Weights& w_;
};

// Made on the device as DeviceWeights makes a stacked expert tensor, expert by expert: same bytes.
class SyntheticExperts final : public ExpertSource {
 public:
  explicit SyntheticExperts(const SyntheticModel& m) : m_(m) {}
  ExpertShape shape(uint32_t layer) const override {
    DevMatrix parts[3];
    for (int p = 0; p < 3; ++p) {
      const auto spec = model::glm5_find_tensor(m_.hparams, kParts[p], static_cast<int32_t>(layer));
      parts[p].type = synthetic_tensor_type(*spec, m_.type, m_.rules);
      parts[p].cols = static_cast<uint32_t>(spec->dims[0]);
      parts[p].rows = static_cast<uint32_t>(spec->dims[1]);
      parts[p].row_bytes = *model::ggml_bytes(parts[p].type, parts[p].cols);
    }
    return make_shape(parts);
  }
  void write(uint32_t layer, uint32_t expert, uint8_t* dst, bool on_device, cudaStream_t stream) override {
    const ExpertShape s = shape(layer);
    uint8_t* out = dst;
    if (!on_device) {
      if (scratch_.bytes() < s.bytes) scratch_ = DeviceBuffer(s.bytes);
      out = scratch_.as<uint8_t>();
    }
    const uint64_t offsets[3] = {0, s.up_offset, s.down_offset};
    const DevMatrix* parts[3] = {&s.gate, &s.up, &s.down};
    for (int p = 0; p < 3; ++p) {
      const DevMatrix& m = *parts[p];
      synth_fill(m.type, out + offsets[p], m.rows, m.cols, m.row_bytes, m_.seed,
                 synthetic_tensor_id(static_cast<uint8_t>(kParts[p]), static_cast<int32_t>(layer), expert),
                 std::sqrt(3.0f / static_cast<float>(m.cols)), stream);
    }
    if (!on_device) FERRY_CUDA(cudaMemcpyAsync(dst, out, s.bytes, cudaMemcpyDeviceToHost, stream));
    FERRY_CUDA(cudaStreamSynchronize(stream));
  }

 private:
  const SyntheticModel& m_;
  DeviceBuffer scratch_;
};

}  // namespace

std::unique_ptr<ExpertSource> file_experts(const model::Glm5Weights& weights) {
  return std::make_unique<FileExperts>(weights);
}

std::unique_ptr<ExpertSource> synthetic_experts(const SyntheticModel& model) {
  return std::make_unique<SyntheticExperts>(model);
}

}  // namespace ferry::gpu
