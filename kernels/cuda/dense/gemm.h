// bf16 GEMMs with fp32 accumulation through cuBLAS, in the Hugging Face Linear layout.
//
//   GemmBf16:        y[m, n] = alpha * x[m, k] . w[n, k]^T + beta * y   (y fp32 or bf16)
//   GemmBf16Batched: the same for `batch` independent problems at fixed element strides
//                    (the per-head absorbed-MLA products), with either w layout.
//   GemmF32:         y[m, n] = x[m, k] . w[n, k]^T, all fp32, pedantic fp32 math (no TF32):
//                    the MoE router, which transformers computes in float32.
// The caller owns the cuBLAS handle (one per rank thread, bound to the rank's stream and
// given a fixed workspace, so launches are graph-capture safe).
//
// Batch-invariant mode (EnableFixedGemmAlgorithms on a handle): every GEMM on that handle runs
// through cuBLASLt with one algorithm per shape class (transposes, n, k, leading dimensions,
// strides, batch, dtypes), the heuristic's choice at 64 rows with split-K off, checked to run
// at 1 and max_rows rows, and used for every row count: a row's result then does not depend on
// how many rows the call has (cublasGemmEx picks another algorithm from 9-128 rows on:
// bench/gemm_invariance, docs/PERF.md).
// Host header (no CUDA code). Thread-safety: one thread per handle.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/common.h"

namespace verifyd::kernels::cuda {

struct GemmParams {
  int64_t m = 0, n = 0, k = 0;
  const bf16_bits* x = nullptr;  // [m, ldx] bf16 (row-major activations)
  int64_t ldx = 0;
  const bf16_bits* w = nullptr;  // [n, ldw] bf16 (row-major weight, out x in)
  int64_t ldw = 0;
  void* y = nullptr;  // [m, ldy] y_dtype
  int64_t ldy = 0;
  DType y_dtype = DType::kFloat32;
  float alpha = 1.f;
  float beta = 0.f;  // 1 accumulates into y (fp32 residual)
};
// handle: cublasHandle_t (its stream is where the GEMM runs).
absl::Status GemmBf16(void* cublas_handle, const GemmParams& p);

// Turns the batch-invariant mode on for a handle (workspace: device memory the handle's
// GEMMs may use, max_rows: the largest m they get). Disable before destroying the handle.
absl::Status EnableFixedGemmAlgorithms(void* cublas_handle, void* workspace, size_t bytes,
                                       int64_t max_rows);
void DisableFixedGemmAlgorithms(void* cublas_handle);
// GemmBf16 on packed operands (ldx = ldw = k, ldy = n).
absl::Status GemmBf16Packed(void* cublas_handle, int64_t m, const bf16_bits* x, int64_t k,
                            const bf16_bits* w, int64_t n, void* y, DType y_dtype = DType::kFloat32,
                            float beta = 0.f);

// batch problems b = 0..batch-1:
//   w_transposed = true : y_b[m, n] = x_b[m, k] . w_b[n, k]^T   (w_b row-major [n, ldw])
//   w_transposed = false: y_b[m, n] = x_b[m, k] . w_b[k, n]     (w_b row-major [k, ldw])
// x_b = x + b * stride_x, etc. (elements). y bf16.
struct BatchedGemmParams {
  int batch = 0;
  int64_t m = 0, n = 0, k = 0;
  const bf16_bits* x = nullptr;
  int64_t ldx = 0, stride_x = 0;
  const bf16_bits* w = nullptr;
  int64_t ldw = 0, stride_w = 0;
  bool w_transposed = true;
  bf16_bits* y = nullptr;
  int64_t ldy = 0, stride_y = 0;
};
absl::Status GemmBf16Batched(void* cublas_handle, const BatchedGemmParams& p);

struct GemmF32Params {
  int64_t m = 0, n = 0, k = 0;
  const float* x = nullptr;  // [m, ldx] fp32
  int64_t ldx = 0;
  const float* w = nullptr;  // [n, ldw] fp32 (row-major weight, out x in)
  int64_t ldw = 0;
  float* y = nullptr;  // [m, ldy] fp32
  int64_t ldy = 0;
};
absl::Status GemmF32(void* cublas_handle, const GemmF32Params& p);

}  // namespace verifyd::kernels::cuda
