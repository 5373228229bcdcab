#pragma once
// A CUDA stage's routed experts when its device holds only some of them: a pool of expert slots in
// device memory, the host expert store for the rest, and per MoE layer three device tables (gate,
// up, down: one pointer per expert) that the decode kernels index by the routed expert ids. A pointer
// names the expert's pool slot or its host copy (mapped memory: the kernels read it over PCIe), so a
// miss inside a step needs nothing from anyone: that is the decode miss path. A prefill chunk, which
// routes to nearly every expert of a layer, can instead upload the layer's missing experts into a
// staging buffer on the copy stream while the layers before it compute (double-buffered), and run
// them from there as GEMMs: the second miss path, chosen per step.
//
// The pool changes by swaps (model::ExpertMove) proposed between steps; each one finishes over the
// next steps without stalling them: copy the evicted expert out if it has no host copy, point its
// table entries at the host copy, upload the promoted expert into the freed slot on the copy stream,
// point its entries at the slot — each phase once the device has done the one before.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/expert_source.hpp"
#include "gpu/host_expert_store.hpp"
#include "gpu/moe_grouped.hpp"
#include "model/expert_tier.hpp"
#include "model/glm5/glm5_hparams.hpp"
#include "model/stage.hpp"

namespace ferry::gpu {

struct StageExpertsPlan {
  std::vector<model::ExpertId> pooled;  // the experts in the pool at start, one per slot
  std::vector<int64_t> host_slot;       // per expert of the model (layer * experts + e): its host copy, -1 none
  uint64_t staging_bytes = 0;           // both prefill staging buffers together
  std::string miss_path = "auto";       // prefill: auto, mapped or upload
};

class StageExperts final : public model::ExpertTier {
 public:
  // Fills the pool from `source` (the host store already holds its experts) and builds the tables,
  // on the current device. Throws CudaError.
  StageExperts(const model::Glm5Hparams& hp, model::LayerRange layers, ExpertSource& source,
               std::shared_ptr<HostExpertStore> host, const StageExpertsPlan& plan, cudaStream_t compute,
               cudaStream_t copy);
  ~StageExperts() override;

  const ExpertShape& shape(uint32_t layer) const { return layers_[local(layer)].shape; }
  // The layer's device table of `part` (0 gate, 1 up, 2 down): E pointers, for w_group_ptrs.
  const uint8_t* const* table(uint32_t layer, int part) const;
  // The device histogram the layer's decode routes are counted into (model::RouteCounts).
  uint32_t* route_counts(uint32_t layer) { return counts_device_.as<uint32_t>() + size_t{local(layer)} * experts_; }

  // Prefill: whether a chunk of `rows` rows uploads its missing experts (else reads them mapped).
  bool uploads_for(uint32_t rows) const;
  // Uploads `layer`'s missing experts into the next staging buffer on the copy stream (as many as
  // fit); `staged` then gives where each one landed (null: not staged, read it at base()).
  void stage_layer(uint32_t layer);
  void wait_staged(uint32_t layer);     // the compute stream waits for the layer's uploads
  void release_staged(uint32_t layer);  // the compute stream is done with them
  const uint8_t* staged(uint32_t layer, uint32_t e) const;
  // Prefill: the layer's three tables (gate, up, down) as this chunk reads them (the staged copies
  // when `upload`, else pool slots and host copies), written on the compute stream, and the tally
  // sort_routes() fills: the prefill's own counters (its routes are not the policy's: a long prompt
  // must not push the experts decode uses out of the pool), collected like the route counts.
  struct PrefillView {
    const uint8_t* const* table[3];
    RouteTally tally;
  };
  PrefillView prefill_view(uint32_t layer, bool upload);

  // Around each step, on the stage's thread: before (collect the last copied counts, advance the
  // moves in progress), after (copy this step's counts out).
  void before_step();
  void after_step();

  model::RouteCounts take_route_counts() override;
  std::vector<model::ExpertMove> take_finished_moves() override;
  void start_moves(const std::vector<model::ExpertMove>& moves) override;
  model::ExpertTierCounters counters() const override { return counters_; }
  std::vector<std::vector<uint32_t>> pooled() const override;

 private:
  struct Layer {
    uint32_t index = 0;
    ExpertShape shape;
    std::vector<const uint8_t*> base;  // per expert: pool slot or host copy
    std::vector<int32_t> slot;         // per expert: pool slot, -1 none
  };
  struct Moving {
    model::ExpertMove move;
    uint32_t slot = 0;
    int phase = 0;  // 0 copy out, 1 point evicted at host, 2 upload promoted, 3 point promoted at slot, 4 done
    std::unique_ptr<Event> done;
  };
  struct Staging {
    DeviceBuffer buffer;
    Event ready{false}, free{false};
    uint32_t layer = ~0u;
    std::vector<const uint8_t*> where;  // per expert of that layer
  };

  uint32_t local(uint32_t layer) const { return layer_index_[layer]; }
  uint8_t* pool_slot(uint32_t slot) const { return pool_.as<uint8_t>() + uint64_t{slot} * slot_bytes_; }
  // Points the expert's three table entries (and the mirror) at `base`, in compute-stream order.
  void point(const model::ExpertId& id, const uint8_t* base);
  void advance(Moving& m);

  uint32_t experts_, experts_used_;
  uint64_t slot_bytes_;
  std::shared_ptr<HostExpertStore> host_;
  cudaStream_t compute_, copy_;
  std::string miss_path_;
  std::vector<uint32_t> layer_index_;  // block index -> its place in layers_ (MoE layers of the stage)
  std::vector<Layer> layers_;
  DeviceBuffer pool_, tables_, counts_device_;
  PinnedBuffer counts_host_;
  Event counts_copied_{false};
  bool counts_pending_ = false;
  std::vector<uint32_t> counts_;  // collected since the last take_route_counts
  std::deque<Moving> moving_;
  std::vector<model::ExpertMove> finished_;
  Staging staging_[2];
  uint32_t next_staging_ = 0;
  // prefill_view's tables: per MoE layer 3 x E pointers then E class bytes; the host copy of a
  // layer is rewritten only once its last upload ran.
  size_t prefill_region_ = 0;
  PinnedBuffer prefill_host_;
  DeviceBuffer prefill_device_;
  std::vector<std::unique_ptr<Event>> prefill_copied_;
  DeviceBuffer tally_device_;  // RouteTally::counters, copied out with the route counts
  PinnedBuffer tally_host_;
  model::ExpertTierCounters counters_;
};

}  // namespace ferry::gpu
