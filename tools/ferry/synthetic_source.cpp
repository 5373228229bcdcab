#include "tools/ferry/synthetic_source.hpp"

namespace ferry::cli {

Expected<SyntheticSource> read_synthetic_source(const std::string& config_json, const std::string& type,
                                                const std::string& recipe) {
  auto hparams = model::glm5_hparams_from_hf_config_file(config_json);
  if (!hparams) return hparams.error().prefixed("--synthetic " + config_json + ": ");
  const auto t = model::ggml_type_from_name(type);
  if (!t) return Error("--type '" + type + "' is not a ggml type name (q4_k, q8_0, f16, ...)");
  SyntheticSource source{hparams.value(), *t, {}};
  if (!recipe.empty()) {
    auto rules = model::Glm5TypeRules::load_recipe(recipe);
    if (!rules) return rules.error();
    source.rules = std::move(rules.value());
  }
  return source;
}

}  // namespace ferry::cli
