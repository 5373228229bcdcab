#include "gpu/backend_factory.hpp"

#include <algorithm>
#include <exception>

#include "gpu/device_info.hpp"
#include "model/cpu/cpu_backend.hpp"
#if FERRY_HAVE_CUDA
#include "gpu/cuda_backend.hpp"
#include "model/glm5/glm5_weights.hpp"
#endif

namespace ferry::gpu {
namespace {

using BackendResult = Expected<std::shared_ptr<model::Backend>>;

#if FERRY_HAVE_CUDA
CudaBackendOptions cuda_options(const BackendOptions& o, uint32_t trained_context) {
  CudaBackendOptions c;
  c.device = o.device;
  c.max_slots = o.max_slots;
  c.max_context = o.max_context != 0 ? o.max_context : std::min<uint32_t>(trained_context, 65536);
  c.max_step_rows = o.max_step_rows;
  return c;
}
#endif

}  // namespace

Expected<std::string> resolve_backend_kind(const std::string& kind) {
  using R = Expected<std::string>;
  if (kind == "cpu") return std::string("cpu");
  if (kind != "cuda" && kind != "auto") return R::failure("backend '" + kind + "' is not one of auto, cpu, cuda");
  std::string why;  // list_devices says why there is none, also in a build without CUDA
  const bool usable = !list_devices(&why).empty();
  if (usable) return std::string("cuda");
  if (kind == "auto") return std::string("cpu");
  return R::failure("backend cuda: " + why);
}

BackendResult open_backend(const std::filesystem::path& path, const BackendOptions& o) {
  auto kind = resolve_backend_kind(o.kind);
  if (!kind) return kind.error();
  if (kind.value() == "cpu") {
    model::CpuBackendOptions co;
    co.threads = o.threads;
    co.max_slots = o.max_slots;
    co.max_context = o.max_context;
    auto b = model::CpuBackend::open(path, co);
    if (!b) return b.error();
    return std::shared_ptr<model::Backend>(std::move(b.value()));
  }
#if FERRY_HAVE_CUDA
  auto w = model::Glm5Weights::load(path);
  if (!w) return w.error().prefixed(path.string() + ": ");
  try {
    return std::shared_ptr<model::Backend>(
        CudaBackend::from_weights(*w.value(), cuda_options(o, w.value()->hparams().context_length)));
  } catch (const std::exception& e) {
    return BackendResult::failure(path.string() + ": CUDA backend: " + e.what());
  }
#else
  return BackendResult::failure("ferry was built without CUDA");
#endif
}

BackendResult open_synthetic_backend(const model::Glm5Hparams& hp, model::GgmlType type, uint64_t seed,
                                     const BackendOptions& o) {
#if FERRY_HAVE_CUDA
  auto kind = resolve_backend_kind(o.kind == "auto" ? "cuda" : o.kind);
  if (!kind) return kind.error();
  if (kind.value() != "cuda") return BackendResult::failure("synthetic weights need the CUDA backend");
  try {
    SyntheticModel m{hp, type, seed};
    return std::shared_ptr<model::Backend>(CudaBackend::synthetic(m, cuda_options(o, hp.context_length)));
  } catch (const std::exception& e) {
    return BackendResult::failure(std::string("synthetic weights on the CUDA backend: ") + e.what());
  }
#else
  (void)hp;
  (void)type;
  (void)seed;
  (void)o;
  return BackendResult::failure("synthetic weights need the CUDA backend, and ferry was built without CUDA");
#endif
}

}  // namespace ferry::gpu
