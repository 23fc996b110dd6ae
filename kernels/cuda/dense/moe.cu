// Mixture-of-experts routing, permutation, gather and combine kernels (see moe.h).
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dense/common.cuh"
#include "kernels/cuda/dense/moe.h"

namespace verifyd::kernels::cuda {
namespace {

using internal::GridFor;

constexpr int kRouteThreads = 128;
constexpr int kPermuteThreads = 256;
constexpr int kCombineThreads = 256;

// kernels::ref's TakeLargest: the largest value not yet taken, the lowest index on ties; a
// number beats NaN. -1 when every index is taken. Serial (one thread).
__device__ int TakeLargest(const float* v, int n, char* taken) {
  int best = -1;
  for (int i = 0; i < n; ++i) {
    if (taken[i]) continue;
    if (best < 0 || v[i] > v[best] || (isnan(v[best]) && !isnan(v[i]))) best = i;
  }
  if (best >= 0) taken[best] = 1;
  return best;
}

// One CTA per row: scores and choices in parallel, the selection serially on thread 0 (the
// reference's exact order of comparisons and sums).
__global__ void MoeRouteKernel(const float* __restrict__ logits, const float* __restrict__ bias,
                               int E, int K, int G, int topk_group, bool norm, float scaling,
                               int32_t* __restrict__ experts, float* __restrict__ weights) {
  extern __shared__ float smem[];
  float* score = smem;                                     // [E]
  float* choice = score + E;                               // [E]
  float* group_score = choice + E;                         // [G]
  char* taken = reinterpret_cast<char*>(group_score + G);  // [max(E, G)]
  const int64_t r = blockIdx.x;
  const float* lr = logits + r * E;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-lr[e])));
    score[e] = s;
    choice[e] = __fadd_rn(s, bias[e]);
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  const int per_group = E / G;
  for (int g = 0; g < G; ++g) {
    for (int j = 0; j < per_group; ++j) taken[j] = 0;
    const float* cg = choice + g * per_group;
    const int a = TakeLargest(cg, per_group, taken);
    const int b = TakeLargest(cg, per_group, taken);
    group_score[g] = b < 0 ? cg[a] : __fadd_rn(cg[a], cg[b]);
  }
  for (int g = 0; g < G; ++g) taken[g] = 0;
  for (int k = 0; k < topk_group; ++k) TakeLargest(group_score, G, taken);
  for (int g = 0; g < G; ++g) {
    if (taken[g]) continue;
    for (int j = 0; j < per_group; ++j) choice[g * per_group + j] = -INFINITY;
  }
  for (int e = 0; e < E; ++e) taken[e] = 0;
  int32_t* er = experts + r * K;
  float* wr = weights + r * K;
  float w[kMoeMaxTopK];
  float sum = 0.0f;
  for (int k = 0; k < K; ++k) {
    const int e = TakeLargest(choice, E, taken);
    er[k] = e;
    w[k] = score[e];
    sum = __fadd_rn(sum, w[k]);
  }
  if (norm) {
    const float denominator = __fadd_rn(sum, 1e-20f);
    for (int k = 0; k < K; ++k) w[k] = __fdiv_rn(w[k], denominator);
  }
  for (int k = 0; k < K; ++k) wr[k] = __fmul_rn(w[k], scaling);
}

// One CTA: per expert (threads stride over experts) count its pairs, an exclusive scan on
// thread 0, then write each expert's pairs in ascending pair (= row) order.
__global__ void MoePermuteKernel(const int32_t* __restrict__ experts, int n, int E,
                                 int32_t* __restrict__ offsets, int32_t* __restrict__ perm_rows,
                                 int32_t* __restrict__ pair_pos, int K) {
  extern __shared__ int32_t start[];  // [E + 1]
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int32_t c = 0;
    for (int i = 0; i < n; ++i) c += experts[i] == e;
    start[e + 1] = c;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    start[0] = 0;
    for (int e = 0; e < E; ++e) start[e + 1] += start[e];
  }
  __syncthreads();
  for (int e = threadIdx.x; e <= E; e += blockDim.x) offsets[e] = start[e];
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int32_t o = start[e];
    for (int i = 0; i < n; ++i) {
      if (experts[i] != e) continue;
      perm_rows[o] = i / K;
      pair_pos[i] = o;
      ++o;
    }
  }
}

__global__ void MoeGatherKernel(const __nv_bfloat16* __restrict__ x, int64_t ldx,
                                const int32_t* __restrict__ perm_rows, int64_t cols, int64_t total,
                                __nv_bfloat16* __restrict__ out) {
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = idx / cols, j = idx % cols;
    out[idx] = x[static_cast<int64_t>(perm_rows[i]) * ldx + j];
  }
}

// One CTA per row: thread 0 sorts the row's pairs by expert index, then every thread sums
// its columns in that order.
__global__ void MoeCombineKernel(const int32_t* __restrict__ experts,
                                 const float* __restrict__ weights,
                                 const int32_t* __restrict__ pair_pos, const float* __restrict__ y,
                                 const float* __restrict__ shared, int K, int64_t cols,
                                 float* __restrict__ out, int64_t ld_out, bool accumulate) {
  __shared__ int32_t s_expert[kMoeMaxTopK], s_pos[kMoeMaxTopK];
  __shared__ float s_w[kMoeMaxTopK];
  const int64_t r = blockIdx.x;
  if (threadIdx.x == 0 && y != nullptr) {
    for (int k = 0; k < K; ++k) {
      // Insertion by expert index (experts of a row are distinct).
      const int32_t e = experts[r * K + k];
      int at = k;
      while (at > 0 && s_expert[at - 1] > e) {
        s_expert[at] = s_expert[at - 1];
        s_pos[at] = s_pos[at - 1];
        s_w[at] = s_w[at - 1];
        --at;
      }
      s_expert[at] = e;
      s_pos[at] = pair_pos[r * K + k];
      s_w[at] = weights[r * K + k];
    }
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float acc = 0.0f;
    if (y != nullptr) {
      for (int k = 0; k < K; ++k) {
        acc = __fadd_rn(acc, __fmul_rn(y[static_cast<int64_t>(s_pos[k]) * cols + j], s_w[k]));
      }
    }
    if (shared != nullptr) acc = __fadd_rn(acc, shared[r * cols + j]);
    float* o = out + r * ld_out + j;
    *o = accumulate ? __fadd_rn(*o, acc) : acc;
  }
}

__global__ void WidenKernel(const __nv_bfloat16* __restrict__ in, float* __restrict__ out,
                            int64_t n) {
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n;
       idx += (int64_t)gridDim.x * blockDim.x) {
    out[idx] = __bfloat162float(in[idx]);
  }
}

}  // namespace

absl::Status MoeRouteCuda(const MoeRouteParams& p) {
  const int E = p.num_experts, K = p.top_k, G = p.n_group;
  if (p.rows < 0) return absl::InvalidArgumentError("rows < 0");
  if (E <= 0 || E > kMoeMaxExperts) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_experts ", E, " must be in [1, ", kMoeMaxExperts, "]"));
  }
  if (K <= 0 || K > kMoeMaxTopK || K > E) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_k ", K, " must be in [1, min(", kMoeMaxTopK, ", num_experts)]"));
  }
  if (G <= 0 || E % G != 0 || p.topk_group <= 0 || p.topk_group > G) {
    return absl::InvalidArgumentError(absl::StrCat("n_group ", G, " / topk_group ", p.topk_group,
                                                   " inconsistent with ", E, " experts"));
  }
  if (static_cast<int64_t>(p.topk_group) * (E / G) < K) {
    return absl::InvalidArgumentError("top_k exceeds the experts of the kept groups");
  }
  if (p.rows == 0) return absl::OkStatus();
  if (!p.logits || !p.bias || !p.experts || !p.weights) {
    return absl::InvalidArgumentError("logits, bias, experts, weights must be set");
  }
  const size_t smem = (2 * static_cast<size_t>(E) + G) * sizeof(float) + (E > G ? E : G);
  MoeRouteKernel<<<static_cast<unsigned>(p.rows), kRouteThreads, smem,
                   static_cast<cudaStream_t>(p.stream)>>>(p.logits, p.bias, E, K, G, p.topk_group,
                                                          p.norm_topk_prob, p.routed_scaling_factor,
                                                          p.experts, p.weights);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("MoeRouteKernel");
  return absl::OkStatus();
}

absl::Status MoePermuteCuda(const MoePermuteParams& p) {
  const int E = p.num_experts, K = p.top_k;
  if (p.rows < 0) return absl::InvalidArgumentError("rows < 0");
  if (E <= 0 || E > kMoeMaxExperts || K <= 0 || K > E) {
    return absl::InvalidArgumentError(absl::StrCat("bad num_experts ", E, " / top_k ", K));
  }
  if (!p.experts || !p.offsets || !p.perm_rows || !p.pair_pos) {
    return absl::InvalidArgumentError("experts, offsets, perm_rows, pair_pos must be set");
  }
  const int64_t n = static_cast<int64_t>(p.rows) * K;
  if (n > INT32_MAX) return absl::InvalidArgumentError("rows * top_k exceeds int32");
  // Runs for rows = 0 too: the offsets are then all 0.
  MoePermuteKernel<<<1, kPermuteThreads, (E + 1) * sizeof(int32_t),
                     static_cast<cudaStream_t>(p.stream)>>>(p.experts, static_cast<int>(n), E,
                                                            p.offsets, p.perm_rows, p.pair_pos, K);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("MoePermuteKernel");
  return absl::OkStatus();
}

absl::Status MoeGatherCuda(const MoeGatherParams& p) {
  if (p.n < 0 || p.cols <= 0 || p.ldx < p.cols) {
    return absl::InvalidArgumentError("n < 0, cols <= 0 or ldx < cols");
  }
  if (p.n == 0) return absl::OkStatus();
  if (!p.x || !p.perm_rows || !p.out) {
    return absl::InvalidArgumentError("x, perm_rows, out must be set");
  }
  const int64_t total = p.n * p.cols;
  MoeGatherKernel<<<GridFor(total, 256), 256, 0, static_cast<cudaStream_t>(p.stream)>>>(
      reinterpret_cast<const __nv_bfloat16*>(p.x), p.ldx, p.perm_rows, p.cols, total,
      reinterpret_cast<__nv_bfloat16*>(p.out));
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("MoeGatherKernel");
  return absl::OkStatus();
}

absl::Status MoeCombineCuda(const MoeCombineParams& p) {
  if (p.rows < 0 || p.cols <= 0 || p.ld_out < p.cols) {
    return absl::InvalidArgumentError("rows < 0, cols <= 0 or ld_out < cols");
  }
  if (p.top_k <= 0 || p.top_k > kMoeMaxTopK) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_k ", p.top_k, " must be in [1, ", kMoeMaxTopK, "]"));
  }
  if (p.rows == 0) return absl::OkStatus();
  if (!p.out) return absl::InvalidArgumentError("out must be set");
  if (p.y && (!p.experts || !p.weights || !p.pair_pos)) {
    return absl::InvalidArgumentError("experts, weights, pair_pos must be set with y");
  }
  MoeCombineKernel<<<static_cast<unsigned>(p.rows), kCombineThreads, 0,
                     static_cast<cudaStream_t>(p.stream)>>>(p.experts, p.weights, p.pair_pos, p.y,
                                                            p.shared, p.top_k, p.cols, p.out,
                                                            p.ld_out, p.accumulate);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("MoeCombineKernel");
  return absl::OkStatus();
}

absl::Status Bf16ToFloatCuda(const bf16_bits* in, float* out, int64_t n, void* stream) {
  if (n < 0) return absl::InvalidArgumentError("n < 0");
  if (n == 0) return absl::OkStatus();
  if (!in || !out) return absl::InvalidArgumentError("in and out must be set");
  WidenKernel<<<GridFor(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const __nv_bfloat16*>(in), out, n);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("WidenKernel");
  return absl::OkStatus();
}

}  // namespace verifyd::kernels::cuda
