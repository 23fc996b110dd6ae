// Embedding gather, SwiGLU and residual add kernels (see elementwise.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dense/elementwise.h"

namespace verifyd::kernels::cuda {
namespace {

using internal::GridFor;

__global__ void EmbeddingGatherKernel(const int32_t* __restrict__ tokens,
                                      const __nv_bfloat16* __restrict__ table, int64_t hidden,
                                      int64_t vocab_begin, int64_t vocab_rows, int64_t n,
                                      float* __restrict__ out) {
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = idx / hidden, j = idx % hidden;
    const int64_t t = static_cast<int64_t>(tokens[r]) - vocab_begin;
    out[idx] = vocab_rows < 0 || (t >= 0 && t < vocab_rows)
                   ? __bfloat162float(table[t * hidden + j])
                   : 0.0f;
  }
}

__global__ void SwiGluKernel(const float* __restrict__ gu, int64_t ld_in, int64_t up_off,
                             int64_t n_cols, int64_t n, __nv_bfloat16* __restrict__ out,
                             int64_t ld_out, const int32_t* __restrict__ row_begin,
                             const int32_t* __restrict__ row_end) {
  const int64_t lo = row_begin != nullptr ? *row_begin * n_cols : 0;
  const int64_t hi = row_begin != nullptr ? *row_end * n_cols : n;
  for (int64_t idx = lo + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < hi;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = idx / n_cols, j = idx % n_cols;
    const float g = gu[r * ld_in + j];
    // silu(g) = g / (1 + exp(-g)), IEEE division and expf (no fast-math), as the reference.
    const float silu = __fdiv_rn(g, __fadd_rn(1.0f, expf(-g)));
    out[r * ld_out + j] = __float2bfloat16_rn(__fmul_rn(silu, gu[r * ld_in + up_off + j]));
  }
}

__global__ void AddKernel(float* __restrict__ y, const float* __restrict__ x, int64_t n) {
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n;
       idx += (int64_t)gridDim.x * blockDim.x) {
    y[idx] = __fadd_rn(y[idx], x[idx]);
  }
}

}  // namespace

absl::Status EmbeddingGatherCuda(const EmbeddingGatherParams& p) {
  if (p.rows < 0 || p.hidden <= 0) return absl::InvalidArgumentError("rows < 0 or hidden <= 0");
  if (p.rows == 0) return absl::OkStatus();
  if (!p.tokens || !p.out || (!p.table && p.vocab_rows != 0))
    return absl::InvalidArgumentError("tokens, table, out must be set");
  const int64_t n = p.rows * p.hidden;
  EmbeddingGatherKernel<<<GridFor(n, 256), 256, 0, static_cast<cudaStream_t>(p.stream)>>>(
      p.tokens, reinterpret_cast<const __nv_bfloat16*>(p.table), p.hidden, p.vocab_begin,
      p.vocab_rows, n, p.out);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("EmbeddingGatherKernel");
  return absl::OkStatus();
}

absl::Status SwiGluCuda(const SwiGluParams& p) {
  if (p.rows < 0 || p.n <= 0) return absl::InvalidArgumentError("rows < 0 or n <= 0");
  if (p.up_offset < p.n || p.ld_in < p.up_offset + p.n) {
    return absl::InvalidArgumentError("up_offset / ld_in inconsistent with n");
  }
  if (p.ld_out < p.n) return absl::InvalidArgumentError("ld_out < n");
  if (p.rows == 0) return absl::OkStatus();
  if (!p.gate_up || !p.out) return absl::InvalidArgumentError("gate_up and out must be set");
  const int64_t n = p.rows * p.n;
  SwiGluKernel<<<GridFor(n, 256), 256, 0, static_cast<cudaStream_t>(p.stream)>>>(
      p.gate_up, p.ld_in, p.up_offset, p.n, n, reinterpret_cast<__nv_bfloat16*>(p.out), p.ld_out,
      p.row_begin, p.row_end);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("SwiGluKernel");
  return absl::OkStatus();
}

absl::Status AddInPlaceCuda(float* y, const float* x, int64_t count, void* stream) {
  if (count < 0) return absl::InvalidArgumentError("count < 0");
  if (count == 0) return absl::OkStatus();
  if (!y || !x) return absl::InvalidArgumentError("y and x must be set");
  AddKernel<<<GridFor(count, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(y, x, count);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("AddKernel");
  return absl::OkStatus();
}

}  // namespace verifyd::kernels::cuda
