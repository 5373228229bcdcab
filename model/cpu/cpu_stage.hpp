#pragma once
// The CPU reference stage: trunk layers [first, end) on this machine's cores, exact (f32 compute from
// any GGUF weight type), one SequenceState per slot holding those layers' state. What CI runs, what
// machines without a GPU serve with, and the ground truth the CUDA stage is checked against. Stages
// of one model share its mapped weights and one thread pool.
#include <memory>
#include <optional>
#include <vector>

#include "model/cpu/cpu_mtp.hpp"
#include "model/cpu/glm5_forward.hpp"
#include "model/cpu/sequence_state.hpp"
#include "model/cpu/thread_pool.hpp"
#include "model/glm5/glm5_weights.hpp"
#include "model/stage.hpp"

namespace ferry::model {

struct CpuStageOptions {
  uint32_t max_slots = 4;
  uint32_t max_context = 0;              // 0: the model's trained context (hparams.context_length)
  uint32_t max_step_rows = 1u << 20;     // the CPU takes steps of any size its memory allows
  config::KvFormats kv;                  // the DSA caches' row formats (f32: the reference)
  bool mtp = false;                      // the last stage runs the model's MTP block (drafts)
};

class CpuStage final : public Stage {
 public:
  CpuStage(std::shared_ptr<const Glm5Weights> weights, std::shared_ptr<ThreadPool> pool, LayerRange layers,
           const CpuStageOptions& options);

  const Glm5Hparams& hparams() const override { return weights_->hparams(); }
  LayerRange layers() const override { return layers_; }
  uint32_t max_slots() const override { return static_cast<uint32_t>(slots_.size()); }
  uint32_t max_context() const override { return max_context_; }
  uint32_t max_step_rows() const override { return max_step_rows_; }
  Status connect(Stage&) override { return std::nullopt; }  // the handoff is host memory
  Status reset_slot(uint32_t slot) override;
  Expected<StageOutput> run(const std::vector<SlotRows>& rows, const Handoff* in) override;
  void discard(const Handoff&) override {}  // host memory: nobody waits for it
  Expected<SlotStateImage> save_slot(uint32_t slot, bool with_rows) override;
  Status restore_slot(uint32_t slot, const SlotStateImage& image) override;
  const SlotStateLayout& state_layout() const override { return layout_; }
  StageCounters counters() const override { return counters_; }
  bool drafts() const override { return mtp_.has_value(); }
  std::string describe() const override;

 private:
  DsaCache& cache_of(SequenceState& state, const StatePartSpec& part);
  std::vector<SlotResult> head(const std::vector<SlotRows>& rows, const float* streams);
  // Before a slot's rows: back to the state kept at a verify set's start when the rows start there;
  // a verify set keeps the state at its own start.
  Status prepare_rollback(const SlotRows& r);
  // A verify row set's start state, until the slot's next rows.
  struct Kept {
    SlotStateImage image;
    std::vector<float> mtp_pending;
  };

  std::shared_ptr<const Glm5Weights> weights_;
  std::shared_ptr<ThreadPool> pool_;
  LayerRange layers_;
  Glm5Forward forward_;
  SlotStateLayout layout_;
  std::vector<std::unique_ptr<SequenceState>> slots_;
  std::vector<std::optional<Kept>> kept_;
  std::optional<CpuMtp> mtp_;  // on a last stage asked to run the model's MTP block
  uint32_t max_context_ = 0;
  uint32_t max_step_rows_ = 0;
  StageCounters counters_;
};

// One CPU stage per range (the ranges cover the trunk in order), sharing the weights and `threads`
// worker threads (0: every core).
std::vector<std::shared_ptr<Stage>> make_cpu_stages(std::shared_ptr<const Glm5Weights> weights,
                                                    const std::vector<LayerRange>& ranges, unsigned threads,
                                                    const CpuStageOptions& options);

}  // namespace ferry::model
