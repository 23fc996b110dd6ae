// Internal to kernels/cuda/{dense,moe}: device helpers shared by their kernels (bf16 loads and
// stores, a block-wide fp32 sum). Not a public header. Thread-safety: device code.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace verifyd::kernels::cuda::internal {

__device__ __forceinline__ float LoadF(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float LoadF(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ void StoreF(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void StoreF(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

// Sum of v over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the sum.
// scratch: 32 floats of shared memory.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warps = blockDim.x / 32;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float s = lane < warps ? scratch[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

inline unsigned GridFor(int64_t n, int threads, int64_t max_blocks = 65535LL * 16) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > max_blocks) b = max_blocks;
  return static_cast<unsigned>(b);
}

}  // namespace verifyd::kernels::cuda::internal
