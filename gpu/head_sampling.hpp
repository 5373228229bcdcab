#pragma once
// The last stage's head: the final stream mean and norm, the output matrix over the rows whose logits
// are needed, and the choice of a token per sampling row on the device (gpu/sampling.cu). Only the
// chosen ids travel to the host, and the logits of the rows that return them.
#include <cuda_runtime_api.h>

#include <vector>

#include "gpu/device_weights.hpp"
#include "gpu/layer_runner.hpp"
#include "gpu/step_input.hpp"
#include "gpu/workspace.hpp"
#include "model/step.hpp"

namespace ferry::gpu {

class Head {
 public:
  Head(const model::Glm5Hparams& hp, const DeviceWeights& weights, Workspace& work, LayerRunner& runner,
       cudaStream_t stream);

  // Logits and chosen tokens of a decode step's rows (one logit row each, in order; a verify set's
  // rows each draw): what a decode graph ends with. The tokens land in in.sampled() on the device.
  void decode(const StepInput& in, uint32_t rows);
  // Fetches a decode step's tokens: the host waits for the stream.
  std::vector<model::SlotResult> decode_results(const std::vector<model::SlotRows>& rows, const StepInput& in);
  // Any step: logits in batches of the workspace's logit rows, tokens chosen on the device, logits
  // copied back for the rows that return them, a verify set's drafts accepted while each equals the
  // draw before it; the host waits for the stream.
  std::vector<model::SlotResult> results(const std::vector<model::SlotRows>& rows, const StepInput& in);

 private:
  void logits(const int32_t* row_idx, uint32_t count);
  // A row set's token from its draws in row order: the last one, or after a verify set's accepted drafts.
  static void accept(const model::SlotRows& r, const std::vector<int32_t>& draws, model::SlotResult& out);

  const model::Glm5Hparams& hp_;
  const DeviceWeights& weights_;
  Workspace& w_;
  LayerRunner& runner_;
  cudaStream_t s_;
};

}  // namespace ferry::gpu
