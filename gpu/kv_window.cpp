#include "gpu/kv_window.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "gpu/stage_sizes.hpp"
#include "gpu/stage_state.hpp"
#include "kv/kv_rows.hpp"

namespace ferry::gpu {
namespace {

// Pinned and mapped: the copy kernel and the prefill attention read the tier through the device's view.
kv::HostAllocator mapped_pinned() {
  kv::HostAllocator a;
  a.allocate = [](uint64_t bytes) -> void* {
    void* p = nullptr;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return p;
  };
  a.release = [](void* p) { cudaFreeHost(p); };
  return a;
}

kv::HostKvShape tier_shape(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t slots, uint32_t context,
                           config::KvType type) {
  return kv::HostKvShape{slots, dsa_layer_count(hp, layers), context, hp.kv_lora_rank, type};
}

}  // namespace

uint64_t KvWindow::host_bytes_for(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t slots,
                                  uint32_t context, config::KvType type) {
  return kv::HostKvTier::bytes_for(tier_shape(hp, layers, slots, context, type));
}

KvWindow::KvWindow(const model::Glm5Hparams& hp, model::LayerRange layers, uint32_t slots, uint32_t context,
                   uint32_t resident, config::KvType type, uint32_t max_rows)
    : first_(layers.first),
      slots_(slots),
      resident_(resident),
      width_(hp.kv_lora_rank),
      type_(type),
      row_bytes_(uint64_t{hp.kv_lora_rank} * kv::kv_element_bytes(type)),
      in_window_(slots, 1),
      max_rows_(max_rows) {
  max_selected_ = max_selected_rows(hp);  // as the workspace sizes a row's selection
  const kv::HostKvShape shape = tier_shape(hp, layers, slots, context, type);
  if (uint64_t{slots} * shape.layers * context >= (uint64_t{1} << 32) || uint64_t{slots} * resident >= (uint64_t{1} << 31)) {
    throw CudaError("resident KV window: " + std::to_string(slots) + " slots x " + std::to_string(shape.layers) +
                        " DSA layers x " + std::to_string(context) + " rows is more than the row index holds",
                    ErrorCode::invalid_input);
  }
  if (resident < max_selected_) {
    throw CudaError("--kv-resident " + std::to_string(resident) + " is smaller than one query row's selection of " +
                        std::to_string(max_selected_) + " rows",
                    ErrorCode::invalid_input);
  }
  auto tier = kv::HostKvTier::create(shape, ~uint64_t{0}, mapped_pinned());
  if (!tier) throw CudaError("resident KV window: " + tier.error().message, tier.error().code);
  tier_ = std::move(tier.value());
  if (tier_->memory() != nullptr) {
    void* view = nullptr;
    FERRY_CUDA(cudaHostGetDevicePointer(&view, tier_->memory(), 0));
    tier_device_ = static_cast<const uint8_t*>(view);
  }
  for (uint32_t il = layers.first; il < layers.end; ++il) {
    ordinal_.push_back(static_cast<uint32_t>(windows_.size()));
    if (hp.layer_kinds[il] == model::LayerKind::dsa) windows_.emplace_back(slots, resident);
  }
  tier_->on_invalidate([this](uint32_t slot, uint32_t cut) {
    for (kv::ResidentWindow& w : windows_) w.invalidate(slot, cut);
    cuts_.emplace_back(slot, cut);  // the device's tables at the next step, in stream order
  });
  planner_ = std::make_unique<WindowPlanner>(static_cast<uint32_t>(windows_.size()), slots, resident, context, nullptr);
  gather_ = std::make_unique<PrefillGather>(slots, context, resident, max_rows, max_selected_, row_bytes_,
                                            type == config::KvType::int8);
  const uint64_t plan_rows = uint64_t{kMaxMatvecTokens} * max_selected_;
  staging_ = DeviceBuffer(std::max<uint64_t>(uint64_t{max_rows} * row_bytes_, 16));
  staging_scales_ = DeviceBuffer(std::max<uint64_t>(uint64_t{max_rows} * sizeof(float), 16));
  frames_dev_ = DeviceBuffer(plan_rows * sizeof(int32_t));
  fetch_dev_ = DeviceBuffer((plan_rows + max_selected_) * 2 * sizeof(uint32_t));
  selected_host_ = PinnedBuffer(plan_rows * sizeof(int32_t));
  counts_host_ = PinnedBuffer(kMaxMatvecTokens * sizeof(int32_t));
  frames_host_ = PinnedBuffer(plan_rows * sizeof(int32_t));
  fetch_host_ = PinnedBuffer((plan_rows + max_selected_) * 2 * sizeof(uint32_t));
  counts_.host_bytes.assign(slots, 0);
}

KvWindow::~KvWindow() = default;

void KvWindow::apply_cuts(cudaStream_t stream) {
  for (const auto& [slot, cut] : cuts_) planner_->invalidate(slot, cut, stream);
  cuts_.clear();
}

const uint8_t* KvWindow::device_view(const void* host) const {
  return tier_device_ + (static_cast<const uint8_t*>(host) - static_cast<const uint8_t*>(tier_->memory()));
}

void KvWindow::begin_step(const std::vector<model::SlotRows>& rows, const std::vector<uint32_t>& tokens,
                          const std::vector<LayerState*>& dsa_state, cudaStream_t stream) {
  apply_cuts(stream);
  windowed_ = false;
  row_slot_.clear();
  segments_.clear();
  step_slots_.clear();
  uint32_t row = 0, longest = 0;
  for (const model::SlotRows& r : rows) {
    const auto n = static_cast<uint32_t>(r.tokens.size());
    if (n == 0) continue;
    segments_.push_back({r.slot, r.start, n, row});
    step_slots_.push_back(r.slot);
    row_slot_.insert(row_slot_.end(), n, static_cast<int32_t>(r.slot));
    row += n;
    longest = std::max(longest, n);
    if (!in_window(r.slot) || uint64_t{r.start} + n > resident_) windowed_ = true;
  }
  if (!windowed_) return;
  // The device plans a step when each slot's rows can be pinned together (kv::ResidentWindow's
  // groups are then the whole step): a function of the step's shape, so a graph's key holds it.
  device_planned_ = row <= kMaxMatvecTokens && uint64_t{longest} * max_selected_ <= resident_;
  ++counts_.windowed_steps;
  for (const Segment& seg : segments_) {
    if (!in_window(seg.slot)) continue;
    // The slot's rows before this step, in its windows at their positions, go to the host tier.
    const uint32_t keep = std::min(tokens[seg.slot], seg.start);
    for (size_t L = 0; L < windows_.size(); ++L) {
      auto claimed = tier_->claim(seg.slot, static_cast<uint32_t>(L), 0, keep);
      if (!claimed) throw CudaError("resident KV window: " + claimed.error().message, ErrorCode::internal);
      const LayerState& st = *dsa_state[L];
      const uint64_t row0 = uint64_t{seg.slot} * resident_;
      if (keep > 0) {
        FERRY_CUDA(cudaMemcpyAsync(claimed.value().data, static_cast<const uint8_t*>(st.latents) + row0 * row_bytes_,
                                   keep * row_bytes_, cudaMemcpyDeviceToHost, stream));
        if (claimed.value().scales != nullptr) {
          FERRY_CUDA(cudaMemcpyAsync(claimed.value().scales, st.latent_scales + row0, keep * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream));
        }
      }
      apply_cuts(stream);  // the claim's own cut comes before the adoption
      planner_->adopt_identity(static_cast<uint32_t>(L), seg.slot, keep, stream);
    }
    in_window_[seg.slot] = 0;
  }
  // The step's new rows: their places in the host tier (a rewritten prefix invalidates what followed).
  claimed_.clear();
  for (size_t L = 0; L < windows_.size(); ++L) {
    for (const Segment& seg : segments_) {
      auto claimed = tier_->claim(seg.slot, static_cast<uint32_t>(L), seg.start, seg.len);
      if (!claimed) throw CudaError("resident KV window: " + claimed.error().message, ErrorCode::internal);
      claimed_.push_back(claimed.value());
    }
  }
  apply_cuts(stream);
  last_on_device_ = device_planned_;
  if (device_planned_) {
    planner_->begin_step(stream);
  } else {
    counts_.last_fetched_rows = counts_.last_fetched_bytes = 0;
  }
  planner_->publish(stream);  // what the flush and the cuts changed, for a step that plans nothing
}

void KvWindow::store(uint32_t il, const float* src, size_t ld, RowInfo rows, uint32_t n, cudaStream_t stream) {
  if (n > max_rows_ || n != row_slot_.size()) {
    throw CudaError("resident KV window: a step of " + std::to_string(n) + " rows", ErrorCode::internal);
  }
  const uint32_t L = ordinal(il);
  if (device_planned_) {
    // Into the host tier through its device view, at each row's (slot, position) on the device:
    // the same launch serves every replay of a captured step.
    const kv::HostKvShape& shape = tier_->shape();
    auto* data = const_cast<uint8_t*>(device_view(tier_->row_data(0, L, 0)));
    float* scales = type_ == config::KvType::int8
                        ? reinterpret_cast<float*>(const_cast<uint8_t*>(device_view(tier_->row_scale(0, L, 0))))
                        : nullptr;
    store_latents(src, ld, rows, n, width_, shape.layers * shape.max_tokens, type_, data, scales, stream);
    return;
  }
  auto* data = staging_.as<uint8_t>();
  auto* scales = staging_scales_.as<float>();
  store_latents(src, ld, RowInfo{}, n, width_, 0, type_, data, scales, stream);  // row r of the step at row r
  for (size_t k = 0; k < segments_.size(); ++k) {
    const Segment& seg = segments_[k];
    const kv::HostKvTier::RawRows& claimed = claimed_[L * segments_.size() + k];
    FERRY_CUDA(cudaMemcpyAsync(claimed.data, data + uint64_t{seg.first_row} * row_bytes_, seg.len * row_bytes_,
                               cudaMemcpyDeviceToHost, stream));
    if (claimed.scales != nullptr) {
      FERRY_CUDA(cudaMemcpyAsync(claimed.scales, scales + seg.first_row, seg.len * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream));
    }
  }
}

void KvWindow::attend(uint32_t il, const LayerState& st, SparseMlaArgs a, cudaStream_t stream) {
  const uint32_t L = ordinal(il);
  if (a.max_tokens != max_selected_ || a.rows != row_slot_.size()) {
    throw CudaError("resident KV window: the attention's rows do not match the step", ErrorCode::internal);
  }
  const kv::HostKvShape& shape = tier_->shape();
  if (a.rows > kMaxMatvecTokens) {
    // Row (slot, L, pos) of the tier is (slot * layers + L) * max_tokens + pos.
    PrefillGather::Source src;
    src.window = planner_->tables(L);
    src.window_rows = static_cast<const uint8_t*>(st.latents);
    src.window_scales = st.latent_scales;
    src.tier = device_view(tier_->memory());
    src.tier_scales = type_ == config::KvType::int8
                          ? reinterpret_cast<const float*>(device_view(tier_->row_scale(0, 0, 0)))
                          : nullptr;
    src.tier_slot_rows = shape.layers * shape.max_tokens;
    src.tier_row0 = L * shape.max_tokens;
    gather_->attend(a, src, stream);
    return;
  }
  if (device_planned_) {
    attend_on_device(L, st, a, stream);
  } else {
    attend_on_host(L, st, a, stream);
  }
  if (L + 1 == windows_.size()) planner_->publish(stream);  // the step's counters, for stats()
}

WindowCopy KvWindow::fetch_copy(const LayerState& st) const {
  WindowCopy c;
  c.src = device_view(tier_->memory());
  c.src_scales = type_ == config::KvType::int8 ? reinterpret_cast<const float*>(device_view(tier_->row_scale(0, 0, 0)))
                                               : nullptr;
  c.dst = static_cast<uint8_t*>(st.latents);
  c.dst_scales = st.latent_scales;
  c.row_bytes = row_bytes_;
  return c;
}

void KvWindow::attend_on_device(uint32_t L, const LayerState& st, const SparseMlaArgs& a, cudaStream_t stream) {
  const kv::HostKvShape& shape = tier_->shape();
  WindowPlanArgs p;
  p.t = planner_->tables(L);
  p.row_slot = a.row.slot;
  p.row_first = a.row.seg_first_row;
  p.rows = a.rows;
  p.tokens = a.tokens;
  p.counts = a.counts;
  p.stride = max_selected_;
  p.rows_out = frames_dev_.as<int32_t>();
  p.fetches = fetch_dev_.as<uint32_t>();
  p.fetch_count = reinterpret_cast<uint32_t*>(p.fetches + (fetch_dev_.bytes() / sizeof(uint32_t) - 1));
  p.fetch_capacity = static_cast<uint32_t>((fetch_dev_.bytes() / sizeof(uint32_t) - 1) / 2);
  p.tier_slot_rows = shape.layers * shape.max_tokens;
  p.tier_row0 = L * shape.max_tokens;
  p.counts_out = planner_->counts();
  if (p.row_first == nullptr) throw CudaError("resident KV window: the step's rows have no segments", ErrorCode::internal);
  plan_window(p, stream);
  WindowCopy c = fetch_copy(st);
  c.entries = p.fetches;
  c.n = std::min<uint32_t>(p.fetch_capacity, a.rows * max_selected_);
  c.count = p.fetch_count;
  copy_window_rows(c, stream);
  SparseMlaArgs g = a;
  g.tokens = p.rows_out;
  g.ctx = 0;  // the table holds window rows
  g.latents = st.latents;
  g.latent_scales = st.latent_scales;
  sparse_mla(g, stream);
}

void KvWindow::attend_on_host(uint32_t L, const LayerState& st, const SparseMlaArgs& a, cudaStream_t stream) {
  const kv::HostKvShape& shape = tier_->shape();
  const uint32_t n = a.rows, stride = max_selected_;
  auto* selected = selected_host_.as<int32_t>();
  auto* counts = counts_host_.as<int32_t>();
  FERRY_CUDA(cudaMemcpyAsync(selected, a.tokens, uint64_t{n} * stride * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  FERRY_CUDA(cudaMemcpyAsync(counts, a.counts, n * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  kv::ResidentWindow& window = windows_[L];
  planner_->to_host(L, step_slots_, window, stream);  // synchronizes the stream
  queries_.clear();
  for (uint32_t r = 0; r < n; ++r) {
    queries_.push_back({static_cast<uint32_t>(row_slot_[r]), selected + uint64_t{r} * stride, counts[r]});
  }
  fetches_.clear();
  auto* frames = frames_host_.as<int32_t>();
  auto* entries = fetch_host_.as<uint32_t>();
  const uint64_t capacity = fetch_host_.bytes() / (2 * sizeof(uint32_t));
  const uint32_t row_stride = shape.layers * shape.max_tokens;
  for (uint32_t first = 0; first < n;) {
    const size_t f0 = fetches_.size();
    auto end = window.plan(queries_, first, frames, stride, fetches_);
    if (!end) throw CudaError("layer " + std::to_string(first_ + L) + ": " + end.error().message, end.error().code);
    const uint32_t last = end.value();
    const size_t f1 = fetches_.size();
    if (f1 > capacity) throw CudaError("resident KV window: fetch list overflow", ErrorCode::internal);
    for (size_t f = f0; f < f1; ++f) {
      const kv::WindowFetch& w = fetches_[f];
      entries[2 * f] = w.slot * row_stride + L * shape.max_tokens + w.position;
      entries[2 * f + 1] = w.row;
    }
    int32_t* frames_dev = frames_dev_.as<int32_t>() + uint64_t{first} * stride;
    FERRY_CUDA(cudaMemcpyAsync(frames_dev, frames + uint64_t{first} * stride,
                               uint64_t{last - first} * stride * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
    if (f1 > f0) {
      uint32_t* entries_dev = fetch_dev_.as<uint32_t>() + 2 * f0;
      FERRY_CUDA(cudaMemcpyAsync(entries_dev, entries + 2 * f0, (f1 - f0) * 2 * sizeof(uint32_t),
                                 cudaMemcpyHostToDevice, stream));
      WindowCopy c = fetch_copy(st);
      c.entries = entries_dev;
      c.n = static_cast<uint32_t>(f1 - f0);
      copy_window_rows(c, stream);
      const uint64_t bytes = (f1 - f0) * (row_bytes_ + (c.src_scales ? sizeof(float) : 0));
      counts_.fetched_bytes += bytes;
      counts_.last_fetched_rows += f1 - f0;
      counts_.last_fetched_bytes += bytes;
    }
    SparseMlaArgs g = a;
    g.rows = last - first;
    g.split_rows = a.rows;
    g.row.slot = a.row.slot + first;
    g.row.pos = a.row.pos + first;
    if (a.row.seg_first_row != nullptr) g.row.seg_first_row = a.row.seg_first_row + first;
    g.q_lat = a.q_lat + uint64_t{first} * a.heads * a.rank;
    g.out = a.out + uint64_t{first} * a.heads * a.rank;
    g.tokens = frames_dev;
    g.counts = a.counts + first;
    g.ctx = 0;  // the table holds window rows
    g.latents = st.latents;
    g.latent_scales = st.latent_scales;
    sparse_mla(g, stream);
    window.end_group();
    first = last;
  }
  planner_->from_host(L, step_slots_, window, stream);
}

void KvWindow::reset(uint32_t slot) {
  tier_->reset(slot);
  for (kv::ResidentWindow& w : windows_) w.reset(slot);
  cuts_.emplace_back(slot, 0);  // also when the tier held nothing to cut
  in_window_[slot] = 1;
}

Status KvWindow::restore_rows(uint32_t slot, uint32_t il, const void* data, const float* scales, uint32_t n) {
  auto claimed = tier_->claim(slot, ordinal(il), 0, n);
  if (!claimed) return claimed.error();
  std::memcpy(claimed.value().data, data, n * row_bytes_);
  if (claimed.value().scales != nullptr) std::memcpy(claimed.value().scales, scales, n * sizeof(float));
  return std::nullopt;
}

const void* KvWindow::host_rows(uint32_t slot, uint32_t il) const { return tier_->row_data(slot, ordinal(il), 0); }
const float* KvWindow::host_scales(uint32_t slot, uint32_t il) const { return tier_->row_scale(slot, ordinal(il), 0); }

KvWindowStats KvWindow::stats(const std::vector<uint32_t>& tokens) const {
  KvWindowStats s = counts_;
  s.window_rows = uint64_t{resident_} * slots_ * windows_.size();
  for (const kv::ResidentWindow& w : windows_) {
    const kv::WindowCounters c = w.counters();  // the steps planned on the host
    s.hits += c.hits;
    s.misses += c.misses;
  }
  const WindowCounts d = planner_->published_counts();  // as of the last windowed step's end
  const uint64_t fetch_bytes = row_bytes_ + (type_ == config::KvType::int8 ? sizeof(float) : 0);
  s.hits += d.hits;
  s.misses += d.misses;
  s.fetched_bytes += d.misses * fetch_bytes;
  if (d.errors > 0) {
    throw CudaError("resident KV window: the device planner met " + std::to_string(d.errors) +
                        " selected rows it could not place (out of range, or more than the window pins)",
                    ErrorCode::internal);
  }
  const PrefillGather::Counts g = gather_->counts();
  if (g.errors > 0) {
    throw CudaError("resident KV window: a prefill selected " + std::to_string(g.errors) + " positions out of range",
                    ErrorCode::internal);
  }
  s.prefill_groups = g.groups;
  s.prefill_rows = g.rows;
  s.prefill_tier_rows = g.tier_rows;
  if (last_on_device_) {
    s.last_fetched_rows = d.step_fetched;
    s.last_fetched_bytes = d.step_fetched * fetch_bytes;
  }
  const std::vector<uint64_t> resident = planner_->published_resident();
  for (uint32_t slot = 0; slot < slots_; ++slot) {
    s.resident_rows += in_window(slot) ? uint64_t{std::min(tokens[slot], resident_)} * windows_.size() : resident[slot];
  }
  for (uint32_t slot = 0; slot < slots_; ++slot) s.host_bytes[slot] = tier_->slot_bytes(slot);
  s.host_capacity = tier_->capacity_bytes();
  return s;
}

}  // namespace ferry::gpu
