// Shared by the GPU tests (label gpu): device detection, the skip code of their main()
// (tests/gpu_test_main.cc: CTest reports a suite Skipped on a machine without a GPU, e.g. in
// CI), a per-test skip macro (e.g. for tests that need two GPUs) and a CUDA assertion.
#pragma once

#include <cuda_runtime_api.h>

#include "gtest/gtest.h"

namespace verifyd::test_util {

// Exit code of a GPU test binary that found no GPU (tests/gpu_test_main.cc); CTest's
// SKIP_RETURN_CODE for label gpu (tests/CMakeLists.txt).
inline constexpr int kSkipReturnCode = 77;

// CUDA devices visible to this process; 0 when the runtime reports none or fails (the
// error is cleared so it does not leak into the next CUDA call).
inline int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace verifyd::test_util

#define SKIP_WITHOUT_GPU()                          \
  if (::verifyd::test_util::CudaDeviceCount() == 0) \
  GTEST_SKIP() << "no CUDA device visible: GPU test skipped"

// ASSERT that a CUDA runtime call succeeded, naming the call and the error.
#define CUDA_ASSERT(expr)                                                  \
  do {                                                                     \
    const cudaError_t e_ = (expr);                                         \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_); \
  } while (0)
