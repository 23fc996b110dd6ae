// CUDA and cuBLAS return codes as absl::Status, for the dense ops, the GEMM wrapper and the
// CUDA engine. Host-only (includes the CUDA runtime API header, no device code).
//
//   VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(...));   // from kernels/cuda/cuda_check.h
//   VERIFYD_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(...));
//   VERIFYD_RETURN_IF_LAUNCH_FAILED();                    // after a <<<>>> launch
//
// Each status names the expression, file and line. Thread-safety: pure functions.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"  // CudaErrorToStatus, VERIFYD_CUDA_RETURN_IF_ERROR

namespace verifyd::kernels::cuda {

inline absl::Status CublasErrorToStatus(cublasStatus_t e, const char* expr, const char* file,
                                        int line) {
  if (e == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(expr, " failed: cublas status ", static_cast<int>(e),
                                          " at ", file, ":", line));
}

}  // namespace verifyd::kernels::cuda

#define VERIFYD_CUBLAS_RETURN_IF_ERROR(expr)                                                 \
  do {                                                                                       \
    const absl::Status _verifyd_st =                                                         \
        ::verifyd::kernels::cuda::CublasErrorToStatus((expr), #expr, __FILE__, __LINE__);    \
    if (!_verifyd_st.ok()) return _verifyd_st;                                               \
  } while (0)

// cudaPeekAtLastError after a launch: a bad configuration fails here, not at the next sync.
#define VERIFYD_RETURN_IF_LAUNCH_FAILED() VERIFYD_CUDA_RETURN_IF_ERROR(cudaPeekAtLastError())

#define VERIFYD_RETURN_IF_ERROR_STATUS(expr)     \
  do {                                           \
    const absl::Status _verifyd_st2 = (expr);    \
    if (!_verifyd_st2.ok()) return _verifyd_st2; \
  } while (0)
