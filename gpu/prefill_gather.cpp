#include "gpu/prefill_gather.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "gpu/window_gather.hpp"

namespace ferry::gpu {
namespace {

constexpr uint64_t kCounterBytes = 2 * sizeof(uint32_t) + 2 * sizeof(unsigned long long);

uint64_t at_least(uint64_t bytes) { return std::max<uint64_t>(bytes, 16); }

}  // namespace

PrefillGather::PrefillGather(uint32_t slots, uint32_t context, uint32_t capacity, uint32_t max_rows, uint32_t stride,
                             uint64_t row_bytes, bool int8_scales)
    : context_(context),
      capacity_(capacity),
      max_rows_(std::max(max_rows, 1u)),
      stride_(stride),
      row_bytes_(row_bytes),
      scales_(int8_scales),
      map_(at_least(uint64_t{slots} * context * sizeof(int32_t))),
      keys_(at_least(uint64_t{capacity} * sizeof(uint32_t))),
      staging_(at_least(uint64_t{capacity} * row_bytes)),
      staging_scales_(at_least(int8_scales ? uint64_t{capacity} * sizeof(float) : 0)),
      remap_(at_least(uint64_t{max_rows_} * stride * sizeof(int32_t))),
      counters_(kCounterBytes),
      claim_host_(2 * sizeof(uint32_t)),
      totals_host_(kCounterBytes) {
  if (capacity < stride || uint64_t{slots} * context >= (uint64_t{1} << 32)) {
    throw CudaError("prefill gather: a staging of " + std::to_string(capacity) + " rows for selections of " +
                        std::to_string(stride) + " over " + std::to_string(slots) + " slots x " +
                        std::to_string(context) + " positions",
                    ErrorCode::invalid_input);
  }
  FERRY_CUDA(cudaMemset(map_.get(), 0xff, map_.bytes()));  // every (slot, position) unclaimed
  FERRY_CUDA(cudaMemset(counters_.get(), 0, counters_.bytes()));
  FERRY_CUDA(cudaDeviceSynchronize());  // before any stream (a non-blocking one too) uses them
  std::memset(totals_host_.get(), 0, totals_host_.bytes());
}

uint32_t PrefillGather::read_claim(cudaStream_t stream) {
  auto* host = claim_host_.as<uint32_t>();
  FERRY_CUDA(cudaMemcpyAsync(host, counters_.get(), 2 * sizeof(uint32_t), cudaMemcpyDeviceToHost, stream));
  FERRY_CUDA(cudaStreamSynchronize(stream));
  if (host[1] > 0) {
    throw CudaError("prefill gather: " + std::to_string(host[1]) + " selected positions out of the context of " +
                        std::to_string(context_),
                    ErrorCode::internal);
  }
  return host[0];
}

void PrefillGather::attend(const SparseMlaArgs& a, const Source& src, cudaStream_t stream) {
  if (a.max_tokens != stride_ || a.row.slot == nullptr || src.window.pos_frame == nullptr ||
      src.window.context != context_) {
    throw CudaError("prefill gather: the attention's selection does not match the staging", ErrorCode::internal);
  }
  auto* counters = counters_.as<uint32_t>();
  GatherGroup g;
  g.row_slot = a.row.slot;
  g.tokens = a.tokens;
  g.counts = a.counts;
  g.stride = stride_;
  g.context = context_;
  g.map = map_.as<int32_t>();
  g.keys = keys_.as<uint32_t>();
  g.capacity = capacity_;
  g.counters = counters;
  GatherCopy c;
  c.keys = g.keys;
  c.count = counters;
  c.capacity = capacity_;
  c.context = context_;
  c.pos_frame = src.window.pos_frame;
  c.frames = src.window.frames;
  c.window = src.window_rows;
  c.window_scales = src.window_scales;
  c.tier = src.tier;
  c.tier_scales = src.tier_scales;
  c.tier_slot_rows = src.tier_slot_rows;
  c.tier_row0 = src.tier_row0;
  c.dst = staging_.as<uint8_t>();
  c.dst_scales = scales_ ? staging_scales_.as<float>() : nullptr;
  c.row_bytes = row_bytes_;
  c.totals = reinterpret_cast<unsigned long long*>(counters_.as<uint8_t>() + 2 * sizeof(uint32_t));
  // Rows of the next group tried (a launch's grid holds up to 65,535 rows).
  uint32_t size = std::min({a.rows, max_rows_, 65535u});
  for (uint32_t first = 0; first < a.rows;) {
    g.first = first;
    g.end = first + std::min(size, a.rows - first);
    const uint32_t n = g.end - g.first;
    gather_claim(g, stream);
    uint32_t bound = n * stride_;  // a group of at most `capacity` selections fits
    if (uint64_t{n} * stride_ > capacity_) {
      bound = read_claim(stream);
      if (bound > capacity_) {
        gather_release(g, stream);
        if (n == 1) throw CudaError("prefill gather: one row selects more than the staging holds", ErrorCode::internal);
        size = static_cast<uint32_t>(std::max<uint64_t>(1, std::min<uint64_t>(n - 1, uint64_t{n} * capacity_ / bound)));
        ++retries_;
        continue;
      }
    }
    gather_copy(c, bound, stream);
    gather_remap(g, remap_.as<int32_t>(), stream);
    gather_release(g, stream);
    SparseMlaArgs s = a;
    s.rows = n;
    s.split_rows = a.rows;  // each row split as the whole step's would be: the same sums
    s.row.slot = a.row.slot + first;
    if (a.row.pos != nullptr) s.row.pos = a.row.pos + first;
    if (a.row.seg_first_row != nullptr) s.row.seg_first_row = a.row.seg_first_row + first;
    s.q_lat = a.q_lat + uint64_t{first} * a.heads * a.rank;
    s.out = a.out + uint64_t{first} * a.heads * a.rank;
    s.tokens = remap_.as<int32_t>();
    s.counts = a.counts + first;
    s.ctx = 0;  // the table holds staging rows
    s.latents = staging_.get();
    s.latent_scales = scales_ ? staging_scales_.as<float>() : nullptr;
    sparse_mla(s, stream);
    ++groups_;
    first = g.end;
  }
  FERRY_CUDA(cudaMemcpyAsync(totals_host_.get(), counters_.get(), kCounterBytes, cudaMemcpyDeviceToHost, stream));
}

PrefillGather::Counts PrefillGather::counts() const {
  Counts k;
  k.groups = groups_;
  k.retries = retries_;
  const auto* base = totals_host_.as<uint8_t>();
  uint32_t errors = 0;
  std::memcpy(&errors, base + sizeof(uint32_t), sizeof(errors));
  unsigned long long totals[2] = {0, 0};
  std::memcpy(totals, base + 2 * sizeof(uint32_t), sizeof(totals));
  k.errors = errors;
  k.rows = totals[0];
  k.tier_rows = totals[1];
  return k;
}

}  // namespace ferry::gpu
