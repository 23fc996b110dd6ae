// On-device preset weight generation (see weight_gen.h), bit-identical to kernels/weight_init.h.
#include <cuda_bf16.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dense/common.cuh"
#include "kernels/cuda/dense/weight_gen.h"
#include "kernels/weight_init.h"

namespace verifyd::kernels::cuda {
namespace {

__global__ void GenerateKernel(uint64_t key, float scale, float offset, int64_t rows, int64_t cols,
                               int64_t full_cols, int64_t row0, int64_t col0,
                               __nv_bfloat16* __restrict__ out, int64_t ld) {
  const int64_t n = rows * cols;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = idx / cols, c = idx % cols;
    const uint64_t flat = static_cast<uint64_t>((row0 + r) * full_cols + col0 + c);
    // The host generator's own expression (two roundings, never a fused multiply-add).
    const float v = WeightValueFloat(key, flat, scale, offset);
    out[r * ld + c] = __float2bfloat16_rn(v);
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
  GenerateKernel<<<internal::GridFor(p.rows * p.cols, 256), 256, 0,
                   static_cast<cudaStream_t>(p.stream)>>>(
      p.tensor_key, p.scale, p.offset, p.rows, p.cols, p.full_cols, p.row0, p.col0,
      reinterpret_cast<__nv_bfloat16*>(p.out), p.ld_out);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("GenerateKernel");
  return absl::OkStatus();
}

}  // namespace verifyd::kernels::cuda
