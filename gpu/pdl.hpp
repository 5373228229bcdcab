#pragma once
// Programmatic Dependent Launch (sm90+) inside the decode graphs (issue 15). A kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may start before the kernel ahead of it in the
// stream ends: once every block of that kernel has run griddepcontrol.launch_dependents (or exited).
// Its blocks are then resident and can request what no earlier kernel writes (a matvec's fixed
// weights) while the previous kernel finishes; griddepcontrol.wait (gpu/pdl.cuh) then blocks until
// that kernel has completed and its writes are visible. So only kernels that run the wait before
// they touch anything an earlier kernel writes may be launched this way.
//
// Launches ask for it only inside a PdlScope (DecodeGraphs' capture, when CudaStageOptions::pdl
// holds and FERRY_PDL is not 0), and only for a kernel whose code on this device has the
// instructions: a compute_70 build JIT-compiled on an sm90 device compiles them out (gpu/pdl.cuh), so
// it keeps plain stream order. Stream capture turns the attribute into programmatic graph edges
// (CUDA 12.3+).
#include <cuda_runtime_api.h>

#include <cstddef>

namespace ferry::gpu {

// While alive, launches on this thread may use PDL (if `on`); nests.
class PdlScope {
 public:
  explicit PdlScope(bool on);
  ~PdlScope();
  PdlScope(const PdlScope&) = delete;
  PdlScope& operator=(const PdlScope&) = delete;

 private:
  bool before_;
};

// False when the environment sets FERRY_PDL=0 (the switch for measuring both ways).
bool pdl_env_allows();
// Whether this device runs code of this build with the PDL instructions (sm90+ and compute_90+ code).
bool pdl_device_ready();
// Whether `kernel`'s code on the current device was compiled for compute capability `major`.0 or
// later (and the device is one), cached per kernel, device and major: a compute_70 build
// JIT-compiled on a newer device is not. Call it outside a capture first.
bool code_built_for(const void* kernel, int major);
// Whether this build's code on the current device has sm80+ instructions (the int8 tensor-core
// products, gpu/mma_int8.cuh): what the tests of those kernels may skip on, and nothing else.
bool sm80_code_ready();
// Whether `kernel`'s code on the current device is sm90+ code (PDL's instructions, clusters: a
// compute_70 build JIT-compiled on an sm90 device is not), cached per kernel and device. Call it
// outside a capture first (the eager step before a graph is captured does).
bool sm90_code_built(const void* kernel);
// Adds the PDL attribute to cfg (pointing it at `attr`) when a PdlScope is on and `kernel` is built
// for it; otherwise leaves cfg a plain launch.
void pdl_configure(cudaLaunchConfig_t& cfg, cudaLaunchAttribute& attr, const void* kernel);

// The number of programmatic (PDL) dependency edges of a captured graph.
size_t programmatic_edges(cudaGraph_t graph);

}  // namespace ferry::gpu
