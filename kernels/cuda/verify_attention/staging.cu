// LaunchStageFp8Rows (see staging.cuh).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/verify_attention/mma_traits.h"
#include "kernels/cuda/verify_attention/staging.cuh"

namespace verifyd::kernels::cuda::detail {
namespace {

constexpr int kWarps = 8;        // per block
constexpr int kRowsPerWarp = 4;  // loads of all of them in flight before the stores
static_assert(kVDim == 512 && kFp8ScaleOffset == 512 && kFp8RopeOffset == 528,
              "one warp covers a row: 16 codes a lane, rope in lanes 0-7");

// Lane l of a warp: codes 16 l .. 16 l + 15 of the row (scale group l / 8) -> bf16 columns
// 16 l .. 16 l + 15; lanes 0-7 also copy rope bytes 16 l .. 16 l + 15 (columns 512 + 8 l ..).
__global__ void __launch_bounds__(kWarps * 32) StageFp8RowsKernel(StageFp8Args a) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int64_t j0 = warp * kRowsPerWarp;
  uint4 codes[kRowsPerWarp], rope[kRowsPerWarp];
  float scale[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t j = j0 + r;
    codes[r] = make_uint4(0, 0, 0, 0);
    rope[r] = codes[r];
    scale[r] = 0.f;
    if (j < a.num_keys) {
      const uint8_t* row = a.kv + static_cast<int64_t>(a.kv_indices[j]) * kFp8RowBytes;
      codes[r] = *reinterpret_cast<const uint4*>(row + 16 * lane);
      scale[r] = *reinterpret_cast<const float*>(row + kFp8ScaleOffset + 4 * (lane / 8));
      if (lane < 8) rope[r] = *reinterpret_cast<const uint4*>(row + kFp8RopeOffset + 16 * lane);
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t j = j0 + r;
    if (j >= a.num_keys) break;
    const uint32_t w[4] = {codes[r].x, codes[r].y, codes[r].z, codes[r].w};
    uint32_t out[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      // Two codes -> f16x2 (exact) -> fp32 -> x scale -> bf16x2 (one rounding).
      const __nv_fp8x2_storage_t pair =
          static_cast<__nv_fp8x2_storage_t>((w[k / 2] >> (16 * (k % 2))) & 0xffffu);
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
      const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * scale[r], f.y * scale[r]);
      out[k] = *reinterpret_cast<const uint32_t*>(&b);
    }
    uint16_t* dst = a.rows + j * kQkDim;
    reinterpret_cast<uint4*>(dst + 16 * lane)[0] = make_uint4(out[0], out[1], out[2], out[3]);
    reinterpret_cast<uint4*>(dst + 16 * lane)[1] = make_uint4(out[4], out[5], out[6], out[7]);
    if (lane < 8) *reinterpret_cast<uint4*>(dst + kVDim + 8 * lane) = rope[r];
    if (lane == 0) a.identity[j] = static_cast<int32_t>(j);
  }
}

}  // namespace

absl::Status LaunchStageFp8Rows(const StageFp8Args& args, void* stream) {
  if (args.num_keys == 0) return absl::OkStatus();
  constexpr int64_t kRowsPerBlock = int64_t{kWarps} * kRowsPerWarp;
  const int64_t blocks = (args.num_keys + kRowsPerBlock - 1) / kRowsPerBlock;
  StageFp8RowsKernel<<<static_cast<unsigned>(blocks), kWarps * 32, 0,
                       static_cast<cudaStream_t>(stream)>>>(args);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("StageFp8RowsKernel");
  return absl::OkStatus();
}

}  // namespace verifyd::kernels::cuda::detail
