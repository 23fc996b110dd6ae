// The status macro family of verifyd (one family, used by kernels/, tp/ and server/):
//
//   VERIFYD_RETURN_IF_ERROR(expr)            // absl::Status expression       (this header)
//   VERIFYD_ASSIGN_OR_RETURN(lhs, expr)      // absl::StatusOr<T> expression  (this header)
//   VERIFYD_CUDA_RETURN_IF_ERROR(expr)       // cudaError_t        (kernels/cuda/cuda_check.h)
//   VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR(k)   // after a <<<>>> launch of kernel k   (same)
//   VERIFYD_CUBLAS_RETURN_IF_ERROR(expr)     // cublasStatus_t                      (same)
//
// Each returns an absl::Status from the enclosing function on failure; the CUDA ones name the
// expression, file and line. Plain C++ (no CUDA). Thread-safety: stateless macros.
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Evaluates an absl::Status expression; returns it from the enclosing function if not OK.
#define VERIFYD_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    const ::absl::Status verifyd_status_ = (expr);     \
    if (!verifyd_status_.ok()) return verifyd_status_; \
  } while (0)

#define VERIFYD_STATUS_CONCAT_INNER_(a, b) a##b
#define VERIFYD_STATUS_CONCAT_(a, b) VERIFYD_STATUS_CONCAT_INNER_(a, b)

// Evaluates an absl::StatusOr<T> expression; on error returns its status, else moves the
// value into `lhs` (a declaration such as `auto x` or an existing variable).
#define VERIFYD_ASSIGN_OR_RETURN(lhs, expr) \
  VERIFYD_ASSIGN_OR_RETURN_IMPL_(VERIFYD_STATUS_CONCAT_(verifyd_statusor_, __LINE__), lhs, expr)
#define VERIFYD_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return tmp.status();                  \
  lhs = std::move(tmp).value()
