#include "gpu/device_weights.hpp"

#include <cmath>
#include <string>

#include "gpu/stage_sizes.hpp"
#include "model/glm5/glm5_weights.hpp"

namespace ferry::gpu {
namespace {

using model::GgmlType;
using T = model::Glm5Tensor;

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t synthetic_id(T role, int32_t layer, uint32_t expert) {
  return synthetic_tensor_id(static_cast<uint8_t>(role), layer, expert);
}

uint64_t rows_of(const model::Glm5TensorSpec& s) { return s.n_elements() / s.dims[0]; }

}  // namespace

// Where a stage's tensors come from: values of a vector in host memory, or a matrix put on the device.
class DeviceWeights::Source {
 public:
  virtual ~Source() = default;
  virtual std::vector<float> vector(const model::Glm5TensorSpec& spec) = 0;
  // Writes the matrix into `dst` (m.row_bytes * m.rows bytes); `m` says its layout.
  virtual DevMatrix layout(const model::Glm5TensorSpec& spec) = 0;
  virtual void fill(const model::Glm5TensorSpec& spec, const DevMatrix& m, uint8_t* dst, cudaStream_t s) = 0;
};

class DeviceWeights::FileSource final : public DeviceWeights::Source {
 public:
  explicit FileSource(const model::Glm5Weights& w) : w_(w) {}
  std::vector<float> vector(const model::Glm5TensorSpec& spec) override { return w_.vector(spec.role, spec.layer); }
  DevMatrix layout(const model::Glm5TensorSpec& spec) override {
    const model::WeightMatrix& m = w_.matrix(spec.role, spec.layer);
    if (m.empty()) return {};
    if (!device_supports(m.type)) {
      throw CudaError("weight " + spec.name + " has ggml type " + std::string(model::ggml_type_traits(m.type).name) +
                      ", which the CUDA kernels cannot read");
    }
    DevMatrix d;
    d.type = m.type;
    d.rows = static_cast<uint32_t>(m.rows);
    d.cols = static_cast<uint32_t>(m.cols);
    d.row_bytes = m.row_bytes;
    return d;
  }
  void fill(const model::Glm5TensorSpec& spec, const DevMatrix& m, uint8_t* dst, cudaStream_t s) override {
    FERRY_CUDA(cudaMemcpyAsync(dst, w_.matrix(spec.role, spec.layer).data, m.bytes(), cudaMemcpyHostToDevice, s));
    FERRY_CUDA(cudaStreamSynchronize(s));  // the source is pageable: the copy is done when it returns
  }

 private:
  const model::Glm5Weights& w_;
};

// Synthetic values: matrices of the chosen type (F32 where the catalogue keeps a tensor f32, Q8_0 or
// F32 where rows are not whole blocks) about +-sqrt(3/cols); small state of plausible size by role.
class DeviceWeights::Synthesizer final : public DeviceWeights::Source {
 public:
  explicit Synthesizer(const SyntheticModel& m) : m_(m) {
    if (!device_supports(m.type)) {
      throw CudaError("synthetic weights of type " + std::string(model::ggml_type_traits(m.type).name) +
                      ": the CUDA kernels cannot read it");
    }
  }
  std::vector<float> vector(const model::Glm5TensorSpec& spec) override {
    float centre = 1.0f, spread = 0.1f;  // norms
    switch (spec.role) {
      case T::hc_attn_base: case T::hc_ffn_base: case T::ssm_conv1d_q: case T::ssm_conv1d_k: case T::ssm_conv1d_v:
      case T::indexer_compressor_ape: centre = 0.0f, spread = 0.5f; break;
      case T::hc_attn_scale: case T::hc_ffn_scale: spread = 0.2f; break;
      case T::ssm_dt_bias: centre = -3.0f, spread = 1.0f; break;
      case T::indexer_k_norm_bias: centre = 0.0f; break;
      case T::ffn_exp_probs_b: centre = 0.0f, spread = 0.01f; break;
      default: break;
    }
    uint64_t h = mix64(m_.seed ^ synthetic_id(spec.role, spec.layer, 0));
    std::vector<float> v(spec.n_elements());
    for (float& x : v) {
      h = mix64(h);
      const float u = static_cast<float>(h >> 40) * (2.0f / 16777216.0f) - 1.0f;  // [-1, 1)
      x = spec.role == T::ssm_a ? -std::exp(0.5f + 0.5f * u) : centre + spread * u;
    }
    if (spec.role == T::ffn_exp_probs_b && m_.route_skew > 0) {
      // The layer's experts in a random order (Fisher-Yates on the same hash): rank r gets -skew*ln(r).
      std::vector<uint32_t> order(v.size());
      for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
      for (size_t i = order.size(); i > 1; --i) {
        h = mix64(h);
        std::swap(order[i - 1], order[h % i]);
      }
      for (size_t r = 0; r < order.size(); ++r) v[order[r]] -= m_.route_skew * std::log(static_cast<float>(r + 1));
    }
    return v;
  }
  DevMatrix layout(const model::Glm5TensorSpec& spec) override {
    const uint64_t cols = spec.dims[0];
    const GgmlType t = synthetic_tensor_type(spec, m_.type, m_.rules);
    if (!device_supports(t)) {
      throw CudaError("synthetic weight " + spec.name + " of type " + std::string(model::ggml_type_traits(t).name) +
                      " (--recipe): the CUDA kernels cannot read it");
    }
    DevMatrix d;
    d.type = t;
    d.rows = static_cast<uint32_t>(rows_of(spec));
    d.cols = static_cast<uint32_t>(cols);
    d.row_bytes = *model::ggml_bytes(t, cols);
    return d;
  }
  void fill(const model::Glm5TensorSpec& spec, const DevMatrix& m, uint8_t* dst, cudaStream_t s) override {
    const float amplitude = std::sqrt(3.0f / static_cast<float>(m.cols));
    if (!spec.expert) {
      synth_fill(m.type, dst, m.rows, m.cols, m.row_bytes, m_.seed, synthetic_id(spec.role, spec.layer, 0), amplitude, s);
      return;
    }
    const uint32_t experts = static_cast<uint32_t>(spec.dims.back());
    const size_t rows = m.rows / experts;
    for (uint32_t e = 0; e < experts; ++e) {
      synth_fill(m.type, dst + e * rows * m.row_bytes, rows, m.cols, m.row_bytes, m_.seed,
                 synthetic_id(spec.role, spec.layer, e), amplitude, s);
    }
  }

 private:
  const SyntheticModel& m_;
};

DeviceWeights::DeviceWeights(const model::Glm5Hparams& hp, model::LayerRange layers, bool routed_experts,
                             Source& source, cudaStream_t stream)
    : first_(layers.first) {
  auto upload_vector = [&](const std::vector<float>& v) -> const float* {
    if (v.empty()) return nullptr;
    buffers_.emplace_back(v.size() * sizeof(float));
    bytes_ += buffers_.back().bytes();
    float* p = buffers_.back().as<float>();
    FERRY_CUDA(cudaMemcpyAsync(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
    FERRY_CUDA(cudaStreamSynchronize(stream));  // `v` is pageable and goes away
    return p;
  };
  auto upload_matrix = [&](const model::Glm5TensorSpec& spec) -> DevMatrix {
    DevMatrix m = source.layout(spec);
    if (m.rows == 0) return {};
    buffers_.emplace_back(m.bytes());
    bytes_ += m.bytes();
    source.fill(spec, m, buffers_.back().as<uint8_t>(), stream);
    m.data = buffers_.back().as<uint8_t>();
    return m;
  };
  for (const model::Glm5TensorSpec& spec : model::glm5_global_tensors(hp)) {
    const bool wanted = spec.role == T::token_embd ? layers.first == 0 : layers.end == hp.n_layers;
    if (!wanted) continue;
    if (spec.role == T::output_norm) output_norm = upload_vector(source.vector(spec));
    else (spec.role == T::token_embd ? token_embd : output) = upload_matrix(spec);
  }
  for (uint32_t il = layers.first; il < layers.end; ++il) {
    DevLayer& l = layers_.emplace_back();
    l.index = il;
    l.kind = model::glm5_layer_kind(hp, il);
    l.ffn = model::glm5_ffn_kind(hp, il);
    l.has_indexer = model::glm5_has_indexer(hp, il);
    std::vector<float> conv;
    for (const model::Glm5TensorSpec& spec : model::glm5_layer_tensors(hp, il)) {
      const size_t r = static_cast<size_t>(spec.role);
      if (spec.expert && !routed_experts) continue;
      if (!model::glm5_tensor_is_vector(spec.role)) {
        l.matrices[r] = upload_matrix(spec);
      } else if (spec.role == T::ssm_conv1d_q || spec.role == T::ssm_conv1d_k || spec.role == T::ssm_conv1d_v) {
        const std::vector<float> taps = source.vector(spec);  // the catalogue lists q, k, v in order
        conv.insert(conv.end(), taps.begin(), taps.end());
      } else {
        l.vectors[r] = upload_vector(source.vector(spec));
      }
    }
    l.conv = upload_vector(conv);
  }
  FERRY_CUDA(cudaStreamSynchronize(stream));
}

DeviceWeights DeviceWeights::upload(const model::Glm5Weights& weights, model::LayerRange layers, bool routed_experts,
                                    cudaStream_t stream) {
  FileSource source(weights);
  return DeviceWeights(weights.hparams(), layers, routed_experts, source, stream);
}

DeviceWeights DeviceWeights::synthesize(const SyntheticModel& model, model::LayerRange layers, bool routed_experts,
                                        cudaStream_t stream) {
  Synthesizer source(model);
  return DeviceWeights(model.hparams, layers, routed_experts, source, stream);
}

uint64_t DeviceWeights::decode_bytes(uint32_t experts_used, uint32_t experts) const {
  uint64_t b = output.bytes() + token_embd.row_bytes;
  for (const DevLayer& l : layers_) {
    for (size_t r = 0; r < l.matrices.size(); ++r) {
      const T role = static_cast<T>(r);
      const bool expert = role == T::ffn_gate_exps || role == T::ffn_up_exps || role == T::ffn_down_exps;
      b += expert ? l.matrices[r].bytes() / experts * experts_used : l.matrices[r].bytes();
    }
  }
  return b;
}

}  // namespace ferry::gpu
