#include "gpu/step_input.hpp"

#include <algorithm>

namespace ferry::gpu {

static_assert(sizeof(SampleRow) == 8 * sizeof(int32_t));

StepInput::StepInput(uint32_t max_rows)
    : max_rows_(max_rows),
      host_((9 * size_t{max_rows} + 2 + 8 * size_t{max_rows} + max_rows) * sizeof(int32_t)),
      sampled_host_(max_rows * sizeof(int32_t)),
      device_(host_.bytes()) {}

StepGeometry StepInput::stage(const std::vector<model::SlotRows>& rows, bool head, uint32_t logit_batch,
                              cudaStream_t stream) {
  // The previous step's upload reads the same pinned buffer: it must have happened.
  if (pending_) FERRY_CUDA(cudaEventSynchronize(uploaded_.get()));
  const size_t M = max_rows_;
  int32_t* mh = host_.as<int32_t>();
  int32_t *h_tokens = mh, *h_slot = mh + M, *h_pos = mh + 2 * M, *h_first = mh + 3 * M;
  int32_t *h_sslot = mh + 4 * M, *h_sstart = mh + 5 * M, *h_slen = mh + 6 * M, *h_sfirst = mh + 7 * M;
  int32_t* h_lrows = mh + 8 * M;
  SampleRow* h_sample = reinterpret_cast<SampleRow*>(mh + sample_at());
  StepGeometry g;
  wants_.clear();
  decode_only_ = true;
  for (size_t i = 0; i < rows.size(); ++i) {
    const model::SlotRows& r = rows[i];
    const auto n = static_cast<uint32_t>(r.tokens.size());
    if (n == 0) {
      decode_only_ = false;  // a graph's results are one per row set
      continue;
    }
    h_sslot[g.segments] = static_cast<int32_t>(r.slot);
    h_sstart[g.segments] = static_cast<int32_t>(r.start);
    h_slen[g.segments] = static_cast<int32_t>(n);
    h_sfirst[g.segments] = static_cast<int32_t>(g.rows);
    for (uint32_t t = 0; t < n; ++t) {
      h_tokens[g.rows + t] = r.tokens[t];
      h_slot[g.rows + t] = static_cast<int32_t>(r.slot);
      h_pos[g.rows + t] = static_cast<int32_t>(r.start + t);
      h_first[g.rows + t] = static_cast<int32_t>(g.rows);
    }
    if (head) {
      // A verify set draws from each of its last verify + 1 rows, each at its own position.
      const uint32_t draws_from = n - 1 - std::min(r.verify, n - 1);
      for (uint32_t t = r.logits_all ? 0 : draws_from; t < n; ++t) {
        const bool draw = t >= draws_from && r.sample;
        SampleRow& sr = h_sample[wants_.size()];
        sr = SampleRow{};
        sr.logit_row = static_cast<int32_t>(wants_.size() % logit_batch);
        if (draw) {
          sr.temperature = r.sampling.temperature;
          sr.top_p = r.sampling.top_p;
          sr.min_p = r.sampling.min_p;
          sr.top_k = r.sampling.top_k;
          sr.seed = r.sampling.seed;
          sr.position = r.start + t + 1;
        }
        wants_.push_back({i, g.rows + t, model::returns_logits(r), draw});
      }
    }
    if (n != 1 + r.verify || model::returns_logits(r) || r.start == 0) decode_only_ = false;
    g.max_seg_rows = std::max(g.max_seg_rows, n);
    g.rows += n;
    ++g.segments;
  }
  for (size_t j = 0; j < wants_.size(); ++j) h_lrows[j] = static_cast<int32_t>(wants_[j].row);
  const size_t ints = head ? sample_at() + 8 * wants_.size() : 8 * M;
  FERRY_CUDA(cudaMemcpyAsync(device_.get(), mh, ints * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  uploaded_.record(stream);
  pending_ = true;
  int32_t* dm = device_.as<int32_t>();
  g.row = {dm + M, dm + 2 * M, dm + 3 * M};
  g.seg = {dm + 4 * M, dm + 5 * M, dm + 6 * M, dm + 7 * M};
  return g;
}

}  // namespace ferry::gpu
