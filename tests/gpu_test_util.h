// Shared by the GPU tests (label gpu): device detection, the skip macro they start with (so
// the suites report SKIPPED on a machine without a GPU, e.g. in CI) and a CUDA assertion.
#pragma once

#include <cuda_runtime_api.h>

#include "gtest/gtest.h"

namespace verifyd::test_util {

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

#define SKIP_WITHOUT_GPU()                              \
  if (::verifyd::test_util::CudaDeviceCount() == 0)     \
  GTEST_SKIP() << "no CUDA device visible: GPU test skipped"

// ASSERT that a CUDA runtime call succeeded, naming the call and the error.
#define CUDA_ASSERT(expr)                                                  \
  do {                                                                     \
    const cudaError_t e_ = (expr);                                         \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_); \
  } while (0)
