#pragma once
// A test-only Stage for actor tests: the last stage draws "the row's last token + 1", earlier stages
// hand their rows on, and every stage records the steps it carried and the slots it reset, so a test
// can see which rows each step held. It can be told to fail a step as a device would.
#include <memory>
#include <string>
#include <vector>

#include "model/pipeline.hpp"
#include "model/stage.hpp"

namespace ferry::testing {

class ScriptedStage : public model::Stage {
 public:
  // Layers [first, end) of a model of `layers` layers.
  explicit ScriptedStage(uint32_t slots = 3, uint32_t context = 1024, uint32_t vocab = 1000,
                         model::LayerRange range = {0, 1}, uint32_t layers = 1)
      : slots_(slots), context_(context), range_(range), layout_(make_hparams(vocab, layers), range, false) {
    hparams_ = make_hparams(vocab, layers);
  }
  const model::Glm5Hparams& hparams() const override { return hparams_; }
  model::LayerRange layers() const override { return range_; }
  uint32_t max_slots() const override { return slots_; }
  uint32_t max_context() const override { return context_; }
  uint32_t max_step_rows() const override { return 1u << 20; }
  Status connect(model::Stage&) override { return std::nullopt; }
  Status reset_slot(uint32_t slot) override {
    resets.push_back(slot);
    return std::nullopt;
  }
  Expected<model::StageOutput> run(const std::vector<model::SlotRows>& rows, const model::Handoff*) override {
    steps.push_back(rows);
    if (fail_at_step != 0 && steps.size() >= fail_at_step) {
      return Error(ErrorCode::device_error, "scripted device failure");
    }
    model::StageOutput out;
    if (!last()) {
      out.handoff = std::make_shared<Rows>(model::total_rows(rows));
      return out;
    }
    for (const auto& row : rows) {
      model::SlotResult r;
      r.slot = row.slot;
      if (row.sample) r.sampled = draw(row);
      out.results.push_back(r);
    }
    return out;
  }
  void discard(const model::Handoff&) override {}
  Expected<model::SlotStateImage> save_slot(uint32_t, bool) override {
    return Error(ErrorCode::unsupported, "the scripted stage keeps no state");
  }
  Status restore_slot(uint32_t, const model::SlotStateImage&) override {
    return Error(ErrorCode::unsupported, "the scripted stage keeps no state");
  }
  const model::SlotStateLayout& state_layout() const override { return layout_; }
  model::StageCounters counters() const override {
    model::StageCounters c;
    c.steps = steps.size();
    return c;
  }
  std::string describe() const override { return "scripted test stage"; }

  std::vector<std::vector<model::SlotRows>> steps;
  std::vector<uint32_t> resets;
  size_t fail_at_step = 0;  // 0: never

 protected:
  virtual int32_t draw(const model::SlotRows& row) {
    return (row.tokens.back() + 1) % static_cast<int32_t>(hparams_.vocab_size);
  }

 private:
  struct Rows final : model::Handoff {
    explicit Rows(uint32_t n) : n(n) {}
    uint32_t rows() const override { return n; }
    uint64_t bytes() const override { return 0; }
    uint32_t n;
  };
  static model::Glm5Hparams make_hparams(uint32_t vocab, uint32_t layers) {
    model::Glm5Hparams hp;
    hp.vocab_size = vocab;
    hp.n_layers = layers;
    hp.layer_kinds.assign(layers, model::LayerKind::kda);
    hp.ffn_kinds.assign(layers, model::FfnKind::dense);
    return hp;
  }

  uint32_t slots_, context_;
  model::LayerRange range_;
  model::Glm5Hparams hparams_;
  model::SlotStateLayout layout_;
};

// A pipeline of the given stages, connected (the test keeps its own pointers to them).
inline std::unique_ptr<model::Pipeline> pipeline_of(std::vector<std::shared_ptr<model::Stage>> stages) {
  auto p = model::Pipeline::make(std::move(stages));
  return p ? std::move(p.value()) : nullptr;
}

}  // namespace ferry::testing
