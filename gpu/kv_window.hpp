#pragma once
// The GPU resident window of a CUDA stage's DSA layers (issue 12; kv/host_kv_tier.hpp has the design):
// every slot's full logical latent rows in the host tier (pinned, mapped into the device's address
// space), and on the device `resident` rows per DSA layer and slot (StageState allocates them).
//
// A slot lives wholly in its window, position p at row p, while it holds at most `resident` rows:
// such steps take the all-resident path unchanged (also as captured graphs) and pay nothing. A step
// that takes some slot past its window is a windowed step, for every slot in it: each such slot's
// rows are copied to the host tier once (flush) and handed to CLOCK. In a windowed step, per DSA layer,
// - the step's new rows are encoded once on the device, into a staging buffer, and copied from there
//   into the host tier (the compute stream orders them before anything reads them), or, in a step
//   planned on the device, written there by the encoding kernel through the tier's device view;
// - decode (up to kMaxMatvecTokens rows) whose rows of one slot select at most the window together:
//   planned on the device (gpu/window_planner.hpp: hits and misses, CLOCK evictions, no host sync),
//   the missing rows copied from the host tier into their frames by a kernel, the sparse attention
//   reads the window through the planned row table. Nothing in it depends on the host's view of the
//   step (the host tier's bookkeeping is done in begin_step): it can be captured;
// - other decode steps: the indexer's selection is read back and planned on the host by the same
//   rule (kv::ResidentWindow, the slots' state moved over from the device and back), one attention
//   launch per group of rows the window holds at once;
// - prefill (more rows): the union of a group of the chunk's selections is gathered once into a
//   staging area on the device, from the window's frames or the host tier (gpu/prefill_gather.hpp),
//   and the sparse attention reads it there.
// Both read the same encoded bytes the all-resident path would: with f32 rows the logits are the same.
// The counters of the device planner are copied to pinned memory at a step's end; stats() reads that
// copy without waiting (the stage's actor asks for them after every step).
// The indexer's pool keys stay on the device for the whole context, its keys and gates in a ring of
// a step's rows (gpu/stage_sizes.hpp, index_key_rows).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "config/kv_type.hpp"
#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "gpu/prefill_gather.hpp"
#include "gpu/window_copy.hpp"
#include "gpu/window_planner.hpp"
#include "kv/host_kv_tier.hpp"
#include "kv/resident_window.hpp"
#include "model/glm5/glm5_hparams.hpp"
#include "model/stage.hpp"
#include "model/step.hpp"

namespace ferry::gpu {

struct LayerState;

struct KvWindowStats {
  uint64_t resident_rows = 0;     // window rows holding a row now, over layers and slots
  uint64_t window_rows = 0;       // all window rows (layers x slots x resident)
  uint64_t windowed_steps = 0;    // steps that ran the windowed path
  uint64_t hits = 0, misses = 0;  // decode selections found resident / fetched
  uint64_t fetched_bytes = 0;     // copied from the host tier into the windows
  uint64_t last_fetched_rows = 0, last_fetched_bytes = 0;  // of the last windowed decode step
  // Prefill (gpu/prefill_gather.hpp): attention launches over a staging, staging rows copied and of
  // those from the host tier (the rest from the window's frames).
  uint64_t prefill_groups = 0, prefill_rows = 0, prefill_tier_rows = 0;
  std::vector<uint64_t> host_bytes;  // per slot: rows the host tier holds
  uint64_t host_capacity = 0;
};

class KvWindow {
 public:
  // Throws CudaError when pinned memory cannot be had. `max_rows`: the largest step.
  KvWindow(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t slots, uint32_t context, uint32_t resident,
           config::KvType type, uint32_t max_rows);
  ~KvWindow();
  KvWindow(const KvWindow&) = delete;
  KvWindow& operator=(const KvWindow&) = delete;

  // Pinned host bytes of the tier for this shape.
  static uint64_t host_bytes_for(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t slots,
                                 uint32_t context, config::KvType type);

  uint32_t resident() const { return resident_; }
  bool in_window(uint32_t slot) const { return in_window_[slot] != 0; }
  bool windowed_step() const { return windowed_; }
  // A windowed step planned on the device (no host sync: graphable).
  bool device_planned() const { return windowed_ && device_planned_; }

  // Before a step's layers: whether it is windowed, and the flush of the slots it hands to CLOCK
  // (their rows before the step's start, from the windows in `layers_state` to the host tier).
  void begin_step(const std::vector<model::SlotRows>& rows, const std::vector<uint32_t>& tokens,
                  const std::vector<LayerState*>& dsa_state, cudaStream_t stream);
  // A windowed step's new rows of DSA layer `il` (src: n rows `ld` floats apart, at `rows`): encoded,
  // to the host tier.
  void store(uint32_t il, const float* src, size_t ld, RowInfo rows, uint32_t n, cudaStream_t stream);
  // A windowed step's sparse attention of layer `il` (`a` as for sparse_mla over the window).
  void attend(uint32_t il, const LayerState& st, SparseMlaArgs a, cudaStream_t stream);

  // The slot starts over (nothing anywhere); a restored image: `tokens` rows, in the window when it
  // holds them (the caller writes them there), else in the host tier from `rows` (see restore_rows).
  void reset(uint32_t slot);
  // Rows [0, n) of (slot, layer il) into the host tier, already encoded (data + int8 scales).
  Status restore_rows(uint32_t slot, uint32_t il, const void* data, const float* scales, uint32_t n);
  void mark_out_of_window(uint32_t slot) { in_window_[slot] = 0; }
  // Rows [0, n) of (slot, il) as stored, from the host tier (the slot is out of its window).
  const void* host_rows(uint32_t slot, uint32_t il) const;
  const float* host_scales(uint32_t slot, uint32_t il) const;

  // `tokens`: the rows each slot holds (a slot in its window has them at their positions).
  KvWindowStats stats(const std::vector<uint32_t>& tokens) const;

 private:
  uint32_t ordinal(uint32_t il) const { return ordinal_[il - first_]; }
  const uint8_t* device_view(const void* host) const;
  void apply_cuts(cudaStream_t stream);
  void attend_on_device(uint32_t L, const LayerState& st, const SparseMlaArgs& a, cudaStream_t stream);
  void attend_on_host(uint32_t L, const LayerState& st, const SparseMlaArgs& a, cudaStream_t stream);
  WindowCopy fetch_copy(const LayerState& st) const;

  uint32_t first_, slots_, resident_, width_, max_selected_;
  config::KvType type_;
  uint64_t row_bytes_;  // data bytes of one row (int8 scales apart)
  std::vector<uint32_t> ordinal_;
  std::unique_ptr<kv::HostKvTier> tier_;
  const uint8_t* tier_device_ = nullptr;  // the tier's memory as the device addresses it
  std::vector<kv::ResidentWindow> windows_;  // per DSA layer
  std::vector<uint8_t> in_window_;           // per slot
  std::unique_ptr<WindowPlanner> planner_;
  std::unique_ptr<PrefillGather> gather_;
  std::vector<std::pair<uint32_t, uint32_t>> cuts_;  // (slot, cut) invalidations not yet on the device
  bool windowed_ = false, device_planned_ = false, last_on_device_ = false;
  // The step's rows and segments (host copies of what StepInput uploads).
  std::vector<int32_t> row_slot_;
  struct Segment {
    uint32_t slot, start, len, first_row;
  };
  std::vector<Segment> segments_;
  std::vector<uint32_t> step_slots_;
  std::vector<kv::HostKvTier::RawRows> claimed_;  // per (DSA layer, segment): where store() writes
  // Staging of one step's encoded rows; the decode plan's buffers.
  DeviceBuffer staging_, staging_scales_, frames_dev_, fetch_dev_;
  PinnedBuffer selected_host_, counts_host_, frames_host_, fetch_host_;
  std::vector<kv::ResidentWindow::Query> queries_;
  std::vector<kv::WindowFetch> fetches_;
  uint32_t max_rows_ = 0;
  KvWindowStats counts_;
};

}  // namespace ferry::gpu
