// bench --fill random's slot states: images of the layout that a stage restores (the KV format's
// checks pass: whole int8 codes in range, a positive scale, exact halves) and decodes from with finite
// logits; the same seed draws the same state.
#include "kv/random_slot_state.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "model/cpu/cpu_stage.hpp"
#include "model/pipeline.hpp"
#include "tests/model/random_model.hpp"

namespace ferry::kv {
namespace {

TEST(RandomSlotState, AStageRestoresItAndDecodesFromIt) {
  const model::Glm5Hparams hp = testing::five_layer_hparams();
  const auto path = testing::temp_model_path("random_slot_state_test");
  ASSERT_TRUE(testing::write_random_model(hp, model::GgmlType::F32, path, 5));
  auto w = model::Glm5Weights::load(path);
  ASSERT_TRUE(w) << w.error().message;
  std::shared_ptr<const model::Glm5Weights> weights = std::move(w.value());
  for (config::KvType t : {config::KvType::f32, config::KvType::f16, config::KvType::int8}) {
    model::CpuStageOptions o;
    o.max_slots = 2;
    o.kv.latent = t;
    auto p = model::Pipeline::make(model::make_cpu_stages(weights, {{0, 2}, {2, hp.n_layers}}, 1, o));
    ASSERT_TRUE(p) << p.error().message;
    std::vector<model::SlotStateImage> images;
    for (const auto& s : p.value()->stages()) {
      images.push_back(random_slot_state(s->state_layout(), 40, 7));
      EXPECT_FALSE(s->state_layout().check(images.back()));
    }
    ASSERT_FALSE(p.value()->restore_slot(1, images)) << config::kv_type_name(t);
    auto out = p.value()->step({model::SlotRows{1, 40, {3}, true, false, {}}});
    ASSERT_TRUE(out) << out.error().message;
    for (float x : (*out)[0].logits) ASSERT_TRUE(std::isfinite(x));
    auto saved = p.value()->save_slot(1, true);
    ASSERT_TRUE(saved);
    EXPECT_EQ(saved.value()[0].tokens, 41u);
  }
  const model::SlotStateLayout layout(hp, {0, hp.n_layers}, false, {config::KvType::int8, config::KvType::f32});
  EXPECT_EQ(random_slot_state(layout, 9, 1).data, random_slot_state(layout, 9, 1).data);
  EXPECT_NE(random_slot_state(layout, 9, 1).data, random_slot_state(layout, 9, 2).data);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace ferry::kv
