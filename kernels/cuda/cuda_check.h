// Status from CUDA runtime calls: every call in kernels/cuda goes through these macros, so a
// failure comes back as an absl::Status naming the expression, file and line (launchers never
// exit or abort). Host-side only (includes the CUDA runtime API header).
// Thread-safety: stateless macros.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

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

}  // namespace verifyd::kernels::cuda

// Evaluates a cudaError_t expression; returns an absl::Status from the enclosing function on
// failure.
#define VERIFYD_CUDA_RETURN_IF_ERROR(expr)                                              \
  do {                                                                                  \
    const cudaError_t verifyd_cuda_err_ = (expr);                                       \
    if (verifyd_cuda_err_ != cudaSuccess)                                               \
      return ::verifyd::kernels::cuda::CudaErrorToStatus(verifyd_cuda_err_, #expr,      \
                                                         __FILE__, __LINE__);           \
  } while (0)

// After a <<<>>> launch: the launch error (configuration, resources), without a sync.
#define VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR(what) \
  VERIFYD_CUDA_RETURN_IF_ERROR((static_cast<void>(what), cudaGetLastError()))
