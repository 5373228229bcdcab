#include "kv/checkpoint_store.hpp"

#include <set>
#include <string>

namespace ferry::kv {

Status CheckpointStore::save(model::Stage& stage, uint32_t slot, uint64_t id, uint32_t tokens) {
  auto image = stage.save_slot(slot, false);
  if (!image) return image.error();
  if (image->tokens != tokens) {
    return Error(ErrorCode::invalid_plan, "slot " + std::to_string(slot) + " holds " + std::to_string(image->tokens) +
                                              " positions, not the checkpoint's " + std::to_string(tokens));
  }
  entries_.insert_or_assign(id, Entry{std::move(image.value()), nullptr});
  return std::nullopt;
}

Status CheckpointStore::spill(model::Stage& stage, uint32_t slot, std::span<const uint64_t> ids) {
  auto image = stage.save_slot(slot, true);
  if (!image) return image.error();
  auto rows = std::make_shared<const model::SlotStateImage>(std::move(image.value()));
  for (uint64_t id : ids) {
    auto it = entries_.find(id);
    if (it == entries_.end()) continue;  // dropped meanwhile
    if (it->second.state.tokens > rows->tokens) {
      return Error(ErrorCode::invalid_plan, "checkpoint " + std::to_string(id) + " of " +
                                                std::to_string(it->second.state.tokens) + " tokens is longer than the " +
                                                std::to_string(rows->tokens) + " slot " + std::to_string(slot) + " holds");
    }
    it->second.rows = rows;
  }
  return std::nullopt;
}

Status CheckpointStore::restore(model::Stage& stage, uint32_t slot, uint64_t id) const {
  const auto it = entries_.find(id);
  if (it == entries_.end()) {
    return Error(ErrorCode::invalid_plan, "checkpoint " + std::to_string(id) + " is not held by " +
                                              model::describe_layers(stage.layers()));
  }
  if (it->second.rows) {
    if (auto e = stage.restore_slot(slot, *it->second.rows)) return e;
  }
  return stage.restore_slot(slot, it->second.state);
}

uint64_t CheckpointStore::bytes() const {
  uint64_t n = 0;
  std::set<const model::SlotStateImage*> rows;
  for (const auto& [id, e] : entries_) {
    n += e.state.data.size() * sizeof(float);
    if (e.rows && rows.insert(e.rows.get()).second) n += e.rows->data.size() * sizeof(float);
  }
  return n;
}

const model::SlotStateImage* CheckpointStore::find(uint64_t id) const {
  const auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second.state;
}

bool CheckpointStore::spilled(uint64_t id) const { return rows(id) != nullptr; }

const model::SlotStateImage* CheckpointStore::rows(uint64_t id) const {
  const auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : it->second.rows.get();
}

}  // namespace ferry::kv
