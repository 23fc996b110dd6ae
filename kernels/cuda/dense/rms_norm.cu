// RMSNorm kernel and launcher (see rms_norm.h).
#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dense/rms_norm.h"

namespace verifyd::kernels::cuda {
namespace {

using internal::BlockSum;
using internal::LoadF;
using internal::StoreF;

constexpr int kThreads = 256;

// One CTA per row: fp32 sum of squares, then y = (x * inv_rms) * w (two roundings, no FMA,
// as the reference's float expression).
template <typename TIn, typename TOut>
__global__ void RmsNormKernel(const TIn* __restrict__ x, int64_t ldx,
                              const __nv_bfloat16* __restrict__ w, int64_t cols, float eps, TOut* y,
                              int64_t ldy) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const TIn* xr = x + row * ldx;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float v = LoadF(xr, j);
    ss = __fmaf_rn(v, v, ss);
  }
  ss = BlockSum(ss, scratch);
  const float inv_rms = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)cols), eps)));
  TOut* yr = y + row * ldy;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    StoreF(yr, j, __fmul_rn(__fmul_rn(LoadF(xr, j), inv_rms), __bfloat162float(w[j])));
  }
}

template <typename TIn, typename TOut>
absl::Status Launch(const RmsNormParams& p) {
  RmsNormKernel<TIn, TOut>
      <<<static_cast<unsigned>(p.rows), kThreads, 0, static_cast<cudaStream_t>(p.stream)>>>(
          static_cast<const TIn*>(p.x), p.ldx, reinterpret_cast<const __nv_bfloat16*>(p.weight),
          p.cols, p.eps, static_cast<TOut*>(p.y), p.ldy);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("RmsNormKernel");
  return absl::OkStatus();
}

}  // namespace

absl::Status RmsNormCuda(const RmsNormParams& p) {
  if (p.rows < 0 || p.rows > 0x7fffffff) return absl::InvalidArgumentError("rows out of range");
  if (p.cols <= 0)
    return absl::InvalidArgumentError(absl::StrCat("cols must be > 0, got ", p.cols));
  if (p.ldx < p.cols) return absl::InvalidArgumentError("ldx < cols");
  if (p.ldy < p.cols) return absl::InvalidArgumentError("ldy < cols");
  if (p.rows == 0) return absl::OkStatus();
  if (!p.x || !p.y || !p.weight) return absl::InvalidArgumentError("x, y and weight must be set");
  const bool xf = p.x_dtype == DType::kFloat32, yf = p.y_dtype == DType::kFloat32;
  if (xf && yf) return Launch<float, float>(p);
  if (xf && !yf) return Launch<float, __nv_bfloat16>(p);
  if (!xf && yf) return Launch<__nv_bfloat16, float>(p);
  return Launch<__nv_bfloat16, __nv_bfloat16>(p);
}

}  // namespace verifyd::kernels::cuda
