#pragma once
// A stage: the trunk layers [first, end) of the model on one device (or the CPU), with its slots'
// state for those layers. Stage 0 embeds the rows' tokens; the last stage runs the final norm, the
// head and sampling. Between stages travel the rows' mHC residual streams ([rows][hc_mult][hidden]
// f32) as a Handoff: the sender makes it, the receiver reads it once. The CPU reference (model/cpu)
// and the CUDA stage (gpu/) implement this; model::Pipeline runs stages in order on one thread, the
// stage actors (actors/) run each on its own thread so that stages work on different steps at once.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/expected.hpp"
#include "config/stage_split.hpp"
#include "model/expert_tier.hpp"
#include "model/glm5/glm5_hparams.hpp"
#include "model/slot_state.hpp"
#include "model/step.hpp"

namespace ferry::model {

using config::LayerRange;

// The output of one stage for the next. What it holds depends on the backend (host memory for the
// CPU, a slot of the receiver's inbox on a GPU): only the stage after the sender reads it.
class Handoff {
 public:
  virtual ~Handoff() = default;
  virtual uint32_t rows() const = 0;
  virtual uint64_t bytes() const = 0;
};

struct StageOutput {
  std::shared_ptr<const Handoff> handoff;  // every stage but the last
  std::vector<SlotResult> results;         // the last stage: one per SlotRows of the step, in order
};

// What a stage has done so far, for /metrics, /health and `ferry bench`.
struct StageCounters {
  uint64_t steps = 0;
  uint64_t rows = 0;
  uint64_t handoff_bytes = 0;   // sent to the next stage
  uint64_t handoffs_timed = 0;  // of those copies, the ones whose device time is in handoff_ms
  double handoff_ms = 0;
  double compute_ms = 0;        // wall time inside run()
  // The GPU resident KV window (gpu/kv_window.hpp): all zero where every row stays on the stage's
  // device (the CPU backend, or a context no larger than --kv-resident).
  uint64_t kv_window_rows = 0;     // device rows of the windows (DSA layers x slots x --kv-resident)
  uint64_t kv_resident_rows = 0;   // of those, holding a row now
  uint64_t kv_windowed_steps = 0;  // steps that ran the windowed path
  uint64_t kv_hits = 0;            // decode selections found in the window
  uint64_t kv_fetched_rows = 0, kv_fetched_bytes = 0;            // copied from the host tier into it
  uint64_t kv_last_fetched_rows = 0, kv_last_fetched_bytes = 0;  // by the last windowed step
  std::vector<uint64_t> kv_host_slot_bytes;  // per slot: rows the host tier holds (empty: no host tier)
};

class Stage {
 public:
  virtual ~Stage() = default;

  virtual const Glm5Hparams& hparams() const = 0;
  virtual LayerRange layers() const = 0;
  bool first() const { return layers().first == 0; }
  bool last() const { return layers().end == hparams().n_layers; }
  virtual uint32_t max_slots() const = 0;
  virtual uint32_t max_context() const = 0;
  virtual uint32_t max_step_rows() const = 0;

  // Lets this stage hand its output straight to `next` (a GPU stage copies into the next one's
  // inbox on its copy stream). Called once, before the first step, for each stage but the last.
  virtual Status connect(Stage& next) = 0;

  // Forgets a slot's state on this stage (its next rows start at position 0).
  virtual Status reset_slot(uint32_t slot) = 0;
  // Runs the step's rows through this stage's layers. `in` is the previous stage's output (null for
  // stage 0). Rows are checked with validate_rows; a bad plan is an invalid_plan error and changes
  // nothing. A device error (device_error, device_lost) leaves the stage unusable.
  virtual Expected<StageOutput> run(const std::vector<SlotRows>& rows, const Handoff* in) = 0;
  // A step this stage will not run (it failed before, or the step was failed for it): lets the
  // stage before it go on as if the hand-off had been read.
  virtual void discard(const Handoff& in) = 0;

  // The slot's state on this stage, in the layout of state_layout(); with_rows adds its DSA rows.
  virtual Expected<SlotStateImage> save_slot(uint32_t slot, bool with_rows) = 0;
  // Puts a saved state back. An image without rows keeps the slot's own rows up to image.tokens (the
  // slot must hold at least that many, unchanged since the save): a rollback or a cached prefix.
  virtual Status restore_slot(uint32_t slot, const SlotStateImage& image) = 0;
  virtual const SlotStateLayout& state_layout() const = 0;

  virtual StageCounters counters() const = 0;
  // The last stage runs the model's MTP block: rows may ask for drafts (SlotRows::draft).
  virtual bool drafts() const { return false; }
  // The stage's expert tiers, when its device holds only some of its routed experts; else null.
  virtual ExpertTier* experts() { return nullptr; }
  virtual std::string describe() const = 0;  // "cpu, 16 threads, layers 0-11" / "cuda:0 NVIDIA H200, ..."
};

// "layers 0-10" for [0, 11).
std::string describe_layers(LayerRange layers);

// The stage boundaries a model accepts: a DSA layer without its own indexer reuses the selection of
// the previous full one, which must then be in the same stage. The error names both layers.
Status check_stage_ranges(const Glm5Hparams& hp, const std::vector<LayerRange>& ranges);

}  // namespace ferry::model
