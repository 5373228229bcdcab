#pragma once
// A step's inputs on the device: per row its token, slot, position and segment; per segment (one
// slot's consecutive rows) its slot, start, length and first row; on the last stage also which rows
// need logits and how each is drawn (SampleRow). Written into pinned host memory and uploaded in one
// copy on the stage's stream; a captured decode graph reads them from the same place every step.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "model/step.hpp"

namespace ferry::gpu {

struct StepGeometry {
  uint32_t rows = 0, segments = 0, max_seg_rows = 0;
  RowInfo row;
  SegInfo seg;
};

// A row whose logits the last stage computes: `rows[source]`'s row `row` of the step.
struct LogitRow {
  size_t source = 0;
  uint32_t row = 0;
  bool keep = false;  // the logits go back to the caller
  bool draw = false;  // the caller takes the token chosen from them
};

class StepInput {
 public:
  explicit StepInput(uint32_t max_rows);

  // Stages the rows (validated by the caller) and enqueues their upload on `stream`. With `head`,
  // lists the rows that need logits, row j's at row j % logit_batch of the logits buffer.
  StepGeometry stage(const std::vector<model::SlotRows>& rows, bool head, uint32_t logit_batch, cudaStream_t stream);

  const int32_t* tokens() const { return device_.as<int32_t>(); }
  const int32_t* logit_rows() const { return device_.as<int32_t>() + 8 * size_t{max_rows_}; }
  const SampleRow* sample_rows() const { return reinterpret_cast<const SampleRow*>(device_.as<int32_t>() + sample_at()); }
  int32_t* sampled() const { return device_.as<int32_t>() + sampled_at(); }
  int32_t* sampled_host() const { return sampled_host_.as<int32_t>(); }
  const std::vector<LogitRow>& logit_list() const { return wants_; }
  // Every row set draws from each of its rows and returns nothing else (a row, or a verify set of a
  // token and its drafts), none restarts its slot: a decode step a captured graph can replay.
  bool decode_only() const { return decode_only_; }

 private:
  // Where the SampleRows (8-byte aligned) and the chosen tokens sit, in ints.
  size_t sample_at() const { return (9 * size_t{max_rows_} + 1) / 2 * 2; }
  size_t sampled_at() const { return sample_at() + 8 * size_t{max_rows_}; }

  uint32_t max_rows_;
  PinnedBuffer host_, sampled_host_;
  DeviceBuffer device_;
  Event uploaded_{false};
  bool pending_ = false;
  std::vector<LogitRow> wants_;
  bool decode_only_ = false;
};

}  // namespace ferry::gpu
