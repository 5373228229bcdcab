#pragma once
// A per-op time breakdown of a stage's eager steps (`ferry bench --op-times`): CUDA events recorded on
// the compute stream at the end of each op group; the time from one mark to the next is charged to
// the group the later mark names. Inside a group, the cuBLAS products mark their parts too (the
// fp16 conversions of x and of the weights, the GEMMs), so that a group's time splits into those and
// the rest. Decode graphs are never marked (events in a capture do not time). Off (no OpTimes
// attached to the runner), the layer code pays one null check a group or part.
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <deque>
#include <string>

#include "gpu/cuda_memory.hpp"

namespace ferry::gpu {

enum class OpGroup : uint8_t {
  embed,           // token embedding into the streams
  mhc_pre,         // an mHC site's mixer product, RMS norm and Sinkhorn (before attention and FFN)
  mhc_post,        // the output folded back into the streams
  kda_proj,        // KDA: q/k/v, f_a/g_a/beta and f_b/g_b products
  kda_conv,        // KDA: short convolution, q/k L2 norms
  kda_recurrence,  // KDA: the gated delta-rule recurrence and its gated RMS norm
  kda_out,         // KDA: the output projection
  dsa_proj,        // DSA: q_a, kv_a, their norms, q_b, latents stored, k_b absorbed into q
  indexer_proj,    // DSA: the indexer's q_b, k and gate products, key norm, cache writes (in decode the pool keys too)
  indexer_select,  // DSA: pool keys (prefill), pool scores, top-k selection
  sparse_mla,      // DSA: attention over the selected latents
  dsa_out,         // DSA: v_b and the output projection
  moe_router,      // MoE: router product and top-k routing
  moe_shared,      // MoE: the shared expert
  moe_experts,     // MoE: routed experts (sort, grouped GEMMs or matvecs) and the combine (in decode the
                   // combine is made by the next mHC site: mhc_pre / mhc_post)
  dense_ffn,       // a dense layer's FFN
  head,            // final norm, output head, sampling, results to the host
  count
};
constexpr size_t kOpGroups = static_cast<size_t>(OpGroup::count);
const char* op_group_name(OpGroup g);

// What an interval inside a group was: the large-row products' conversions to fp16 (x, and the
// weights dequantised per call), their GEMMs (cuBLAS, fp16 or f32), or anything else.
enum class OpPart : uint8_t { other, convert, gemm };

struct OpTimeTotals {
  std::array<double, kOpGroups> ms{};          // the whole group
  std::array<double, kOpGroups> gemm_ms{};     // of which cuBLAS GEMMs
  std::array<double, kOpGroups> convert_ms{};  // of which fp16 conversions
  std::array<uint64_t, kOpGroups> marks{};
  uint32_t steps = 0;
  double total_ms() const;
  void add(const OpTimeTotals& o);
};

// Rows of `t` divided by its steps: ms a step, share of the step, marks a step. `what` heads it.
std::string format_op_times(const OpTimeTotals& t, const std::string& what);

class OpTimes {
 public:
  // Starts a step's marks on stream `s` (the device current when the events were first made).
  void begin(cudaStream_t s);
  // Charges the time since the previous group mark (or begin) to `g`, with its parts.
  void mark(OpGroup g, cudaStream_t s);
  // Ends a part of the group under way: the time since the previous mark or part is `p` (convert or
  // gemm; the rest of a group is `other`).
  void part(OpPart p, cudaStream_t s);
  // Waits for the step's last mark and adds its intervals to the totals; a step without marks adds
  // nothing.
  void finish();
  // The totals since the last take(), and zero after.
  OpTimeTotals take();

 private:
  struct Interval {
    OpGroup group = OpGroup::count;  // count: its group's mark is still to come
    OpPart part = OpPart::other;
    bool ends_group = false;  // a group mark ends it
  };
  Event& event(size_t i);
  void record(OpPart p, cudaStream_t s);

  std::deque<Event> events_;     // reused from step to step
  std::deque<Interval> tags_;    // tags_[i]: what ran from events_[i] to events_[i + 1]
  size_t used_ = 0;              // events recorded this step
  size_t grouped_ = 0;           // intervals before it have their group
  OpTimeTotals totals_;
};

}  // namespace ferry::gpu
