#pragma once
// The MTP block on a CUDA last stage: the same contract as the CPU stage's (model/cpu/cpu_mtp.hpp).
// Each slot's MTP cache keeps one entry per confirmed position p: the trunk's final hidden state at p
// with the token at p + 1. The last position waits for its token with its hidden state kept on the
// device (pending). After a step the block takes the entries of the positions the step confirmed, all
// slots in one pass, and for each slot that drew a token and asks for drafts, the argmax of the
// block's logits after its last entry; a further draft feeds the block its own output and leaves no
// entry. The block's DSA layer runs through the stage's LayerRunner code over its own weights, state
// (DSA rows and indexer pools per slot, like a layer's) and the stage's workspace. With `graphs`, the
// block's pass over a step's entries and the drafting after it (argmax, further drafts) replay from
// CUDA graphs by their shapes (gpu/decode_graphs.hpp), as the trunk's decode steps do: their inputs
// are the block's fixed buffers, staged before the replay.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "gpu/cuda_blas.hpp"
#include "gpu/cuda_memory.hpp"
#include "gpu/decode_graphs.hpp"
#include "gpu/device_weights.hpp"
#include "gpu/layer_runner.hpp"
#include "gpu/mtp_sizes.hpp"  // kMaxCudaDrafts; what the plan counts for the block
#include "gpu/stage_state.hpp"
#include "gpu/step_input.hpp"
#include "gpu/workspace.hpp"
#include "model/step.hpp"

namespace ferry::gpu {

class CudaMtp {
 public:
  // `block`: the MTP layer's weights (DeviceWeights over [n_layers, n_layers + 1)); `embed`: the
  // token embedding when the block has none of its own and `trunk` (the last stage's weights) lacks
  // it. The workspace must cover the block's layer and max_rows rows. Throws CudaError.
  CudaMtp(const model::Glm5Hparams& hp, DeviceWeights block, std::optional<DeviceWeights> embed,
          const DeviceWeights& trunk, Workspace& work, blas::Handle cublas, uint32_t slots, uint32_t context,
          uint32_t max_rows, config::KvFormats kv, bool graphs, cudaStream_t stream);
  CudaMtp(const CudaMtp&) = delete;
  CudaMtp& operator=(const CudaMtp&) = delete;

  // The slot starts over: no entries, nothing pending.
  void reset(uint32_t slot);
  // After a step's head (`rows` and their `results`, the trunk's streams `streams` of every row in
  // work.R): the entries of each slot's confirmed rows, and its drafts into results[i].drafts. The
  // host waits for the stream.
  void extend(const std::vector<model::SlotRows>& rows, std::vector<model::SlotResult>& results);

  // A verify set's start: the slot's entry count and pending state, until restore() or the next keep.
  void keep(uint32_t slot);
  void restore(uint32_t slot);
  // The slot's trunk state was replaced from an image of `tokens` positions: with its own rows kept
  // (with_rows false) the entries before the image's last position stay; the pending state is lost
  // (it enters as zeros, as on the CPU); with rows, the entries are another sequence's: none.
  void restored(uint32_t slot, uint32_t tokens, bool with_rows);

  // Every entry's logits from now on go to a host buffer (eval-ref compares them with the reference
  // case's MTP logits): rows in the order the entries are made.
  void record_logits(bool on) { record_ = on; }
  std::vector<float> take_logits() { return std::move(recorded_); }

  uint64_t bytes() const;
  // The graphs captured so far (the pass's and the drafting's shapes).
  size_t graphs() const { return pass_graphs_.captured() + draft_graphs_.captured(); }

 private:
  struct Kept {
    uint32_t entries = 0;
    bool pending = false;
  };
  // The block over n rows: token ids (device) and hidden states h [n][D] in, normalised outputs in
  // out_; the rows' positions and slots in g.
  void block(const StepGeometry& g, const int32_t* tokens, const float* h, uint32_t n);
  // Argmax of the head over `rows` rows of x into ids (device).
  void argmax(const float* x, uint32_t rows, int32_t* ids);
  void record(uint32_t rows);
  // The drafting after the pass: the argmax of sel_ for `counts[0]` slots, then per further draft j
  // the block over counts[j] slots' own outputs (geometry gs[j - 1]) and its argmax.
  void draft(const std::vector<uint32_t>& counts, const std::vector<StepGeometry>& gs);

  const model::Glm5Hparams& hp_;
  uint32_t D_, V_;
  DeviceWeights weights_;
  std::optional<DeviceWeights> embed_weights_;
  const DevMatrix* embed_ = nullptr;
  const DevMatrix* head_ = nullptr;
  StageState state_;  // tokens = each slot's entries
  Workspace& w_;
  LayerRunner runner_;
  cudaStream_t s_;
  uint32_t slots_, max_rows_;
  const float* output_norm_;
  StepInput input_;                    // the entries' rows
  std::vector<std::unique_ptr<StepInput>> draft_input_;  // the rows of each further draft
  DeviceBuffer iota_, hidden_, h_, cat_, x_, out_, sel_, pending_, kept_pending_, ids_, greedy_;
  PinnedBuffer ids_host_;
  std::vector<bool> pending_valid_;
  std::vector<std::optional<Kept>> kept_;
  DecodeGraphs pass_graphs_, draft_graphs_;
  bool record_ = false;
  std::vector<float> recorded_;
};

}  // namespace ferry::gpu
