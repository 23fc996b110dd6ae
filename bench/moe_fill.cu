// Device fills for moe_layer_bench: finite pseudo-random e4m3 bytes, bf16 and fp32 values
// (a counter hash per element; no host copies of the multi-GB expert weights).
#include <cuda_bf16.h>

#include <cstdint>

#include "bench/moe_fill.h"

namespace verifyd::bench {
namespace {

__device__ uint32_t Hash(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return static_cast<uint32_t>(x ^ (x >> 31));
}

// Codes with exponent field 3..8 (|v| in [2^-4, 4)): finite, no NaN code.
__global__ void FillFp8Kernel(uint8_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const uint32_t h = Hash(seed * 0x100000001b3ull + i);
    const uint32_t exp = 3 + (h >> 8) % 6, mant = h & 7, sign = (h >> 4) & 1;
    p[i] = static_cast<uint8_t>(sign << 7 | exp << 3 | mant);
  }
}

__global__ void FillFloatKernel(float* p, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const float u = Hash(seed * 0x100000001b3ull + i) * (1.0f / 4294967296.0f);
    p[i] = lo + (hi - lo) * u;
  }
}

__global__ void FillBf16Kernel(__nv_bfloat16* p, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const float u = Hash(seed * 0x100000001b3ull + i) * (1.0f / 4294967296.0f);
    p[i] = __float2bfloat16_rn(lo + (hi - lo) * u);
  }
}

}  // namespace

cudaError_t FillFp8(uint8_t* p, int64_t n, uint64_t seed) {
  FillFp8Kernel<<<4096, 256>>>(p, n, seed);
  return cudaGetLastError();
}
cudaError_t FillFloat(float* p, int64_t n, uint64_t seed, float lo, float hi) {
  FillFloatKernel<<<4096, 256>>>(p, n, seed, lo, hi);
  return cudaGetLastError();
}
cudaError_t FillBf16(uint16_t* p, int64_t n, uint64_t seed, float lo, float hi) {
  FillBf16Kernel<<<4096, 256>>>(reinterpret_cast<__nv_bfloat16*>(p), n, seed, lo, hi);
  return cudaGetLastError();
}

}  // namespace verifyd::bench
