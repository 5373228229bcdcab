#include "gpu/head_sampling.hpp"

#include <algorithm>

namespace ferry::gpu {

Head::Head(const model::Glm5Hparams& hp, const DeviceWeights& weights, Workspace& work, LayerRunner& runner,
           cudaStream_t stream)
    : hp_(hp), weights_(weights), w_(work), runner_(runner), s_(stream) {}

void Head::logits(const int32_t* row_idx, uint32_t count) {
  hc_head(w_.R, row_idx, count, hp_.hc_mult, hp_.hidden_size, weights_.output_norm, hp_.rms_eps, w_.xo, s_);
  runner_.mm(weights_.output, w_.xo, hp_.hidden_size, count, w_.logits, hp_.vocab_size);
}

void Head::decode(const StepInput& in, uint32_t rows) {
  logits(in.logit_rows(), rows);
  sample_rows(w_.logits, hp_.vocab_size, in.sample_rows(), rows, in.sampled(), w_.sample_scratch, s_);
}

std::vector<model::SlotResult> Head::decode_results(const std::vector<model::SlotRows>& rows, const StepInput& in) {
  const std::vector<LogitRow>& wants = in.logit_list();
  int32_t* sampled = in.sampled_host();
  FERRY_CUDA(cudaMemcpyAsync(sampled, in.sampled(), wants.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, s_));
  FERRY_CUDA(cudaStreamSynchronize(s_));
  std::vector<std::vector<int32_t>> draws(rows.size());
  for (size_t j = 0; j < wants.size(); ++j) draws[wants[j].source].push_back(sampled[j]);
  std::vector<model::SlotResult> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    out[i].slot = rows[i].slot;
    accept(rows[i], draws[i], out[i]);
  }
  return out;
}

void Head::accept(const model::SlotRows& r, const std::vector<int32_t>& draws, model::SlotResult& out) {
  if (draws.empty()) return;
  // Drafts are accepted while each equals the draw before it (model/step.hpp: SlotRows::verify).
  const size_t n = r.tokens.size();
  uint32_t a = 0;
  while (a < r.verify && a + 1 < draws.size() && r.tokens[n - r.verify + a] == draws[a]) ++a;
  out.sampled = draws[a];
  out.accepted = a;
}

std::vector<model::SlotResult> Head::results(const std::vector<model::SlotRows>& rows, const StepInput& in) {
  std::vector<model::SlotResult> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) out[i].slot = rows[i].slot;
  const std::vector<LogitRow>& wants = in.logit_list();
  int32_t* sampled = in.sampled_host();
  std::vector<float> host_logits;
  std::vector<std::vector<int32_t>> draws(rows.size());  // per row set, in row order
  const size_t V = hp_.vocab_size;
  for (size_t j0 = 0; j0 < wants.size(); j0 += w_.logit_rows) {
    const auto cnt = static_cast<uint32_t>(std::min<size_t>(w_.logit_rows, wants.size() - j0));
    logits(in.logit_rows() + j0, cnt);
    sample_rows(w_.logits, hp_.vocab_size, in.sample_rows() + j0, cnt, in.sampled(), w_.sample_scratch, s_);
    FERRY_CUDA(cudaMemcpyAsync(sampled, in.sampled(), cnt * sizeof(int32_t), cudaMemcpyDeviceToHost, s_));
    const bool any_keep = std::any_of(wants.begin() + j0, wants.begin() + j0 + cnt, [](const LogitRow& x) { return x.keep; });
    if (any_keep) {
      host_logits.resize(size_t{cnt} * V);
      FERRY_CUDA(cudaMemcpyAsync(host_logits.data(), w_.logits, host_logits.size() * sizeof(float),
                                 cudaMemcpyDeviceToHost, s_));
    }
    FERRY_CUDA(cudaStreamSynchronize(s_));
    for (uint32_t j = 0; j < cnt; ++j) {
      const LogitRow& wt = wants[j0 + j];
      model::SlotResult& res = out[wt.source];
      const float* lg = host_logits.data() + size_t{j} * V;
      if (wt.keep) res.logits.insert(res.logits.end(), lg, lg + V);
      if (wt.draw) draws[wt.source].push_back(sampled[j]);
    }
  }
  for (size_t i = 0; i < rows.size(); ++i) accept(rows[i], draws[i], out[i]);
  return out;
}

}  // namespace ferry::gpu
