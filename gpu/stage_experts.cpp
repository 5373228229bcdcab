#include "gpu/stage_experts.hpp"

#include <algorithm>
#include <cmath>

#include "gpu/kernels.hpp"
#include "model/glm5/glm5_tensors.hpp"

namespace ferry::gpu {

StageExperts::StageExperts(const model::Glm5Hparams& hp, model::LayerRange layers, ExpertSource& source,
                           std::shared_ptr<HostExpertStore> host, const StageExpertsPlan& plan, cudaStream_t compute,
                           cudaStream_t copy)
    : experts_(hp.n_experts),
      experts_used_(hp.n_experts_used),
      slot_bytes_(host->slot_bytes()),
      host_(std::move(host)),
      compute_(compute),
      copy_(copy),
      miss_path_(plan.miss_path),
      layer_index_(hp.n_layers, ~0u) {
  for (uint32_t l = layers.first; l < layers.end; ++l) {
    if (model::glm5_ffn_kind(hp, l) != model::FfnKind::moe) continue;
    layer_index_[l] = static_cast<uint32_t>(layers_.size());
    Layer& layer = layers_.emplace_back();
    layer.index = l;
    layer.shape = source.shape(l);
    if (layer.shape.bytes > slot_bytes_) {
      throw CudaError("an expert of layer " + std::to_string(l) + " is larger than the host store's slots",
                      ErrorCode::internal);
    }
    layer.base.assign(experts_, nullptr);
    layer.slot.assign(experts_, -1);
    for (uint32_t e = 0; e < experts_; ++e) {
      const int64_t h = plan.host_slot.at(size_t{l} * experts_ + e);
      if (h >= 0) layer.base[e] = host_->slot(static_cast<uint32_t>(h));
    }
  }
  pool_ = DeviceBuffer(std::max<uint64_t>(plan.pooled.size(), 1) * slot_bytes_);
  for (uint32_t s = 0; s < plan.pooled.size(); ++s) {
    const model::ExpertId id = plan.pooled[s];
    Layer& layer = layers_.at(local(id.layer));
    source.write(id.layer, id.expert, pool_slot(s), true, compute_);
    layer.slot[id.expert] = static_cast<int32_t>(s);
    layer.base[id.expert] = pool_slot(s);
  }
  for (const Layer& layer : layers_) {
    for (uint32_t e = 0; e < experts_; ++e) {
      if (layer.base[e] == nullptr) {
        throw CudaError("expert " + std::to_string(e) + " of layer " + std::to_string(layer.index) +
                            " is in neither the pool nor the host store",
                        ErrorCode::internal);
      }
    }
  }
  // Tables: [layer][part][expert], written once from the mirror; later entries one by one.
  std::vector<const uint8_t*> tables(layers_.size() * 3 * experts_);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& layer = layers_[i];
    for (uint32_t e = 0; e < experts_; ++e) {
      tables[(i * 3 + 0) * experts_ + e] = layer.base[e];
      tables[(i * 3 + 1) * experts_ + e] = layer.base[e] + layer.shape.up_offset;
      tables[(i * 3 + 2) * experts_ + e] = layer.base[e] + layer.shape.down_offset;
    }
  }
  tables_ = DeviceBuffer(std::max<size_t>(tables.size(), 1) * sizeof(uint8_t*));
  FERRY_CUDA(cudaMemcpyAsync(tables_.get(), tables.data(), tables.size() * sizeof(uint8_t*), cudaMemcpyHostToDevice,
                             compute_));
  counts_device_ = DeviceBuffer(std::max<size_t>(layers_.size() * experts_, 1) * sizeof(uint32_t));
  counts_host_ = PinnedBuffer(counts_device_.bytes());
  FERRY_CUDA(cudaMemsetAsync(counts_device_.get(), 0, counts_device_.bytes(), compute_));
  counts_.assign(layers_.size() * experts_, 0);
  for (Staging& s : staging_) {
    if (plan.staging_bytes >= 2 * slot_bytes_) s.buffer = DeviceBuffer(plan.staging_bytes / 2);
  }
  prefill_region_ = 3 * size_t{experts_} * sizeof(uint8_t*) + (experts_ + 7) / 8 * 8;
  prefill_host_ = PinnedBuffer(std::max<size_t>(layers_.size(), 1) * prefill_region_);
  prefill_device_ = DeviceBuffer(prefill_host_.bytes());
  for (size_t i = 0; i < layers_.size(); ++i) prefill_copied_.push_back(std::make_unique<Event>(false));
  tally_device_ = DeviceBuffer(5 * sizeof(unsigned long long));
  tally_host_ = PinnedBuffer(tally_device_.bytes());
  FERRY_CUDA(cudaMemsetAsync(tally_device_.get(), 0, tally_device_.bytes(), compute_));
  FERRY_CUDA(cudaStreamSynchronize(compute_));
  counters_.pool_slots = static_cast<uint32_t>(plan.pooled.size());
  counters_.pool_used = counters_.pool_slots;
}

StageExperts::~StageExperts() {
  // Moves in flight copy into the pool and the store: let them end before either goes.
  cudaStreamSynchronize(copy_);
  cudaStreamSynchronize(compute_);
}

const uint8_t* const* StageExperts::table(uint32_t layer, int part) const {
  return tables_.as<const uint8_t*>() + (size_t{local(layer)} * 3 + static_cast<size_t>(part)) * experts_;
}

void StageExperts::point(const model::ExpertId& id, const uint8_t* base) {
  Layer& layer = layers_.at(local(id.layer));
  const uint64_t offsets[3] = {0, layer.shape.up_offset, layer.shape.down_offset};
  for (int p = 0; p < 3; ++p) {
    const uint8_t** entries = tables_.as<const uint8_t*>() + (size_t{local(id.layer)} * 3 + static_cast<size_t>(p)) * experts_;
    set_table_entry(entries, id.expert, base + offsets[p], compute_);
  }
  layer.base[id.expert] = base;
}

bool StageExperts::uploads_for(uint32_t rows) const {
  if (miss_path_ == "mapped" || staging_[0].buffer.bytes() == 0) return false;
  if (miss_path_ == "upload") return true;
  // Uploading every missing expert pays when the chunk is likely to touch nearly all of them (the
  // copies run beside the layers before, and unused ones are wasted): each of `rows` rows routes to k
  // of E experts, so an expert is touched with probability 1 - (1 - k/E)^rows.
  const double untouched = std::pow(1.0 - static_cast<double>(experts_used_) / experts_, rows);
  return untouched <= 0.1;
}

void StageExperts::stage_layer(uint32_t layer) {
  Staging& s = staging_[next_staging_];
  next_staging_ ^= 1u;
  const Layer& l = layers_.at(local(layer));
  s.layer = layer;
  s.where.assign(experts_, nullptr);
  FERRY_CUDA(cudaStreamWaitEvent(copy_, s.free.get(), 0));
  uint64_t at = 0;
  for (uint32_t e = 0; e < experts_; ++e) {
    if (l.slot[e] >= 0 || at + l.shape.bytes > s.buffer.bytes()) continue;
    uint8_t* dst = s.buffer.as<uint8_t>() + at;
    FERRY_CUDA(cudaMemcpyAsync(dst, l.base[e], l.shape.bytes, cudaMemcpyHostToDevice, copy_));
    s.where[e] = dst;
    at += l.shape.bytes;
  }
  s.ready.record(copy_);
}

void StageExperts::wait_staged(uint32_t layer) {
  for (Staging& s : staging_) {
    if (s.layer == layer) FERRY_CUDA(cudaStreamWaitEvent(compute_, s.ready.get(), 0));
  }
}

void StageExperts::release_staged(uint32_t layer) {
  for (Staging& s : staging_) {
    if (s.layer != layer) continue;
    s.free.record(compute_);
    s.layer = ~0u;
  }
}

const uint8_t* StageExperts::staged(uint32_t layer, uint32_t e) const {
  for (const Staging& s : staging_) {
    if (s.layer == layer) return s.where[e];
  }
  return nullptr;
}

StageExperts::PrefillView StageExperts::prefill_view(uint32_t layer, bool upload) {
  const uint32_t i = local(layer);
  const Layer& l = layers_.at(i);
  Event& copied = *prefill_copied_[i];
  FERRY_CUDA(cudaEventSynchronize(copied.get()));  // the previous step's copy of this layer has run
  uint8_t* host = prefill_host_.as<uint8_t>() + i * prefill_region_;
  const uint8_t** table = reinterpret_cast<const uint8_t**>(host);
  uint8_t* category = host + 3 * size_t{experts_} * sizeof(uint8_t*);
  for (uint32_t e = 0; e < experts_; ++e) {
    const uint8_t* staged_at = upload ? staged(layer, e) : nullptr;
    const uint8_t* base = staged_at != nullptr ? staged_at : l.base[e];
    table[e] = base;
    table[experts_ + e] = base + l.shape.up_offset;
    table[2 * experts_ + e] = base + l.shape.down_offset;
    category[e] = l.slot[e] >= 0 ? 0 : staged_at != nullptr ? 1 : 2;
  }
  uint8_t* device = prefill_device_.as<uint8_t>() + i * prefill_region_;
  FERRY_CUDA(cudaMemcpyAsync(device, host, prefill_region_, cudaMemcpyHostToDevice, compute_));
  copied.record(compute_);
  const uint8_t* const* d = reinterpret_cast<const uint8_t* const*>(device);
  PrefillView v{{d, d + experts_, d + 2 * size_t{experts_}}, {}};
  v.tally.category = device + 3 * size_t{experts_} * sizeof(uint8_t*);
  v.tally.expert_bytes = l.shape.bytes;
  v.tally.counters = tally_device_.as<unsigned long long>();
  return v;
}

void StageExperts::after_step() {
  if (counts_pending_) return;  // the device keeps counting until the last copy is collected
  FERRY_CUDA(cudaMemcpyAsync(counts_host_.get(), counts_device_.get(), counts_device_.bytes(), cudaMemcpyDeviceToHost,
                             compute_));
  FERRY_CUDA(cudaMemsetAsync(counts_device_.get(), 0, counts_device_.bytes(), compute_));
  FERRY_CUDA(cudaMemcpyAsync(tally_host_.get(), tally_device_.get(), tally_device_.bytes(), cudaMemcpyDeviceToHost,
                             compute_));
  FERRY_CUDA(cudaMemsetAsync(tally_device_.get(), 0, tally_device_.bytes(), compute_));
  counts_copied_.record(compute_);
  counts_pending_ = true;
}

void StageExperts::before_step() {
  if (counts_pending_ && counts_copied_.done()) {
    const uint32_t* c = counts_host_.as<uint32_t>();
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& layer = layers_[i];
      for (uint32_t e = 0; e < experts_; ++e) {
        const uint32_t n = c[i * experts_ + e];
        if (n == 0) continue;
        counts_[i * experts_ + e] += n;
        counters_.routes += n;
        if (layer.slot[e] >= 0) {
          counters_.hits += n;
        } else {
          counters_.misses_mapped += n;
          counters_.bytes_mapped += uint64_t{n} * layer.shape.bytes;
        }
      }
    }
    const unsigned long long* t = tally_host_.as<unsigned long long>();
    counters_.routes += t[0] + t[1] + t[2];
    counters_.hits += t[0];
    counters_.misses_uploaded += t[1];
    counters_.misses_mapped += t[2];
    counters_.bytes_uploaded += t[3];
    counters_.bytes_mapped += t[4];
    counts_pending_ = false;
  }
  for (Moving& m : moving_) {
    while (m.phase < 4 && (m.done == nullptr || m.done->done())) advance(m);
  }
  while (!moving_.empty() && moving_.front().phase == 4) {
    finished_.push_back(moving_.front().move);
    moving_.pop_front();
  }
  counters_.swaps_in_flight = static_cast<uint32_t>(moving_.size());
  const auto emptied = std::count_if(moving_.begin(), moving_.end(), [](const Moving& m) { return m.phase == 2 || m.phase == 3; });
  counters_.pool_used = counters_.pool_slots - static_cast<uint32_t>(emptied);
}

// One phase of a swap; each records `done`, and the next starts only once the device reached it.
void StageExperts::advance(Moving& m) {
  if (m.done == nullptr) m.done = std::make_unique<Event>(false);
  const model::ExpertMove& mv = m.move;
  uint8_t* slot = pool_slot(m.slot);
  switch (m.phase) {
    case 0:
      if (mv.copy_evicted) {
        FERRY_CUDA(cudaMemcpyAsync(host_->slot(mv.evict_host), slot, layers_.at(local(mv.evict.layer)).shape.bytes,
                                   cudaMemcpyDeviceToHost, copy_));
      }
      m.done->record(copy_);
      break;
    case 1:  // from here on nothing new reads the evicted expert in the slot
      point(mv.evict, host_->slot(mv.evict_host));
      layers_[local(mv.evict.layer)].slot[mv.evict.expert] = -1;
      m.done->record(compute_);
      ++counters_.evictions;
      break;
    case 2:  // what read it before has run: the slot is free
      FERRY_CUDA(cudaMemcpyAsync(slot, host_->slot(mv.promote_host), layers_.at(local(mv.promote.layer)).shape.bytes,
                                 cudaMemcpyHostToDevice, copy_));
      m.done->record(copy_);
      break;
    case 3:
      point(mv.promote, slot);
      layers_[local(mv.promote.layer)].slot[mv.promote.expert] = static_cast<int32_t>(m.slot);
      m.done->record(compute_);
      ++counters_.promotions;
      break;
    default:
      break;
  }
  ++m.phase;
}

void StageExperts::start_moves(const std::vector<model::ExpertMove>& moves) {
  for (const model::ExpertMove& mv : moves) {
    const Layer& from = layers_.at(local(mv.evict.layer));
    if (from.slot[mv.evict.expert] < 0 || layers_.at(local(mv.promote.layer)).slot[mv.promote.expert] >= 0) {
      throw CudaError("expert move out of step with the pool", ErrorCode::internal);
    }
    Moving m;
    m.move = mv;
    m.slot = static_cast<uint32_t>(from.slot[mv.evict.expert]);
    moving_.push_back(std::move(m));
  }
}

model::RouteCounts StageExperts::take_route_counts() {
  model::RouteCounts out;
  out.experts = experts_;
  for (const Layer& l : layers_) out.layers.push_back(l.index);
  out.counts = counts_;
  std::fill(counts_.begin(), counts_.end(), 0);
  return out;
}

std::vector<model::ExpertMove> StageExperts::take_finished_moves() {
  std::vector<model::ExpertMove> out;
  out.swap(finished_);
  return out;
}

std::vector<std::vector<uint32_t>> StageExperts::pooled() const {
  std::vector<std::vector<uint32_t>> out;
  for (const Layer& l : layers_) {
    auto& v = out.emplace_back();
    for (uint32_t e = 0; e < experts_; ++e) {
      if (l.slot[e] >= 0) v.push_back(e);
    }
  }
  return out;
}

}  // namespace ferry::gpu
