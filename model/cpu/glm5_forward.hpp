#pragma once
// The glm5_next text model on the CPU: embeddings, the trunk's layers (each sublayer wrapped in its
// mHC mixer), the final stream mean and norm, lm_head; and the MTP block. Several slots' rows run as
// one batch: the projections and FFNs over all rows at once, KDA and DSA per slot on its own state.
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/cpu/dsa.hpp"
#include "model/cpu/mhc.hpp"
#include "model/cpu/moe.hpp"
#include "model/cpu/sequence_state.hpp"
#include "model/cpu/thread_pool.hpp"
#include "model/stage.hpp"
#include "model/glm5/glm5_weights.hpp"

namespace ferry::model {

// One slot's rows: `tokens` continue `state` at position state->tokens().
struct ForwardRows {
  SequenceState* state = nullptr;
  std::span<const int32_t> tokens;
};

// Called once per MoE layer of a step with the router's logits [rows][n_experts] (W x, before the
// sigmoid), rows in request order (tests: the CPU's own margins between routing choices).
using RouteObserver = std::function<void(uint32_t layer, std::span<const float> logits)>;

struct ForwardOptions {
  const SelectionObserver* selections = nullptr;  // DSA pool choices, per layer and row
  const RouteObserver* routes = nullptr;          // MoE router logits, per layer
};

class Glm5Forward {
 public:
  Glm5Forward(const Glm5Weights& weights, ThreadPool& pool);

  const Glm5Hparams& hparams() const { return hp_; }

  // Runs every request's tokens through the whole trunk, advancing each state. `hidden` gets the final
  // hidden states [rows][D] (after the stream mean and output norm), rows in request order.
  void forward(std::span<const ForwardRows> requests, std::vector<float>& hidden, const ForwardOptions& opt = {});

  // The same in the pieces a stage runs. Every stream of a row starts as its token's embedding:
  // streams [rows][H][D], rows in request order.
  void embed_streams(std::span<const ForwardRows> requests, std::vector<float>& streams);
  // Trunk layers [first, end) over the streams, in place; each state's caches of those layers advance.
  void run_layers(LayerRange layers, std::span<const ForwardRows> requests, float* streams,
                  const ForwardOptions& opt = {});
  // hidden [rows][D] = output_norm(mean over the streams): what the head and the MTP block read.
  void final_hidden(const float* streams, size_t rows, std::vector<float>& hidden);

  // logits [rows][vocab] = output @ hidden rows.
  void logits(const float* hidden, size_t rows, float* out);

  // The MTP block (block 0 = layer n_layers) for rows continuing state's MTP cache: row i is fed the
  // trunk's final hidden state h [i] at some position t and the token at t+1. `hidden` gets the
  // block's output after shared_head.norm (what a next MTP step is fed).
  void mtp_forward(SequenceState& state, const float* h, std::span<const int32_t> next_tokens,
                   std::vector<float>& hidden, const ForwardOptions& opt = {});
  void mtp_logits(const float* hidden, size_t rows, float* out);
  bool has_mtp() const { return hp_.n_nextn_layers > 0; }

  // Route counts per (MoE layer, expert) since the last call (for the expert cache's statistics).
  std::vector<uint32_t> take_route_counts();

 private:
  void embed(const WeightMatrix& table, std::span<const int32_t> tokens, float* out);
  void ffn(const Glm5LayerWeights& l, const float* x, size_t rows, float* y, const RouteObserver* routes);

  const Glm5Weights& w_;
  const Glm5Hparams& hp_;
  ThreadPool& pool_;
  MhcConfig mhc_;
  KdaConfig kda_;
  DsaConfig dsa_;
  RouterConfig router_;
  std::vector<uint32_t> route_counts_;  // n_blocks x n_experts
};

}  // namespace ferry::model
