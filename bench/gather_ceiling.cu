// Gather ceiling for verify_attention_bench: how fast the GPU reads latent rows (576 bf16 =
// 1152 B) listed in a slot array, in that order, with 16-byte loads and nothing else — the
// memory ceiling for page size 1 (random order) against the same rows read in pool order.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "bench/gather_ceiling.h"

namespace verifyd::bench {
namespace {

// A warp per row: lanes read the row's 72 16-byte chunks; XOR-reduce so the loads stay live.
__global__ void __launch_bounds__(256)
    GatherRowsKernel(const uint4* pool, const int32_t* idx, int64_t rows, uint32_t* sink) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  uint32_t x = 0;
  for (int64_t r = warp; r < rows; r += warps) {
    const uint4* row = pool + static_cast<int64_t>(idx[r]) * 72;
    uint4 a = __ldcs(row + lane);
    uint4 b = __ldcs(row + lane + 32);
    uint4 c = lane < 8 ? __ldcs(row + lane + 64) : make_uint4(0, 0, 0, 0);
    x ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w;
  }
  if (x == 0x9e3779b9u) sink[0] = x;  // practically never: keeps the loads
}

}  // namespace

cudaError_t MeasureGatherGBps(const void* pool, const int32_t* idx, int64_t rows, int num_sms,
                              int iters, double* gbps) {
  uint32_t* sink = nullptr;
  cudaError_t err = cudaMalloc(&sink, 4);
  if (err != cudaSuccess) return err;
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  const int grid = num_sms * 8;
  std::vector<float> ms;
  for (int i = 0; i < iters + 2; ++i) {
    cudaEventRecord(a);
    GatherRowsKernel<<<grid, 256>>>(static_cast<const uint4*>(pool), idx, rows, sink);
    cudaEventRecord(b);
    err = cudaEventSynchronize(b);
    if (err != cudaSuccess) break;
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    if (i >= 2) ms.push_back(t);
  }
  if (err == cudaSuccess) err = cudaGetLastError();
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFree(sink);
  if (err != cudaSuccess) return err;
  std::sort(ms.begin(), ms.end());
  *gbps = static_cast<double>(rows) * 1152.0 / (ms[ms.size() / 2] * 1e-3) / 1e9;
  return cudaSuccess;
}

}  // namespace verifyd::bench
