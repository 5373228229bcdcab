#pragma once
// --synthetic CONFIG.json [--type T] [--recipe R], as serve, bench and plan read it: the shape, the
// type of the large matrices and the per-tensor rules, checked before anything is made.
#include <string>

#include "config/expected.hpp"
#include "model/formats/ggml_type.hpp"
#include "model/glm5/glm5_hparams.hpp"
#include "model/glm5/glm5_type_rules.hpp"

namespace ferry::cli {

struct SyntheticSource {
  model::Glm5Hparams hparams;
  model::GgmlType type = model::GgmlType::Q4_K;
  model::Glm5TypeRules rules;  // --recipe
};

// An error names the option and what was wrong with it.
Expected<SyntheticSource> read_synthetic_source(const std::string& config_json, const std::string& type,
                                                const std::string& recipe);

}  // namespace ferry::cli
