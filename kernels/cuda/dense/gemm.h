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
// through cuBLASLt. Per shape class (transposes, n, k, leading dimensions, strides, batch,
// dtypes) a *reference* algorithm — the heuristic's choice at 64 rows with split-K off, checked
// to run at every row count — fixes the arithmetic: the same algorithm for every m gives a row
// the same bits whatever m is (bench/gemm_invariance; cublasGemmEx picks another algorithm
// from 9-128 rows on, docs/PERF.md). Speed comes back by *row classes* (m up to 16, 32, 64,
// ..., 4096, beyond): at the shape's first call, the heuristic's split-K-free choices for each
// class are timed at the class's smallest and largest row counts (random rows, the real
// weights) and the fastest whose every output bit equals the reference's on this device serves
// the class
// (algorithms that differ only in tile shape, swizzle or stages accumulate each output in the
// same order: on an H200 every candidate tried was bit-equal, docs/PERF.md); a class without
// one keeps the reference. So a row's result is the reference's, hence independent of m, by a
// check made on the device the engine runs on. Split-K and stream-K algorithms (cuBLAS's
// choice for 65-1,024 rows of the wide projections) are never candidates: their sums depend
// on the split.
// Host header (no CUDA code). Thread-safety: one thread per handle.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

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
// GEMMs may use, max_rows: the largest m they get; row_classes false: the reference algorithm
// at every m). Disable before destroying the handle. A shape's first call chooses its
// algorithms (device syncs and a little scratch memory, once per shape and handle).
absl::Status EnableFixedGemmAlgorithms(void* cublas_handle, void* workspace, size_t bytes,
                                       int64_t max_rows, bool row_classes = true);
void DisableFixedGemmAlgorithms(void* cublas_handle);
// What the row-class selection chose, one entry per (shape, row class), in call order.
struct GemmRowClassChoice {
  int64_t n = 0, k = 0, batch = 1;
  int64_t max_m = 0;          // the class's largest row count (-1: unbounded)
  int64_t rows_tested = 0;    // rows of the equality check and the timing
  int tested_candidates = 0;  // heuristic choices run beside the reference
  int equal_candidates = 0;   // candidates found bit-identical (0 or 1: checked fastest first)
  int candidate = 0;          // the one chosen (1-based; 0: the reference)
  double ms_reference = 0, ms_chosen = 0;  // at the class's smallest + largest row count
};
std::vector<GemmRowClassChoice> FixedGemmChoices(void* cublas_handle);
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
