// LaunchPositionalIndices (see positional.cuh).
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/verify_attention/positional.cuh"
#include "kernels/verify_attention.h"

namespace verifyd::kernels::cuda::detail {
namespace {

constexpr int kThreads = 256;
static_assert(kMaxTailRows <= kThreads, "one thread per tail row");

__global__ void __launch_bounds__(kThreads) PositionalIndicesKernel(PositionalIndexArgs args) {
  __shared__ int32_t vis[kMaxTailRows];  // the node's visible tail rows, in index order
  const VerifyIndexTask task = args.tasks[blockIdx.x];
  const int t = threadIdx.x;
  if (t < task.num_nodes) {
    const uint64_t* mrow = args.tree_mask + static_cast<int64_t>(task.mask_row) * args.mask_words;
    const int n = task.num_nodes;
    uint64_t w0 = mrow[0];
    uint64_t w1 = args.mask_words > 1 ? mrow[1] : 0ull;
    if (n < 64) w0 &= (1ull << n) - 1ull;  // bits past the request's rows are ignored
    if (n <= 64) {
      w1 = 0ull;
    } else if (n < 128) {
      w1 &= (1ull << (n - 64)) - 1ull;
    }
    const uint64_t w = t < 64 ? w0 : w1;
    const int bit = t & 63;
    if ((w >> bit) & 1ull) {
      vis[__popcll(w & ((1ull << bit) - 1ull)) + (t < 64 ? 0 : __popcll(w0))] = t;
    }
  }
  __syncthreads();
  const int32_t* src = args.kv_indices + task.src;
  int32_t* dst = args.out + task.dst;
  for (int k = task.begin + t; k < task.end; k += kThreads) {
    dst[k - task.begin] = k < task.ctx ? src[k] : src[task.ctx + vis[k - task.ctx]];
  }
}

}  // namespace

absl::Status LaunchPositionalIndices(const PositionalIndexArgs& args, int num_tasks, void* stream) {
  if (num_tasks == 0) return absl::OkStatus();
  PositionalIndicesKernel<<<num_tasks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(args);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("PositionalIndicesKernel");
  return absl::OkStatus();
}

}  // namespace verifyd::kernels::cuda::detail
