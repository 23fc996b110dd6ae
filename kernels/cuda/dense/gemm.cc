// cuBLAS bf16 GEMM wrapper (see gemm.h). Row-major y = x . w^T is the column-major product
// y^T (n x m) = op(w) (n x k) . x^T (k x m), so w is operand A and x operand B.
#include "kernels/cuda/dense/gemm.h"

#include <cublas_v2.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"

namespace verifyd::kernels::cuda {

absl::Status GemmBf16(void* cublas_handle, const GemmParams& p) {
  if (!cublas_handle) return absl::InvalidArgumentError("cublas handle must be set");
  if (p.m < 0 || p.n <= 0 || p.k <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad gemm shape m=", p.m, " n=", p.n, " k=", p.k));
  }
  if (p.m == 0) return absl::OkStatus();
  if (!p.x || !p.w || !p.y) return absl::InvalidArgumentError("x, w, y must be set");
  if (p.ldx < p.k || p.ldw < p.k || p.ldy < p.n) {
    return absl::InvalidArgumentError(absl::StrCat("bad leading dims ldx=", p.ldx, " ldw=", p.ldw,
                                                   " ldy=", p.ldy, " for n=", p.n, " k=", p.k));
  }
  const cudaDataType_t yt = p.y_dtype == DType::kFloat32 ? CUDA_R_32F : CUDA_R_16BF;
  VERIFYD_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(
      static_cast<cublasHandle_t>(cublas_handle), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.n),
      static_cast<int>(p.m), static_cast<int>(p.k), &p.alpha, p.w, CUDA_R_16BF,
      static_cast<int>(p.ldw), p.x, CUDA_R_16BF, static_cast<int>(p.ldx), &p.beta, p.y, yt,
      static_cast<int>(p.ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

absl::Status GemmBf16Batched(void* cublas_handle, const BatchedGemmParams& p) {
  if (!cublas_handle) return absl::InvalidArgumentError("cublas handle must be set");
  if (p.batch < 0 || p.m < 0 || p.n <= 0 || p.k <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad batched gemm shape batch=", p.batch, " m=", p.m, " n=", p.n, " k=", p.k));
  }
  if (p.batch == 0 || p.m == 0) return absl::OkStatus();
  if (!p.x || !p.w || !p.y) return absl::InvalidArgumentError("x, w, y must be set");
  if (p.ldx < p.k || p.ldy < p.n || p.ldw < (p.w_transposed ? p.k : p.n)) {
    return absl::InvalidArgumentError("bad leading dims in batched gemm");
  }
  const float alpha = 1.f, beta = 0.f;
  // w_transposed: w_b row-major [n, k] = column-major k x n -> op T gives n x k.
  // otherwise:    w_b row-major [k, n] = column-major n x k -> op N.
  VERIFYD_CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
      static_cast<cublasHandle_t>(cublas_handle), p.w_transposed ? CUBLAS_OP_T : CUBLAS_OP_N,
      CUBLAS_OP_N, static_cast<int>(p.n), static_cast<int>(p.m), static_cast<int>(p.k), &alpha, p.w,
      CUDA_R_16BF, static_cast<int>(p.ldw), p.stride_w, p.x, CUDA_R_16BF, static_cast<int>(p.ldx),
      p.stride_x, &beta, p.y, CUDA_R_16BF, static_cast<int>(p.ldy), p.stride_y, p.batch,
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

absl::Status GemmBf16Packed(void* cublas_handle, int64_t m, const bf16_bits* x, int64_t k,
                            const bf16_bits* w, int64_t n, void* y, DType y_dtype, float beta) {
  GemmParams p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.x = x;
  p.ldx = k;
  p.w = w;
  p.ldw = k;
  p.y = y;
  p.ldy = n;
  p.y_dtype = y_dtype;
  p.beta = beta;
  return GemmBf16(cublas_handle, p);
}

absl::Status GemmF32(void* cublas_handle, const GemmF32Params& p) {
  if (!cublas_handle) return absl::InvalidArgumentError("cublas handle must be set");
  if (p.m < 0 || p.n <= 0 || p.k <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad fp32 gemm shape m=", p.m, " n=", p.n, " k=", p.k));
  }
  if (p.m == 0) return absl::OkStatus();
  if (!p.x || !p.w || !p.y) return absl::InvalidArgumentError("x, w, y must be set");
  if (p.ldx < p.k || p.ldw < p.k || p.ldy < p.n) {
    return absl::InvalidArgumentError("bad leading dims in fp32 gemm");
  }
  const float alpha = 1.f, beta = 0.f;
  VERIFYD_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(
      static_cast<cublasHandle_t>(cublas_handle), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.n),
      static_cast<int>(p.m), static_cast<int>(p.k), &alpha, p.w, CUDA_R_32F,
      static_cast<int>(p.ldw), p.x, CUDA_R_32F, static_cast<int>(p.ldx), &beta, p.y, CUDA_R_32F,
      static_cast<int>(p.ldy), CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

}  // namespace verifyd::kernels::cuda
