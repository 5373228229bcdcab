#pragma once
// The stages of a model run one after another on the calling thread: what `ferry run`, `bench` and
// `eval-ref` use (the server runs each stage on its own actor instead). A step larger than a stage
// takes goes through in consecutive pieces.
#include <memory>
#include <string>
#include <vector>

#include "config/expected.hpp"
#include "model/stage.hpp"

namespace ferry::model {

class Pipeline {
 public:
  // The stages must cover the trunk's layers in order; each is connected to the next.
  static Expected<std::unique_ptr<Pipeline>> make(std::vector<std::shared_ptr<Stage>> stages);

  const Glm5Hparams& hparams() const { return stages_.front()->hparams(); }
  uint32_t max_slots() const { return stages_.front()->max_slots(); }
  uint32_t max_context() const { return stages_.front()->max_context(); }
  const std::vector<std::shared_ptr<Stage>>& stages() const { return stages_; }

  Status reset_slot(uint32_t slot);
  // Every slot's rows through every stage; results in the order of `rows` (SlotResult's contract:
  // logits when logits_all or !sample, the sampled token when sample).
  Expected<std::vector<SlotResult>> step(const std::vector<SlotRows>& rows);
  // One image per stage, in stage order.
  Expected<std::vector<SlotStateImage>> save_slot(uint32_t slot, bool with_rows);
  Status restore_slot(uint32_t slot, const std::vector<SlotStateImage>& images);
  std::string describe() const;

 private:
  explicit Pipeline(std::vector<std::shared_ptr<Stage>> stages) : stages_(std::move(stages)) {}
  Expected<std::vector<SlotResult>> run_chunk(const std::vector<SlotRows>& rows);
  std::vector<std::shared_ptr<Stage>> stages_;
};

}  // namespace ferry::model
