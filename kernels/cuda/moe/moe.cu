// Mixture-of-experts routing, permutation, gather and combine kernels (see moe.h).
#include <cuda_fp8.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/moe/moe.h"

namespace verifyd::kernels::cuda {
namespace {

using internal::GridFor;

constexpr int kRouteThreads = 32;  // one warp per row
constexpr int kPermuteThreads = 256;
constexpr int kCombineThreads = 256;

// kernels::ref's TakeLargest order: a number beats NaN, a larger number wins, ties go to the
// lower index (NaNs among themselves too). A total order, so a reduction in any grouping
// picks the same element as the reference's serial scan.
__device__ bool Beats(float a, int ia, float b, int ib) {
  const bool na = isnan(a), nb = isnan(b);
  if (na != nb) return nb;
  if (!na && a != b) return a > b;
  return ia < ib;
}

// The largest element of v[0, n) not yet taken, by the order above, found by one warp (lanes
// stride over the elements, then a shuffle reduction); -1 when every index is taken. Marks it
// taken. Every lane returns the same index.
__device__ int WarpTakeLargest(const float* v, int n, char* taken, int lane) {
  float bv = 0.f;
  int bi = -1;
  for (int i = lane; i < n; i += 32) {
    if (taken[i]) continue;
    if (bi < 0 || Beats(v[i], i, bv, bi)) {
      bv = v[i];
      bi = i;
    }
  }
  for (int o = 16; o > 0; o /= 2) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (oi >= 0 && (bi < 0 || Beats(ov, oi, bv, bi))) {
      bv = ov;
      bi = oi;
    }
  }
  __syncwarp();
  if (lane == 0 && bi >= 0) taken[bi] = 1;
  __syncwarp();
  return bi;
}

// One warp per row: scores and choices across the lanes, every selection a warp reduction
// (WarpTakeLargest), the sums on lane 0 in the reference's order.
__global__ void MoeRouteKernel(const float* __restrict__ logits, const float* __restrict__ bias,
                               int E, int K, int G, int topk_group, bool norm, float scaling,
                               int32_t* __restrict__ experts, float* __restrict__ weights) {
  extern __shared__ float smem[];
  float* score = smem;                                     // [E]
  float* choice = score + E;                               // [E]
  float* group_score = choice + E;                         // [G]
  char* taken = reinterpret_cast<char*>(group_score + G);  // [max(E, G)]
  const int lane = threadIdx.x;
  const int64_t r = blockIdx.x;
  const float* lr = logits + r * E;
  for (int e = lane; e < E; e += 32) {
    const float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-lr[e])));
    score[e] = s;
    choice[e] = __fadd_rn(s, bias[e]);
  }
  __syncwarp();
  const int per_group = E / G;
  for (int g = 0; g < G; ++g) {
    for (int j = lane; j < per_group; j += 32) taken[j] = 0;
    __syncwarp();
    const float* cg = choice + g * per_group;
    const int a = WarpTakeLargest(cg, per_group, taken, lane);
    const int b = WarpTakeLargest(cg, per_group, taken, lane);
    if (lane == 0) group_score[g] = b < 0 ? cg[a] : __fadd_rn(cg[a], cg[b]);
    __syncwarp();
  }
  for (int g = lane; g < G; g += 32) taken[g] = 0;
  __syncwarp();
  for (int k = 0; k < topk_group; ++k) WarpTakeLargest(group_score, G, taken, lane);
  for (int g = 0; g < G; ++g) {
    if (taken[g]) continue;
    for (int j = lane; j < per_group; j += 32) choice[g * per_group + j] = -INFINITY;
  }
  __syncwarp();
  for (int e = lane; e < E; e += 32) taken[e] = 0;
  __syncwarp();
  int32_t* er = experts + r * K;
  float* wr = weights + r * K;
  float w[kMoeMaxTopK];
  float sum = 0.0f;
  for (int k = 0; k < K; ++k) {
    const int e = WarpTakeLargest(choice, E, taken, lane);
    if (lane == 0) er[k] = e;
    w[k] = score[e];
    sum = __fadd_rn(sum, w[k]);
  }
  if (lane != 0) return;
  if (norm) {
    const float denominator = __fadd_rn(sum, 1e-20f);
    for (int k = 0; k < K; ++k) w[k] = __fdiv_rn(w[k], denominator);
  }
  for (int k = 0; k < K; ++k) wr[k] = __fmul_rn(w[k], scaling);
}

// The permutation in three launches over chunks of kPermuteChunk pairs (pair i = row * K + k,
// so pair order is row order and a row never picks an expert twice):
//   count: per chunk, the pairs of each expert -> ws[chunk][e];
//   scan:  one CTA: per expert the chunks' counts become absolute starts (offsets[e] + the
//          pairs of e in earlier chunks), offsets = exclusive scan of the totals;
//   place: per chunk, warp by warp in order, each pair's rank among the earlier pairs of its
//          expert in the chunk (__match_any_sync within the warp, a shared counter across
//          warps) -> its position. Deterministic: positions depend only on the routing.
constexpr int kPermuteChunk = 256;

__global__ void MoePermuteCountKernel(const int32_t* __restrict__ experts, int n, int E,
                                      int32_t* __restrict__ ws) {
  extern __shared__ int32_t cnt[];  // [E]
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kPermuteChunk + threadIdx.x;
  if (i < n) atomicAdd(&cnt[experts[i]], 1);
  __syncthreads();
  int32_t* out = ws + static_cast<int64_t>(blockIdx.x) * E;
  for (int e = threadIdx.x; e < E; e += blockDim.x) out[e] = cnt[e];
}

__global__ void MoePermuteScanKernel(int chunks, int E, int32_t* __restrict__ ws,
                                     int32_t* __restrict__ offsets) {
  extern __shared__ int32_t total[];  // [E + 1]
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int32_t run = 0;
    for (int c = 0; c < chunks; ++c) {
      const int32_t v = ws[static_cast<int64_t>(c) * E + e];
      ws[static_cast<int64_t>(c) * E + e] = run;
      run += v;
    }
    total[e + 1] = run;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    total[0] = 0;
    for (int e = 0; e < E; ++e) total[e + 1] += total[e];
  }
  __syncthreads();
  for (int e = threadIdx.x; e <= E; e += blockDim.x) offsets[e] = total[e];
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    for (int c = 0; c < chunks; ++c) ws[static_cast<int64_t>(c) * E + e] += total[e];
  }
}

__global__ void MoePermutePlaceKernel(const int32_t* __restrict__ experts, int n, int E, int K,
                                      const int32_t* __restrict__ ws,
                                      int32_t* __restrict__ perm_rows,
                                      int32_t* __restrict__ pair_pos) {
  extern __shared__ int32_t next[];  // [E]: the next free position of each expert
  const int32_t* start = ws + static_cast<int64_t>(blockIdx.x) * E;
  for (int e = threadIdx.x; e < E; e += blockDim.x) next[e] = start[e];
  __syncthreads();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kPermuteChunk + threadIdx.x;
  const bool valid = i < n;
  const int32_t e = valid ? experts[i] : -1 - static_cast<int32_t>(threadIdx.x % 32);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned same = __match_any_sync(0xffffffffu, e);
  const int rank = __popc(same & ((1u << lane) - 1));
  const bool last = (same >> lane) == 1u;  // the highest lane of its group
  for (int w = 0; w < kPermuteChunk / 32; ++w) {
    int32_t pos = 0;
    if (warp == w && valid) pos = next[e] + rank;
    __syncwarp();  // every lane has read next[e] before the group's last lane advances it
    if (warp == w && valid) {
      perm_rows[pos] = static_cast<int32_t>(i / K);
      pair_pos[i] = pos;
      if (last) next[e] = pos + 1;
    }
    __syncthreads();
  }
}

__global__ void MoeGatherKernel(const __nv_bfloat16* __restrict__ x, int64_t ldx,
                                const int32_t* __restrict__ perm_rows, int64_t cols, int64_t total,
                                __nv_bfloat16* __restrict__ out,
                                const int32_t* __restrict__ row_begin,
                                const int32_t* __restrict__ row_end) {
  const int64_t lo = row_begin != nullptr ? *row_begin * cols : 0;
  const int64_t hi = row_begin != nullptr ? *row_end * cols : total;
  for (int64_t idx = lo + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < hi;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = idx / cols, j = idx % cols;
    out[idx] = x[static_cast<int64_t>(perm_rows[i]) * ldx + j];
  }
}

// Router logits: one warp per expert and tile of kRouterRows rows (a CTA: 8 warps, the same
// rows, so the rows' loads hit L1). Lane l sums k = 4 l + 128 j (+ 0..3) in ascending j with
// fmaf, then the lanes combine in a fixed xor tree: each logit's arithmetic depends only on its
// row and expert, never on the number of rows. (Four experts per warp, one row load reused,
// measured slower than cuBLAS beyond ~64 rows on an H200.)
constexpr int kRouterRows = 16;
constexpr int kRouterWarps = 8;

template <bool kVec4>
__global__ void MoeRouterLogitsKernel(const float* __restrict__ x, int64_t ldx,
                                      const float* __restrict__ w, int64_t ldw, int rows, int E,
                                      int64_t H, float* __restrict__ y, int64_t ldy) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int e = blockIdx.x * kRouterWarps + warp;
  const int r0 = blockIdx.y * kRouterRows;
  if (e >= E) return;
  const int nr = min(kRouterRows, rows - r0);
  float acc[kRouterRows];
#pragma unroll
  for (int r = 0; r < kRouterRows; ++r) acc[r] = 0.f;
  const float* we = w + static_cast<int64_t>(e) * ldw;
  if constexpr (kVec4) {
    for (int64_t k = lane * 4; k < H; k += 128) {
      const float4 wv = *reinterpret_cast<const float4*>(we + k);
#pragma unroll
      for (int r = 0; r < kRouterRows; ++r) {
        if (r < nr) {
          const float4 xv =
              *reinterpret_cast<const float4*>(x + static_cast<int64_t>(r0 + r) * ldx + k);
          acc[r] = fmaf(xv.x, wv.x, acc[r]);
          acc[r] = fmaf(xv.y, wv.y, acc[r]);
          acc[r] = fmaf(xv.z, wv.z, acc[r]);
          acc[r] = fmaf(xv.w, wv.w, acc[r]);
        }
      }
    }
  } else {
    for (int64_t k = lane; k < H; k += 32) {
      const float wv = we[k];
#pragma unroll
      for (int r = 0; r < kRouterRows; ++r) {
        if (r < nr) acc[r] = fmaf(x[static_cast<int64_t>(r0 + r) * ldx + k], wv, acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRouterRows; ++r) {
    float v = acc[r];
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0 && r < nr) y[static_cast<int64_t>(r0 + r) * ldy + e] = v;
  }
}

// Router logits for many rows (> kMoeRouterKernelMaxRows): the same arithmetic per logit as
// MoeRouterLogitsKernel<true> (lane l sums k = 4 l + 128 j (+ 0..3) in ascending j with fmaf,
// then the same xor tree), so every logit has the same bits whichever kernel computes it. A CTA
// holds kTiledRows rows x kTiledExperts experts: the rows' x is staged in shared memory one
// kTiledChunk-column chunk at a time and every warp reuses each x load for 4 experts (the
// one-warp-per-expert kernel re-read x from L2 once per expert: 2.6 ms for 2,048 rows at
// Kimi-K2's 384 x 7168 on an H200).
constexpr int kTiledRows = 16;
constexpr int kTiledExpertsPerWarp = 4;
constexpr int kTiledExperts = kRouterWarps * kTiledExpertsPerWarp;
constexpr int kTiledChunk = 512;  // columns of x staged per step (a multiple of 128)

__global__ void __launch_bounds__(kRouterWarps * 32)
    MoeRouterLogitsTiledKernel(const float* __restrict__ x, int64_t ldx,
                               const float* __restrict__ w, int64_t ldw, int rows, int E, int64_t H,
                               float* __restrict__ y, int64_t ldy) {
  __shared__ float4 xs[kTiledRows][kTiledChunk / 4];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int e0 = blockIdx.x * kTiledExperts + warp * kTiledExpertsPerWarp;
  const int r0 = blockIdx.y * kTiledRows;
  const int nr = min(kTiledRows, rows - r0);
  float acc[kTiledExpertsPerWarp][kTiledRows];
#pragma unroll
  for (int e = 0; e < kTiledExpertsPerWarp; ++e) {
#pragma unroll
    for (int r = 0; r < kTiledRows; ++r) acc[e][r] = 0.f;
  }
  const float* we[kTiledExpertsPerWarp];
#pragma unroll
  for (int e = 0; e < kTiledExpertsPerWarp; ++e) {
    we[e] = w + static_cast<int64_t>(min(e0 + e, E - 1)) * ldw;  // a clamped row stays unused
  }
  for (int64_t c0 = 0; c0 < H; c0 += kTiledChunk) {
    const int cols = static_cast<int>(H - c0 < kTiledChunk ? H - c0 : kTiledChunk);
    __syncthreads();  // the previous chunk is consumed
    for (int i = threadIdx.x; i < kTiledRows * (kTiledChunk / 4); i += blockDim.x) {
      const int r = i / (kTiledChunk / 4), c4 = i % (kTiledChunk / 4);
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (r < nr && c4 * 4 < cols) {
        v = *reinterpret_cast<const float4*>(x + static_cast<int64_t>(r0 + r) * ldx + c0 + c4 * 4);
      }
      xs[r][c4] = v;
    }
    __syncthreads();
    for (int k = lane * 4; k < cols; k += 128) {
      float4 wv[kTiledExpertsPerWarp];
#pragma unroll
      for (int e = 0; e < kTiledExpertsPerWarp; ++e) {
        wv[e] = *reinterpret_cast<const float4*>(we[e] + c0 + k);
      }
#pragma unroll
      for (int r = 0; r < kTiledRows; ++r) {
        const float4 xv = xs[r][k / 4];
#pragma unroll
        for (int e = 0; e < kTiledExpertsPerWarp; ++e) {
          acc[e][r] = fmaf(xv.x, wv[e].x, acc[e][r]);
          acc[e][r] = fmaf(xv.y, wv[e].y, acc[e][r]);
          acc[e][r] = fmaf(xv.z, wv[e].z, acc[e][r]);
          acc[e][r] = fmaf(xv.w, wv[e].w, acc[e][r]);
        }
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kTiledExpertsPerWarp; ++e) {
#pragma unroll
    for (int r = 0; r < kTiledRows; ++r) {
      float v = acc[e][r];
      for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0 && r < nr && e0 + e < E) y[static_cast<int64_t>(r0 + r) * ldy + e0 + e] = v;
    }
  }
}

// One warp per (row, 128-column group): lane l holds columns 4l .. 4l + 3 of the group.
// kSwiGlu: the values are silu(gate) * up from fp32 gate_up rows; else bf16 rows of x
// (through perm_rows when set).
template <bool kSwiGlu>
__global__ void QuantFp8Kernel(int64_t rows, int64_t cols, const __nv_bfloat16* __restrict__ x,
                               int64_t ldx, const int32_t* __restrict__ perm_rows,
                               const float* __restrict__ gu, int64_t ld_in, int64_t up_off,
                               __nv_fp8_storage_t* __restrict__ out, float* __restrict__ scale,
                               int64_t scale_ld_rows, const int32_t* __restrict__ row_begin,
                               const int32_t* __restrict__ row_end) {
  const int64_t groups = cols / 128;
  const int64_t warp = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= rows * groups) return;
  const int64_t i = warp / groups, g = warp % groups;
  if (row_begin != nullptr && (i < *row_begin || i >= *row_end)) return;
  const int64_t c0 = g * 128 + lane * 4;
  float v[4];
  if constexpr (kSwiGlu) {
    for (int t = 0; t < 4; ++t) {
      const float a = gu[i * ld_in + c0 + t];
      const float silu = __fdiv_rn(a, __fadd_rn(1.0f, expf(-a)));
      v[t] = __fmul_rn(silu, gu[i * ld_in + up_off + c0 + t]);
    }
  } else {
    const int64_t src = perm_rows != nullptr ? perm_rows[i] : i;
    for (int t = 0; t < 4; ++t) v[t] = __bfloat162float(x[src * ldx + c0 + t]);
  }
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
  for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = __fdiv_rn(fmaxf(amax, 1e-10f), 448.0f);
  for (int t = 0; t < 4; ++t) {
    out[i * cols + c0 + t] = __nv_cvt_float_to_fp8(__fdiv_rn(v[t], s), __NV_SATFINITE, __NV_E4M3);
  }
  if (lane == 0) scale[scale_ld_rows > 0 ? g * scale_ld_rows + i : i * groups + g] = s;
}

// One CTA per row: thread 0 sorts the row's pairs by expert index, then every thread sums
// its columns in that order.
__global__ void MoeCombineKernel(const int32_t* __restrict__ experts,
                                 const float* __restrict__ weights,
                                 const int32_t* __restrict__ pair_pos, const float* __restrict__ y,
                                 const float* __restrict__ shared, int K, int64_t cols,
                                 float* __restrict__ out, int64_t ld_out, bool accumulate,
                                 int expert_begin, int expert_end) {
  __shared__ int32_t s_expert[kMoeMaxTopK], s_pos[kMoeMaxTopK];
  __shared__ float s_w[kMoeMaxTopK];
  __shared__ int s_n;
  const int64_t r = blockIdx.x;
  if (threadIdx.x == 0) {
    int n = 0;
    for (int k = 0; k < K && y != nullptr; ++k) {
      // Insertion by expert index (experts of a row are distinct); other GPUs' experts out.
      const int32_t e = experts[r * K + k];
      if (e < expert_begin || (expert_end >= 0 && e >= expert_end)) continue;
      int at = n++;
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
    s_n = n;
  }
  __syncthreads();
  const int n = s_n;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float acc = 0.0f;
    if (y != nullptr) {
      for (int k = 0; k < n; ++k) {
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

__global__ void NarrowKernel(const float* __restrict__ in, __nv_bfloat16* __restrict__ out,
                             int64_t n) {
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n;
       idx += (int64_t)gridDim.x * blockDim.x) {
    out[idx] = __float2bfloat16_rn(in[idx]);
  }
}

}  // namespace

absl::Status MoeRouterLogitsCuda(const MoeRouterLogitsParams& p) {
  if (p.rows < 0 || p.num_experts <= 0 || p.hidden <= 0 || p.ldx < p.hidden || p.ldw < p.hidden ||
      p.ldy < p.num_experts) {
    return absl::InvalidArgumentError(absl::StrCat("router logits: bad shape rows=", p.rows,
                                                   " experts=", p.num_experts,
                                                   " hidden=", p.hidden));
  }
  if (p.rows == 0) return absl::OkStatus();
  if (!p.x || !p.w || !p.y) return absl::InvalidArgumentError("router logits: x, w, y needed");
  const auto st = static_cast<cudaStream_t>(p.stream);
  const bool vec4 = p.hidden % 4 == 0 && p.ldx % 4 == 0 && p.ldw % 4 == 0 &&
                    (reinterpret_cast<uintptr_t>(p.x) & 15) == 0 &&
                    (reinterpret_cast<uintptr_t>(p.w) & 15) == 0;
  const dim3 grid((p.num_experts + kRouterWarps - 1) / kRouterWarps,
                  (p.rows + kRouterRows - 1) / kRouterRows);
  auto launch = [&](auto kernel) {
    kernel<<<grid, kRouterWarps * 32, 0, st>>>(p.x, p.ldx, p.w, p.ldw, p.rows, p.num_experts,
                                               p.hidden, p.y, p.ldy);
  };
  if (vec4 && p.rows > kMoeRouterKernelMaxRows) {
    const dim3 tiled((p.num_experts + kTiledExperts - 1) / kTiledExperts,
                     (p.rows + kTiledRows - 1) / kTiledRows);
    MoeRouterLogitsTiledKernel<<<tiled, kRouterWarps * 32, 0, st>>>(
        p.x, p.ldx, p.w, p.ldw, p.rows, p.num_experts, p.hidden, p.y, p.ldy);
    VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("MoeRouterLogitsTiledKernel");
    return absl::OkStatus();
  }
  vec4 ? launch(MoeRouterLogitsKernel<true>) : launch(MoeRouterLogitsKernel<false>);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("MoeRouterLogitsKernel");
  return absl::OkStatus();
}

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

namespace {
__global__ void MoeCountTouchedKernel(const int32_t* __restrict__ offsets, int begin, int n,
                                      int32_t* __restrict__ count) {
  int mine = 0;
  for (int e = threadIdx.x; e < n; e += blockDim.x) {
    mine += offsets[begin + e + 1] > offsets[begin + e] ? 1 : 0;
  }
  for (int d = 16; d > 0; d >>= 1) mine += __shfl_xor_sync(0xffffffffu, mine, d);
  if ((threadIdx.x & 31) == 0 && mine > 0) atomicAdd(count, mine);
}
}  // namespace

absl::Status MoeCountTouchedCuda(const MoeCountTouchedParams& p) {
  if (p.offsets == nullptr || p.count == nullptr || p.begin < 0 || p.n < 0) {
    return absl::InvalidArgumentError("moe count touched: bad arguments");
  }
  if (p.n == 0) return absl::OkStatus();
  MoeCountTouchedKernel<<<1, 256, 0, static_cast<cudaStream_t>(p.stream)>>>(p.offsets, p.begin, p.n,
                                                                            p.count);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("MoeCountTouchedKernel");
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
  if (!p.workspace) return absl::InvalidArgumentError("workspace must be set");
  // Runs for rows = 0 too: the offsets are then all 0.
  const int chunks = static_cast<int>((n + kPermuteChunk - 1) / kPermuteChunk);
  const auto st = static_cast<cudaStream_t>(p.stream);
  const size_t smem = (E + 1) * sizeof(int32_t);
  if (chunks > 0) {
    MoePermuteCountKernel<<<chunks, kPermuteChunk, smem, st>>>(p.experts, static_cast<int>(n), E,
                                                               p.workspace);
    VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("MoePermuteCountKernel");
  }
  MoePermuteScanKernel<<<1, kPermuteThreads, smem, st>>>(chunks, E, p.workspace, p.offsets);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("MoePermuteScanKernel");
  if (chunks > 0) {
    MoePermutePlaceKernel<<<chunks, kPermuteChunk, smem, st>>>(
        p.experts, static_cast<int>(n), E, K, p.workspace, p.perm_rows, p.pair_pos);
    VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("MoePermutePlaceKernel");
  }
  return absl::OkStatus();
}

int64_t MoePermuteWorkspaceInts(int64_t pairs, int num_experts) {
  return std::max<int64_t>((pairs + kPermuteChunk - 1) / kPermuteChunk, 1) * num_experts;
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
      reinterpret_cast<__nv_bfloat16*>(p.out), p.row_begin, p.row_end);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("MoeGatherKernel");
  return absl::OkStatus();
}

absl::Status MoeGatherQuantFp8Cuda(const MoeGatherQuantFp8Params& p) {
  if (p.n < 0 || p.cols <= 0 || p.cols % 128 != 0 || p.ldx < p.cols) {
    return absl::InvalidArgumentError(
        absl::StrCat("fp8 gather: n >= 0, cols a positive multiple of 128 and ldx >= cols "
                     "needed (n=",
                     p.n, " cols=", p.cols, " ldx=", p.ldx, ")"));
  }
  if (p.scale_ld_rows != 0 && p.scale_ld_rows < p.n) {
    return absl::InvalidArgumentError(
        absl::StrCat("fp8 gather: scale_ld_rows ", p.scale_ld_rows, " < n ", p.n));
  }
  if (p.n == 0) return absl::OkStatus();
  if (!p.x || !p.out || !p.out_scale) {
    return absl::InvalidArgumentError("fp8 gather: x, out, out_scale must be set");
  }
  const int64_t threads = p.n * (p.cols / 128) * 32;
  QuantFp8Kernel<false>
      <<<GridFor(threads, 256, INT64_MAX), 256, 0, static_cast<cudaStream_t>(p.stream)>>>(
          p.n, p.cols, reinterpret_cast<const __nv_bfloat16*>(p.x), p.ldx, p.perm_rows, nullptr, 0,
          0, reinterpret_cast<__nv_fp8_storage_t*>(p.out), p.out_scale, p.scale_ld_rows,
          p.row_begin, p.row_end);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("QuantFp8Kernel<gather>");
  return absl::OkStatus();
}

absl::Status SwiGluQuantFp8Cuda(const SwiGluQuantFp8Params& p) {
  if (p.rows < 0 || p.cols <= 0 || p.cols % 128 != 0 || p.up_offset < p.cols ||
      p.ld_in < p.up_offset + p.cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp8 swiglu: rows >= 0, cols a positive multiple of 128, up_offset >= cols and ld_in >= "
        "up_offset + cols needed (rows=",
        p.rows, " cols=", p.cols, ")"));
  }
  if (p.scale_ld_rows != 0 && p.scale_ld_rows < p.rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("fp8 swiglu: scale_ld_rows ", p.scale_ld_rows, " < rows ", p.rows));
  }
  if (p.rows == 0) return absl::OkStatus();
  if (!p.gate_up || !p.out || !p.out_scale) {
    return absl::InvalidArgumentError("fp8 swiglu: gate_up, out, out_scale must be set");
  }
  const int64_t threads = p.rows * (p.cols / 128) * 32;
  QuantFp8Kernel<true>
      <<<GridFor(threads, 256, INT64_MAX), 256, 0, static_cast<cudaStream_t>(p.stream)>>>(
          p.rows, p.cols, nullptr, 0, nullptr, p.gate_up, p.ld_in, p.up_offset,
          reinterpret_cast<__nv_fp8_storage_t*>(p.out), p.out_scale, p.scale_ld_rows, p.row_begin,
          p.row_end);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("QuantFp8Kernel<swiglu>");
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
                     static_cast<cudaStream_t>(p.stream)>>>(
      p.experts, p.weights, p.pair_pos, p.y, p.shared, p.top_k, p.cols, p.out, p.ld_out,
      p.accumulate, p.expert_begin, p.expert_end);
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

absl::Status FloatToBf16Cuda(const float* in, bf16_bits* out, int64_t n, void* stream) {
  if (n < 0) return absl::InvalidArgumentError("n < 0");
  if (n == 0) return absl::OkStatus();
  if (!in || !out) return absl::InvalidArgumentError("in and out must be set");
  NarrowKernel<<<GridFor(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      in, reinterpret_cast<__nv_bfloat16*>(out), n);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("NarrowKernel");
  return absl::OkStatus();
}

namespace {
__global__ void SingleGroupOffsetsKernel(int32_t* offsets, int32_t rows) {
  offsets[0] = 0;
  offsets[1] = rows;
}
}  // namespace

absl::Status SingleGroupOffsetsCuda(int32_t* offsets, int64_t rows, void* stream) {
  if (offsets == nullptr || rows < 0 || rows > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "single-group offsets: offsets set and 0 <= rows < 2^31 needed (rows=", rows, ")"));
  }
  SingleGroupOffsetsKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(
      offsets, static_cast<int32_t>(rows));
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("SingleGroupOffsetsKernel");
  return absl::OkStatus();
}

}  // namespace verifyd::kernels::cuda
