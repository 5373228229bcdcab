#include "model/cpu/cpu_backend.hpp"

#include <set>
#include <stdexcept>
#include <string>

#include "model/cpu/sampler.hpp"

namespace ferry::model {

Expected<std::unique_ptr<CpuBackend>> CpuBackend::open(const std::filesystem::path& model, CpuBackendOptions opt) {
  Expected<std::unique_ptr<Glm5Weights>> w = Glm5Weights::load(model);
  if (!w) return w.error().prefixed(model.string() + ": ");
  if (opt.max_slots == 0) return Error("max_slots is 0, expected at least 1");
  std::unique_ptr<CpuBackend> b(new CpuBackend());
  b->weights_ = std::move(w.value());
  b->pool_ = std::make_unique<ThreadPool>(opt.threads);
  b->forward_ = std::make_unique<Glm5Forward>(*b->weights_, *b->pool_);
  for (uint32_t i = 0; i < opt.max_slots; ++i) b->slots_.push_back(std::make_unique<SequenceState>(b->hparams()));
  b->max_context_ = opt.max_context != 0 ? opt.max_context : b->hparams().context_length;
  return b;
}

void CpuBackend::reset_slot(uint32_t slot) {
  if (slot >= slots_.size()) throw std::invalid_argument("slot " + std::to_string(slot) + " does not exist");
  slots_[slot]->reset();
}

std::vector<SlotResult> CpuBackend::step(const std::vector<SlotRows>& rows) {
  std::set<uint32_t> seen;
  std::vector<ForwardRows> batch;
  std::vector<size_t> first_row(rows.size(), 0);
  size_t total = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const SlotRows& r = rows[i];
    if (r.slot >= slots_.size()) throw std::invalid_argument("slot " + std::to_string(r.slot) + " does not exist");
    if (!seen.insert(r.slot).second) throw std::invalid_argument("slot " + std::to_string(r.slot) + " appears twice in one step");
    SequenceState& st = *slots_[r.slot];
    if (r.start == 0 && st.tokens() != 0) st.reset();
    if (r.start != st.tokens()) {
      throw std::invalid_argument("slot " + std::to_string(r.slot) + ": rows start at " + std::to_string(r.start) +
                                  " but the slot holds " + std::to_string(st.tokens()) + " tokens");
    }
    if (uint64_t{r.start} + r.tokens.size() > max_context_) {
      throw std::invalid_argument("slot " + std::to_string(r.slot) + ": position " +
                                  std::to_string(uint64_t{r.start} + r.tokens.size()) + " exceeds max_context " +
                                  std::to_string(max_context_));
    }
    first_row[i] = total;
    total += r.tokens.size();
    if (!r.tokens.empty()) batch.push_back({&st, r.tokens});
  }

  std::vector<float> hidden;
  forward_->forward(batch, hidden);

  // The output head (the largest matrix) is read once per step for every slot's logit rows.
  const size_t D = hparams().hidden_size, V = hparams().vocab_size;
  std::vector<size_t> logit_row0(rows.size(), 0);
  std::vector<float> head_in;
  size_t logit_rows = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const size_t n = rows[i].tokens.size();
    if (n == 0) continue;
    const size_t from = rows[i].logits_all ? 0 : n - 1;
    logit_row0[i] = logit_rows;
    logit_rows += n - from;
    const float* h = hidden.data() + (first_row[i] + from) * D;
    head_in.insert(head_in.end(), h, h + (n - from) * D);
  }
  std::vector<float> all_logits(logit_rows * V);
  forward_->logits(head_in.data(), logit_rows, all_logits.data());

  std::vector<SlotResult> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const SlotRows& r = rows[i];
    SlotResult& res = out[i];
    res.slot = r.slot;
    if (r.tokens.empty()) continue;
    const size_t n = r.tokens.size();
    const size_t from = r.logits_all ? 0 : n - 1;
    const float* mine = all_logits.data() + logit_row0[i] * V;
    std::vector<float> logits(mine, mine + (n - from) * V);
    if (r.sample) {
      const std::span<const float> last(logits.data() + (n - from - 1) * V, V);
      res.sampled = sample_token(last, r.sampling, uint64_t{r.start} + n);
    }
    if (r.logits_all || !r.sample) res.logits = std::move(logits);
  }
  return out;
}

std::string CpuBackend::describe() const { return "cpu, " + std::to_string(pool_->size()) + " threads"; }

}  // namespace ferry::model
