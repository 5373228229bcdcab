#pragma once
// A test-only Backend for actor tests: draws "the row's last token + 1" and records every call, so a
// test can see which rows each step carried. It can be told to fail a step.
#include <stdexcept>
#include <string>
#include <vector>

#include "model/backend.hpp"

namespace ferry::testing {

class ScriptedBackend : public model::Backend {
 public:
  explicit ScriptedBackend(uint32_t slots = 3, uint32_t context = 1024, uint32_t vocab = 1000)
      : slots_(slots), context_(context) {
    hparams_.vocab_size = vocab;
  }
  const model::Glm5Hparams& hparams() const override { return hparams_; }
  uint32_t max_slots() const override { return slots_; }
  uint32_t max_context() const override { return context_; }
  void reset_slot(uint32_t slot) override { resets.push_back(slot); }
  std::vector<model::SlotResult> step(const std::vector<model::SlotRows>& rows) override {
    steps.push_back(rows);
    if (fail_at_step != 0 && steps.size() >= fail_at_step) throw std::runtime_error("scripted device failure");
    std::vector<model::SlotResult> out;
    for (const auto& row : rows) {
      model::SlotResult r;
      r.slot = row.slot;
      if (row.sample) r.sampled = (row.tokens.back() + 1) % static_cast<int32_t>(hparams_.vocab_size);
      out.push_back(r);
    }
    return out;
  }
  std::string describe() const override { return "scripted test backend"; }

  std::vector<std::vector<model::SlotRows>> steps;
  std::vector<uint32_t> resets;
  size_t fail_at_step = 0;  // 0: never

 private:
  model::Glm5Hparams hparams_;
  uint32_t slots_;
  uint32_t context_;
};

}  // namespace ferry::testing
