// Status from CUDA runtime and cuBLAS calls: every call in kernels/cuda and the CUDA engine goes
// through these macros, so a failure comes back as an absl::Status naming the expression, file
// and line (launchers never exit or abort). Part of the one status macro family described in
// kernels/status.h. Host-side only (includes the CUDA runtime and cuBLAS API headers).
// Thread-safety: stateless macros.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/status.h"  // VERIFYD_RETURN_IF_ERROR, VERIFYD_ASSIGN_OR_RETURN

namespace verifyd::kernels::cuda {

inline absl::Status CudaErrorToStatus(cudaError_t err, const char* expr, const char* file,
                                      int line) {
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string msg = absl::StrCat(expr, " failed: ", cudaGetErrorName(err), " (",
                                       cudaGetErrorString(err), ") at ", file, ":", line);
  switch (err) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
      return absl::InvalidArgumentError(msg);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return absl::FailedPreconditionError(msg);
    default:
      return absl::InternalError(msg);
  }
}

inline absl::Status CublasErrorToStatus(cublasStatus_t e, const char* expr, const char* file,
                                        int line) {
  if (e == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(expr, " failed: cublas status ", static_cast<int>(e), " at ", file, ":", line));
}

// Runs `configure` (a callable returning cudaError_t, e.g. a cudaFuncSetAttribute) once per
// device of this process; `done` (a function-local static of the caller) keeps one bit per
// device id. Launchers use it so that kernel set-up costs no host call on every launch.
template <typename Configure>
cudaError_t ConfigureOncePerDevice(std::atomic<uint64_t>& done, Configure&& configure) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  const uint64_t bit = 1ull << (dev & 63);
  if ((done.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  err = configure();
  if (err == cudaSuccess) done.fetch_or(bit, std::memory_order_acq_rel);
  return err;
}

}  // namespace verifyd::kernels::cuda

// The body of the two macros below: evaluates `expr` as a `type`; on any value but `success`
// returns to_status(value, text, __FILE__, __LINE__) (an absl::Status naming `text`, the
// expression as written) from the enclosing function.
#define VERIFYD_GPU_RETURN_IF_ERROR_IMPL_(type, success, to_status, expr, text)                  \
  do {                                                                                           \
    const type verifyd_gpu_result_ = (expr);                                                     \
    if (verifyd_gpu_result_ != success)                                                          \
      return ::verifyd::kernels::cuda::to_status(verifyd_gpu_result_, text, __FILE__, __LINE__); \
  } while (0)

// Evaluates a cudaError_t expression; returns an absl::Status from the enclosing function on
// failure.
#define VERIFYD_CUDA_RETURN_IF_ERROR(expr) \
  VERIFYD_GPU_RETURN_IF_ERROR_IMPL_(cudaError_t, cudaSuccess, CudaErrorToStatus, expr, #expr)

// After a <<<>>> launch of `kernel` (named in the message): the launch error (configuration,
// resources), without a sync.
#define VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR(kernel) \
  VERIFYD_CUDA_RETURN_IF_ERROR((static_cast<void>(kernel), cudaGetLastError()))

// Evaluates a cublasStatus_t expression; returns an absl::Status on failure.
#define VERIFYD_CUBLAS_RETURN_IF_ERROR(expr)                                                    \
  VERIFYD_GPU_RETURN_IF_ERROR_IMPL_(cublasStatus_t, CUBLAS_STATUS_SUCCESS, CublasErrorToStatus, \
                                    expr, #expr)
