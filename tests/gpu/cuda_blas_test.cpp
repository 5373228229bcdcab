// cuBLAS loaded at run time (gpu/cuda_blas.hpp): where it is installed every entry point resolves and
// the file is named; where it is not, the error names each file tried. Needs no device, only cuBLAS 12
// or 13 on the loader's path (run-gpu-tests.sh puts the GPU host's there).
#if FERRY_HAVE_CUDA
#include <gtest/gtest.h>

#include <string>

#include "gpu/cuda_blas.hpp"
#include "gpu/cuda_check.hpp"

namespace ferry::gpu::blas {
namespace {

TEST(CudaBlas, LoadsFromTheLoadersPathAndNamesTheFile) {
  const Api api = load("");
  EXPECT_NE(api.library.find("libcublas.so.1"), std::string::npos) << api.library;
  EXPECT_NE(api.create, nullptr);
  EXPECT_NE(api.destroy, nullptr);
  EXPECT_NE(api.set_stream, nullptr);
  EXPECT_NE(api.set_workspace, nullptr);
  EXPECT_NE(api.sgemm, nullptr);
  EXPECT_NE(api.gemm_ex, nullptr);
  EXPECT_STREQ(api.status_name(success), "CUBLAS_STATUS_SUCCESS");
}

TEST(CudaBlas, ADirectoryWithoutCublasFailsNamingEveryFileTried) {
  const std::string dir = "/nonexistent/ferry-cublas";
  try {
    load(dir);
    FAIL() << "loaded cuBLAS from " << dir;
  } catch (const CudaError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(dir + "/libcublas.so.12"), std::string::npos) << what;
    EXPECT_NE(what.find(dir + "/libcublas.so.13"), std::string::npos) << what;
    EXPECT_NE(what.find("FERRY_CUBLAS_PATH"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace ferry::gpu::blas
#endif
