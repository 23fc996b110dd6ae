// On-device preset weight generation (see weight_gen.h), bit-identical to kernels/weight_init.h.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dense/weight_gen.h"
#include "kernels/weight_init.h"

namespace verifyd::kernels::cuda {
namespace {

// e4m3(u * 448) of element `flat` (round to nearest even, saturating at +-448).
__device__ __forceinline__ uint8_t Fp8Code(uint64_t key, uint64_t flat) {
  return static_cast<uint8_t>(
      __nv_cvt_float_to_fp8(WeightFp8Input(key, flat), __NV_SATFINITE, __NV_E4M3));
}

__global__ void GenerateKernel(uint64_t key, float scale, float offset, float fp8_scale,
                               int64_t rows, int64_t cols, int64_t full_cols, int64_t row0,
                               int64_t col0, __nv_bfloat16* __restrict__ out, int64_t ld) {
  const int64_t n = rows * cols;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = idx / cols, c = idx % cols;
    const uint64_t flat = static_cast<uint64_t>((row0 + r) * full_cols + col0 + c);
    float v;
    if (fp8_scale > 0.f) {
      __nv_fp8_e4m3 q;
      q.__x = Fp8Code(key, flat);
      v = __fmul_rn(static_cast<float>(q), fp8_scale);
    } else {
      // The host generator's own expression (two roundings, never a fused multiply-add).
      v = WeightValueFloat(key, flat, scale, offset);
    }
    out[r * ld + c] = __float2bfloat16_rn(v);
  }
}

__global__ void GenerateFp8Kernel(uint64_t key, int64_t rows, int64_t cols, int64_t full_cols,
                                  int64_t row0, int64_t col0, uint8_t* __restrict__ out,
                                  int64_t ld) {
  const int64_t n = rows * cols;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = idx / cols, c = idx % cols;
    out[r * ld + c] = Fp8Code(key, static_cast<uint64_t>((row0 + r) * full_cols + col0 + c));
  }
}

__global__ void FillScalesKernel(float v, int64_t rows, int64_t cols, float* __restrict__ out,
                                 int64_t ld) {
  const int64_t n = rows * cols;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n;
       idx += (int64_t)gridDim.x * blockDim.x) {
    out[idx / cols * ld + idx % cols] = v;
  }
}

}  // namespace

absl::Status GenerateWeightsCuda(const GenerateWeightsParams& p) {
  if (p.rows < 0 || p.cols < 0) return absl::InvalidArgumentError("rows/cols < 0");
  if (p.rows == 0 || p.cols == 0) return absl::OkStatus();
  if (!p.out) return absl::InvalidArgumentError("out must be set");
  if (p.ld_out < p.cols) return absl::InvalidArgumentError("ld_out < cols");
  if (p.col0 < 0 || p.row0 < 0 || p.col0 + p.cols > p.full_cols) {
    return absl::InvalidArgumentError("shard [row0, col0, cols] outside the full tensor");
  }
  if (!(p.fp8_scale >= 0.f)) return absl::InvalidArgumentError("fp8_scale must be >= 0");
  GenerateKernel<<<internal::GridFor(p.rows * p.cols, 256), 256, 0,
                   static_cast<cudaStream_t>(p.stream)>>>(
      p.tensor_key, p.scale, p.offset, p.fp8_scale, p.rows, p.cols, p.full_cols, p.row0, p.col0,
      reinterpret_cast<__nv_bfloat16*>(p.out), p.ld_out);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("GenerateKernel");
  return absl::OkStatus();
}

absl::Status GenerateFp8WeightsCuda(const GenerateFp8WeightsParams& p) {
  if (p.rows < 0 || p.cols < 0) return absl::InvalidArgumentError("rows/cols < 0");
  if (p.rows == 0 || p.cols == 0) return absl::OkStatus();
  if (!p.out || !p.scales) return absl::InvalidArgumentError("out and scales must be set");
  if (p.ld_out < p.cols) return absl::InvalidArgumentError("ld_out < cols");
  if (p.row0 % 128 != 0 || p.col0 % 128 != 0 || p.cols % 128 != 0) {
    return absl::InvalidArgumentError("row0, col0 and cols must be multiples of 128");
  }
  if (p.scale_ld < p.cols / 128) return absl::InvalidArgumentError("scale_ld < cols / 128");
  if (p.col0 < 0 || p.row0 < 0 || p.col0 + p.cols > p.full_cols) {
    return absl::InvalidArgumentError("shard [row0, col0, cols] outside the full tensor");
  }
  if (!(p.fp8_scale > 0.f && p.fp8_scale < 3.0e38f)) {
    return absl::InvalidArgumentError("fp8_scale must be finite and > 0");
  }
  const cudaStream_t s = static_cast<cudaStream_t>(p.stream);
  GenerateFp8Kernel<<<internal::GridFor(p.rows * p.cols, 256), 256, 0, s>>>(
      p.tensor_key, p.rows, p.cols, p.full_cols, p.row0, p.col0, p.out, p.ld_out);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("GenerateFp8Kernel");
  const int64_t brows = (p.rows + 127) / 128, bcols = p.cols / 128;
  FillScalesKernel<<<internal::GridFor(brows * bcols, 256), 256, 0, s>>>(p.fp8_scale, brows, bcols,
                                                                         p.scales, p.scale_ld);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("FillScalesKernel");
  return absl::OkStatus();
}

}  // namespace verifyd::kernels::cuda
