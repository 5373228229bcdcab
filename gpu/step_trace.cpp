#include "gpu/step_trace.hpp"

#include <string>

#include "gpu/cuda_check.hpp"

namespace ferry::gpu {

void StepTrace::add_selection(uint32_t layer, const int32_t* tokens, const int32_t* counts, uint32_t rows,
                              uint32_t max_tokens, cudaStream_t stream) {
  std::vector<int32_t> all(size_t{rows} * max_tokens), n(rows);
  FERRY_CUDA(cudaMemcpyAsync(all.data(), tokens, all.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  FERRY_CUDA(cudaMemcpyAsync(n.data(), counts, n.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  FERRY_CUDA(cudaStreamSynchronize(stream));
  Selection s{layer, std::vector<std::vector<int32_t>>(rows)};
  for (uint32_t r = 0; r < rows; ++r) {
    if (n[r] < 0 || static_cast<uint32_t>(n[r]) > max_tokens) {
      throw CudaError("step trace: layer " + std::to_string(layer) + " row " + std::to_string(r) + " selected " +
                      std::to_string(n[r]) + " tokens (at most " + std::to_string(max_tokens) + ")");
    }
    const int32_t* t = all.data() + size_t{r} * max_tokens;
    s.tokens[r].assign(t, t + n[r]);
  }
  selections.push_back(std::move(s));
}

void StepTrace::add_routes(uint32_t layer, const int32_t* ids, uint32_t rows, uint32_t k, cudaStream_t stream) {
  Routes r{layer, k, std::vector<int32_t>(size_t{rows} * k)};
  FERRY_CUDA(cudaMemcpyAsync(r.ids.data(), ids, r.ids.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  FERRY_CUDA(cudaStreamSynchronize(stream));
  routes.push_back(std::move(r));
}

}  // namespace ferry::gpu
