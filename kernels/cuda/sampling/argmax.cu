// Vocab-parallel argmax kernels (see argmax.h).
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/sampling/argmax.h"

namespace verifyd::kernels::cuda {
namespace {

constexpr int kThreads = 512;

// True when candidate (v, i) beats (bv, bi): valid beats invalid, larger value wins, equal
// values go to the lower index. Invalid = index < 0 (NaN or empty).
__device__ __forceinline__ bool Beats(float v, int64_t i, float bv, int64_t bi) {
  if (i < 0) return false;
  if (bi < 0) return true;
  return v > bv || (v == bv && i < bi);
}

__global__ void ArgmaxRowsKernel(const float* __restrict__ logits, int64_t ld, int64_t n,
                                 int64_t offset, ArgmaxPair* __restrict__ out) {
  __shared__ float sv[kThreads];
  __shared__ int64_t si[kThreads];
  const float* row = logits + blockIdx.x * ld;
  float bv = __int_as_float(0x7fc00000);  // NaN
  int64_t bi = -1;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float v = row[j];
    if (isnan(v)) continue;
    if (Beats(v, j, bv, bi)) {
      bv = v;
      bi = j;
    }
  }
  sv[threadIdx.x] = bv;
  si[threadIdx.x] = bi;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s &&
        Beats(sv[threadIdx.x + s], si[threadIdx.x + s], sv[threadIdx.x], si[threadIdx.x])) {
      sv[threadIdx.x] = sv[threadIdx.x + s];
      si[threadIdx.x] = si[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    ArgmaxPair p;
    p.value = sv[0];
    p.index = si[0] < 0 ? -1 : static_cast<int32_t>(si[0] + offset);
    out[blockIdx.x] = p;
  }
}

__global__ void ArgmaxCombineKernel(const ArgmaxPair* __restrict__ g, int rows, int world,
                                    int32_t* __restrict__ pred) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float bv = 0.f;
  int64_t bi = -1;
  for (int w = 0; w < world; ++w) {  // rank order: ascending vocab shards
    const ArgmaxPair p = g[static_cast<int64_t>(w) * rows + r];
    if (Beats(p.value, p.index, bv, bi)) {
      bv = p.value;
      bi = p.index;
    }
  }
  pred[r] = static_cast<int32_t>(bi);
}

}  // namespace

absl::Status ArgmaxRowsCuda(const ArgmaxRowsParams& p) {
  if (p.rows < 0 || p.n < 0) return absl::InvalidArgumentError("rows or n < 0");
  if (p.rows == 0) return absl::OkStatus();
  if (!p.out || (p.n > 0 && !p.logits)) return absl::InvalidArgumentError("logits/out must be set");
  if (p.n > 0 && p.ld < p.n) return absl::InvalidArgumentError("ld < n");
  ArgmaxRowsKernel<<<static_cast<unsigned>(p.rows), kThreads, 0,
                     static_cast<cudaStream_t>(p.stream)>>>(p.logits, p.ld, p.n, p.index_offset,
                                                            p.out);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("ArgmaxRowsKernel");
  return absl::OkStatus();
}

absl::Status ArgmaxCombineCuda(const ArgmaxCombineParams& p) {
  if (p.rows < 0 || p.world < 1) return absl::InvalidArgumentError("rows < 0 or world < 1");
  if (p.rows == 0) return absl::OkStatus();
  if (!p.gathered || !p.predictions)
    return absl::InvalidArgumentError("gathered/predictions must be set");
  ArgmaxCombineKernel<<<(p.rows + 127) / 128, 128, 0, static_cast<cudaStream_t>(p.stream)>>>(
      p.gathered, p.rows, p.world, p.predictions);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("ArgmaxCombineKernel");
  return absl::OkStatus();
}

}  // namespace verifyd::kernels::cuda
