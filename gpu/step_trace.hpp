#pragma once
// A step's discrete choices as the device made them, for tests that compare them with the CPU's: the
// DSA selection of each full-indexer layer and the MoE routes of each MoE layer, per row. Copying
// them back synchronizes the stream, so a stage records them on eager steps only (never in a graph).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace ferry::gpu {

struct StepTrace {
  struct Selection {
    uint32_t layer = 0;
    std::vector<std::vector<int32_t>> tokens;  // per row of the step: the positions it attends
  };
  struct Routes {
    uint32_t layer = 0;
    uint32_t k = 0;
    std::vector<int32_t> ids;  // [rows][k], best first
  };
  std::vector<Selection> selections;  // in the order the layers ran
  std::vector<Routes> routes;

  // Appends the selection of `rows` rows (tokens [rows][max_tokens], counts [rows], on the device).
  void add_selection(uint32_t layer, const int32_t* tokens, const int32_t* counts, uint32_t rows, uint32_t max_tokens,
                     cudaStream_t stream);
  // Appends the routes of `rows` rows (ids [rows][k], on the device).
  void add_routes(uint32_t layer, const int32_t* ids, uint32_t rows, uint32_t k, cudaStream_t stream);
};

}  // namespace ferry::gpu
