#pragma once
// The CUDA stage: trunk layers [first, end) on one device, behind model::Stage. Its weights, its
// slots' state for those layers and its step workspace live in that device's memory; a step is one
// pass over the rows on the stage's compute stream (a decode step of up to 8 rows replayed from a
// captured graph), and the output goes to the next stage on its copy stream (gpu/handoff.hpp). Every
// call sets the stage's device on the calling thread, so stages on several devices run from several
// threads at once. CUDA failures come back as ferry::Error values: device_error / device_lost leave
// the stage dead (every later call answers that error).
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "config/kv_type.hpp"
#include <string>

#include "gpu/device_weights.hpp"
#include "gpu/host_expert_store.hpp"
#include "gpu/op_times.hpp"
#include "gpu/stage_experts.hpp"
#include "model/stage.hpp"

namespace ferry::model {
class Glm5Weights;
}

namespace ferry::gpu {

// A stage whose device holds only some of its routed experts: the host store it shares with the
// other stages, and what its own pool starts with.
struct StageExpertTiers {
  std::shared_ptr<HostExpertStore> host;
  StageExpertsPlan plan;
};

struct CudaStageOptions {
  int device = 0;
  uint32_t max_slots = 4;
  uint32_t max_context = 8192;
  uint32_t max_step_rows = 2048;  // rows of one step (a prefill chunk plus decode rows)
  bool graphs = true;             // replay decode steps from CUDA graphs
  // Programmatic Dependent Launch in those graphs where the build and device have it (gpu/pdl.hpp);
  // FERRY_PDL=0 in the environment also turns it off.
  bool pdl = true;
  // A decode step's work that feeds only a later kernel on forked branches beside the chain (the mHC
  // sites' comb, KDA's q/k/v and convolution, a DSA layer's indexer: gpu/stream_branch.hpp); off: one
  // chain, the same bits (the tests compare the two).
  bool decode_branches = true;
  config::KvFormats kv;           // DSA row formats: latent f32 | f16 | int8, indexer keys/gates f32
  uint32_t kv_resident = 0;       // latent rows per DSA layer and slot on the device (0: the whole context)
  std::optional<StageExpertTiers> tiers;  // none: every routed expert of the stage on the device
  // Speculative decoding: every stage keeps a verify set's start state (gpu/verify_keep.hpp); the
  // last one runs the model's MTP block, when it has one (gpu/mtp_block.hpp).
  bool mtp = false;
};

struct DeviceMemoryReport {
  uint64_t weight_bytes = 0;  // the stage's weights
  uint64_t state_bytes = 0;   // its slots' state and caches
  uint64_t work_bytes = 0;    // its step workspace and hand-off inbox
  uint64_t peak_bytes = 0;    // the device's used memory at its highest seen (cudaMemGetInfo)
};

struct StepTrace;  // gpu/step_trace.hpp

class CudaStage final : public model::Stage {
 public:
  // Both return out_of_memory, unsupported (a weight type or shape the kernels cannot run) or a
  // device error naming what failed.
  static Expected<std::unique_ptr<CudaStage>> from_weights(const model::Glm5Weights& weights, model::LayerRange layers,
                                                           const CudaStageOptions& options);
  static Expected<std::unique_ptr<CudaStage>> synthetic(const SyntheticModel& model, model::LayerRange layers,
                                                        const CudaStageOptions& options);
  ~CudaStage() override;

  const model::Glm5Hparams& hparams() const override;
  model::LayerRange layers() const override;
  uint32_t max_slots() const override;
  uint32_t max_context() const override;
  uint32_t max_step_rows() const override;
  Status connect(model::Stage& next) override;
  Status reset_slot(uint32_t slot) override;
  Expected<model::StageOutput> run(const std::vector<model::SlotRows>& rows, const model::Handoff* in) override;
  void discard(const model::Handoff& in) override;
  Expected<model::SlotStateImage> save_slot(uint32_t slot, bool with_rows) override;
  Status restore_slot(uint32_t slot, const model::SlotStateImage& image) override;
  const model::SlotStateLayout& state_layout() const override;
  model::StageCounters counters() const override;
  model::ExpertTier* experts() override;
  bool drafts() const override;
  std::string describe() const override;

  // The MTP block's logits of every entry it makes from now on, for `ferry eval-ref` (with the block
  // only; rows in the order the entries are made); take_mtp_logits() hands them over.
  void record_mtp_logits(bool on);
  std::vector<float> take_mtp_logits();
  // Per-op times of every eager step from now on (gpu/op_times.hpp; decode graphs are not timed);
  // take_op_times() hands over the totals since the last call.
  void time_ops(bool on);
  OpTimeTotals take_op_times();
  // Every step from now on runs eagerly and appends its DSA selections and MoE routes to `trace`
  // (tests against the CPU's choices); null: graphs again, nothing recorded.
  void trace_steps(StepTrace* trace);
  // CUDA graphs the MTP block's pass and drafting replay from (0 without the block or graphs).
  size_t mtp_graphs() const;
  // Prefill past the resident window (gpu/prefill_gather.hpp; all 0 without one): attention launches
  // over the staging (groups of a step's rows, per DSA layer), rows gathered there, of them from the host tier.
  struct PrefillGatherCounts {
    uint64_t groups = 0, rows = 0, tier_rows = 0;
  };
  PrefillGatherCounts prefill_gather_counts() const;

  // The trunk's decode graphs captured so far, and their PDL edges (gpu/pdl.hpp).
  size_t decode_graphs() const;
  size_t decode_graph_pdl_edges() const;
  // The kernels of the decode graph of a step of `rows` rows in `segments` segments (the longest
  // `longest_segment` rows), in launch order; empty when no such graph was captured.
  std::vector<std::string> decode_graph_kernels(uint32_t rows, uint32_t segments, uint32_t longest_segment) const;

  int device() const;
  std::string device_name() const;
  bool synthetic_weights() const;
  // "peer-to-peer", "same device", ... of the link to the next stage; empty on the last stage.
  std::string handoff_path() const;
  DeviceMemoryReport memory() const;
  // Bytes a decode step of one row reads at sequence depth `depth`: the stage's dense weights, the
  // chosen experts (wherever they are), the head, the KDA state and the DSA rows it touches.
  uint64_t decode_bytes_per_token(uint64_t depth) const;

 private:
  struct Impl;
  explicit CudaStage(std::unique_ptr<Impl> impl);
  // An Impl on its device, `load` putting the weights there; CUDA failures as errors.
  static Expected<std::unique_ptr<Impl>> make_impl(const model::Glm5Hparams& hp, model::LayerRange layers,
                                                   const CudaStageOptions& options,
                                                   const std::function<void(Impl&)>& load);
  std::unique_ptr<Impl> impl_;
};


}  // namespace ferry::gpu
