#include "model/stage.hpp"

#include "model/glm5/glm5_tensors.hpp"

namespace ferry::model {

std::string describe_layers(LayerRange layers) {
  return layers.size() == 1 ? "layer " + std::to_string(layers.first)
                            : "layers " + std::to_string(layers.first) + "-" + std::to_string(layers.end - 1);
}

Status check_stage_ranges(const Glm5Hparams& hp, const std::vector<LayerRange>& ranges) {
  for (const LayerRange& r : ranges) {
    for (uint32_t l = r.first; l < r.end; ++l) {
      if (hp.layer_kinds[l] != LayerKind::dsa) continue;
      if (glm5_has_indexer(hp, l)) break;  // the stage's first DSA layer selects for itself
      int64_t full = int64_t{l} - 1;
      while (full >= 0 && !(hp.layer_kinds[full] == LayerKind::dsa && glm5_has_indexer(hp, static_cast<uint32_t>(full)))) {
        --full;
      }
      return Error(ErrorCode::invalid_input, "--split: layer " + std::to_string(l) +
                                                 " reuses the DSA selection of layer " + std::to_string(full) +
                                                 ", which is in an earlier stage; start the stage at or before it");
    }
  }
  return std::nullopt;
}

}  // namespace ferry::model
