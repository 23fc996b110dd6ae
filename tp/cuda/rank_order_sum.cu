// SumInRankOrderCuda (see the header).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "tp/cuda/rank_order_sum.h"

namespace verifyd::tp {
namespace {

struct RankPointers {
  const void* src[kMaxRankOrderSources];
};

template <typename T>
__global__ void SumInRankOrderKernel(RankPointers p, int world, size_t count, T* out) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    float acc = 0.0f;
    for (int r = 0; r < world; ++r) {
      if constexpr (sizeof(T) == 4) {
        acc += static_cast<const float*>(p.src[r])[i];
      } else {
        acc += __bfloat162float(static_cast<const __nv_bfloat16*>(p.src[r])[i]);
      }
    }
    if constexpr (sizeof(T) == 4) {
      out[i] = acc;
    } else {
      out[i] = __float2bfloat16_rn(acc);
    }
  }
}

}  // namespace

absl::Status SumInRankOrderCuda(const void* const* src, int world, size_t count,
                                kernels::DType dtype, void* out, void* stream) {
  if (world < 1 || world > kMaxRankOrderSources) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank-order sum: world ", world, " outside 1..", kMaxRankOrderSources));
  }
  if (dtype != kernels::DType::kFloat32 && dtype != kernels::DType::kBFloat16) {
    return absl::InvalidArgumentError("rank-order sum: dtype must be float32 or bfloat16");
  }
  if (count == 0) return absl::OkStatus();
  RankPointers p{};
  for (int r = 0; r < world; ++r) p.src[r] = src[r];
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<size_t>((count + threads - 1) / threads, 1024));
  auto s = static_cast<cudaStream_t>(stream);
  if (dtype == kernels::DType::kFloat32) {
    SumInRankOrderKernel<float>
        <<<blocks, threads, 0, s>>>(p, world, count, static_cast<float*>(out));
  } else {
    SumInRankOrderKernel<__nv_bfloat16>
        <<<blocks, threads, 0, s>>>(p, world, count, static_cast<__nv_bfloat16*>(out));
  }
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("SumInRankOrderKernel");
  return absl::OkStatus();
}

}  // namespace verifyd::tp
