#include "kv/checkpoint_store.hpp"

#include <string>

namespace ferry::kv {

Status CheckpointStore::save(model::Stage& stage, uint32_t slot, uint64_t id) {
  auto image = stage.save_slot(slot, true);
  if (!image) return image.error();
  images_.insert_or_assign(id, std::move(image.value()));
  return std::nullopt;
}

Status CheckpointStore::restore(model::Stage& stage, uint32_t slot, uint64_t id) const {
  const auto it = images_.find(id);
  if (it == images_.end()) {
    return Error(ErrorCode::invalid_plan, "checkpoint " + std::to_string(id) + " is not held by " +
                                              model::describe_layers(stage.layers()));
  }
  return stage.restore_slot(slot, it->second);
}

uint64_t CheckpointStore::bytes() const {
  uint64_t n = 0;
  for (const auto& [id, image] : images_) n += image.data.size() * sizeof(float);
  return n;
}

const model::SlotStateImage* CheckpointStore::find(uint64_t id) const {
  const auto it = images_.find(id);
  return it == images_.end() ? nullptr : &it->second;
}

}  // namespace ferry::kv
