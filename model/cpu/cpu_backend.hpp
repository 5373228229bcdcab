#pragma once
// The CPU reference backend: the whole model on this machine's cores, exact (f32 compute from any
// GGUF weight type), one SequenceState per slot. What CI runs, what machines without a GPU serve with,
// and the ground truth the CUDA backend is checked against.
#include <filesystem>
#include <memory>
#include <vector>

#include "model/backend.hpp"
#include "model/cpu/glm5_forward.hpp"
#include "model/cpu/sequence_state.hpp"
#include "model/cpu/thread_pool.hpp"
#include "model/glm5/glm5_weights.hpp"

namespace ferry::model {

struct CpuBackendOptions {
  unsigned threads = 0;      // 0: every hardware thread
  uint32_t max_slots = 4;
  uint32_t max_context = 0;  // 0: the model's trained context (hparams.context_length)
};

class CpuBackend final : public Backend {
 public:
  // Loads the GGUF file; the error names the file and what was wrong with it.
  static Expected<std::unique_ptr<CpuBackend>> open(const std::filesystem::path& model, CpuBackendOptions opt = {});

  const Glm5Hparams& hparams() const override { return weights_->hparams(); }
  uint32_t max_slots() const override { return static_cast<uint32_t>(slots_.size()); }
  uint32_t max_context() const override { return max_context_; }
  void reset_slot(uint32_t slot) override;
  // Rows of one step run as one batch. A row's `start` must be 0 (the slot starts over) or the
  // number of tokens the slot holds; anything else, an unknown slot, the same slot twice, or a
  // position past max_context throws std::invalid_argument (caller bugs: the scheduler checks first).
  // Logits come back when logits_all (every row) or when sample is false (the last row).
  std::vector<SlotResult> step(const std::vector<SlotRows>& rows) override;
  std::string describe() const override;

  // Beyond the Backend interface: the model itself and a slot's state (evaluation, MTP drafts).
  Glm5Forward& model() { return *forward_; }
  const Glm5Weights& weights() const { return *weights_; }
  SequenceState& slot_state(uint32_t slot) { return *slots_.at(slot); }
  ThreadPool& pool() { return *pool_; }

 private:
  CpuBackend() = default;
  std::unique_ptr<Glm5Weights> weights_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<Glm5Forward> forward_;
  std::vector<std::unique_ptr<SequenceState>> slots_;
  uint32_t max_context_ = 0;
};

}  // namespace ferry::model
