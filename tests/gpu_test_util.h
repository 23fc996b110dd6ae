// Shared by the GPU tests (label gpu): device detection, the skip code of their main()
// (tests/gpu_test_main.cc: CTest reports a suite Skipped on a machine without a GPU, e.g. in
// CI), a per-test skip macro (e.g. for tests that need two GPUs), a CUDA assertion and an
// owning device array.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <vector>

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

// An owning device array of n T, filled from and read back to host vectors. It allocates one
// element at least (an empty array still has an address); a failed allocation leaves p null,
// which the first copy to or from it reports.
template <typename T>
struct DeviceArray {
  T* p = nullptr;
  size_t n = 0;

  explicit DeviceArray(size_t count) : n(count) {
    if (cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(n, 1) * sizeof(T)) !=
        cudaSuccess) {
      p = nullptr;
    }
  }
  explicit DeviceArray(const std::vector<T>& h) : DeviceArray(h.size()) { Put(h); }
  // `count` elements, each `fill` (a poison value, so that a missed write shows).
  DeviceArray(size_t count, T fill) : DeviceArray(std::vector<T>(count, fill)) {}
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(p); }

  // The first h.size() elements from h.
  cudaError_t Put(const std::vector<T>& h) {
    return cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  // The first h->size() elements into *h.
  cudaError_t Read(std::vector<T>* h) const {
    return cudaMemcpy(h->data(), p, h->size() * sizeof(T), cudaMemcpyDeviceToHost);
  }
  // Every byte 0xff (NaN for floating-point T, -1 for signed integers).
  cudaError_t Poison() { return cudaMemset(p, 0xff, std::max<size_t>(n, 1) * sizeof(T)); }
  // All n elements, once the device has finished its work (errors show as wrong values).
  std::vector<T> Get() const {
    std::vector<T> h(n);
    cudaDeviceSynchronize();
    Read(&h);
    return h;
  }
};

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
