// RMSNorm on the GPU: y = (x * rsqrt(mean(x^2) + eps)) * weight, fp32 math, as the reference
// kernels::ref::RmsNorm (Hugging Face DeepseekV3RMSNorm). Input fp32 or bf16, output fp32 or
// bf16, weight bf16. One CTA per row; the sum of squares is a tree reduction in fp32 (the
// reference sums in index order, so results agree to fp32 rounding, not bit for bit).
// Host header (no CUDA code). Thread-safety: the launcher is reentrant.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/common.h"

namespace verifyd::kernels::cuda {

struct RmsNormParams {
  int64_t rows = 0;         // m
  int64_t cols = 0;         // n (normalised width)
  const void* x = nullptr;  // [rows, ldx] x_dtype, device
  DType x_dtype = DType::kFloat32;
  int64_t ldx = 0;                    // row stride of x, elements (>= cols)
  const bf16_bits* weight = nullptr;  // [cols] bf16, device
  float eps = 1e-6f;
  void* y = nullptr;                 // [rows, ldy] y_dtype, device (may alias x when
  DType y_dtype = DType::kBFloat16;  //  the dtypes and strides match)
  int64_t ldy = 0;                   // row stride of y, elements (>= cols)
  void* stream = nullptr;            // cudaStream_t
};

absl::Status RmsNormCuda(const RmsNormParams& p);

}  // namespace verifyd::kernels::cuda
