#pragma once
// Decode steps replayed from CUDA graphs: one graph per row count, captured on the second step of
// that size (the first runs eagerly and settles lazy initialisation: cuBLAS heuristics, the kernels'
// attributes). A graph reads its step's inputs from fixed device buffers (gpu/step_input.hpp), so a
// replay needs no new arguments.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>

#include "gpu/cuda_memory.hpp"

namespace ferry::gpu {

class DecodeGraphs {
 public:
  explicit DecodeGraphs(bool enabled) : enabled_(enabled) {}
  // Enqueues `body` on `stream` for a step of `rows` rows: replayed, captured, or run eagerly.
  void run(uint32_t rows, cudaStream_t stream, const std::function<void()>& body);
  size_t captured() const { return graphs_.size(); }

 private:
  bool enabled_;
  std::map<uint32_t, GraphExec> graphs_;
  std::map<uint32_t, int> seen_;
};

}  // namespace ferry::gpu
