// The split combine of the verify attention: merges the fp32 partial outputs + log2-LSE of
// the splits of each split row tile (VerifyCombineItem) into out / lse. Shared by every kernel
// variant (they all write the same partial layout). Launched after the attention kernel with
// programmatic dependent launch on sm_90+. Two kernels: the batch-adaptive plans' (weights
// from the global max, split groups summed in parallel) and the positional plans' left fold
// (fold.cuh), which continues what the attention kernel folded already.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/verify_attention/combine.cuh"
#include "kernels/cuda/verify_attention/fold.cuh"
#include "kernels/cuda/verify_attention/plan.h"  // kMaxCombineSplits
#include "kernels/cuda/verify_attention/ptx.cuh"

namespace verifyd::kernels::cuda::detail {
namespace {

constexpr int kCombineThreads = 256;

// Grid (items, rows_per_cta, 512 / cols_per_cta): one CTA per (row, column chunk). With few
// rows (one long request) the chunks are 64 columns so the rows still spread over many SMs
// (256 threads = 16 split groups x 16 column groups of 4); with many rows, whole rows (2 x
// 128). Split weights go to shared memory first, each split group sums every
// split_groups-th split, then the groups meet in shared memory.
__global__ void __launch_bounds__(kCombineThreads)
    VerifyCombineKernel(const VerifyCombineArgs args) {
  const int col_groups = args.cols_per_cta / 4;           // 16 or 128
  const int split_groups = kCombineThreads / col_groups;  // 16 or 2
  __shared__ float s_w[kMaxCombineSplits];
  __shared__ float s_red[kCombineThreads / 32];
  __shared__ float4 s_acc[kCombineThreads];  // [split group][column group]
  const VerifyCombineItem item = args.items[blockIdx.x];
  const int r = blockIdx.y;
  if (r >= item.num_rows) return;
  const int stride = args.rows_per_cta;
  const int ns = item.num_splits;
  const float* lse_base = args.part_lse + item.partial_row0 + r;
  const int tid = threadIdx.x;
  const int sg = tid / col_groups;
  const int cg = tid % col_groups;
  const int col = blockIdx.z * args.cols_per_cta + cg * 4;
  const float* o_base = args.part_o + static_cast<int64_t>(item.partial_row0 + r) * kVDim + col;
  // The items come from the plan (uploaded before both kernels); the partials from the
  // attention kernel: wait for it (PDL) only now.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  GridDepWait();
#endif
  // Every load is issued before anything waits on one (a single memory round trip for up to
  // kLsePerThread * 256 splits and kOPerThread split groups' worth of partial outputs; the
  // loops after them cover the rest): the LSE of splits tid, tid + 256, ... and this
  // thread's four columns of splits sg, sg + split_groups, ...
  constexpr int kLsePerThread = 4;
  constexpr int kOPerThread = 8;
  float lse[kLsePerThread];
#pragma unroll
  for (int k = 0; k < kLsePerThread; ++k) {
    const int s = tid + k * kCombineThreads;
    lse[k] = s < ns ? lse_base[s * stride] : -INFINITY;
  }
  float4 o_pre[kOPerThread];
#pragma unroll
  for (int k = 0; k < kOPerThread; ++k) {
    const int s = sg + k * split_groups;
    o_pre[k] =
        s < ns ? *reinterpret_cast<const float4*>(o_base + static_cast<int64_t>(s) * stride * kVDim)
               : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  float mx = -INFINITY;
#pragma unroll
  for (int k = 0; k < kLsePerThread; ++k) mx = fmaxf(mx, lse[k]);
  for (int s = tid + kLsePerThread * kCombineThreads; s < ns; s += kCombineThreads) {
    mx = fmaxf(mx, lse_base[s * stride]);
  }
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  if ((tid & 31) == 0) s_red[tid >> 5] = mx;
  __syncthreads();
  mx = s_red[0];
  for (int i = 1; i < kCombineThreads / 32; ++i) mx = fmaxf(mx, s_red[i]);
  __syncthreads();
  float wsum = 0.f;
#pragma unroll
  for (int k = 0; k < kLsePerThread; ++k) {
    const int s = tid + k * kCombineThreads;
    if (s < ns) {
      const float w = mx == -INFINITY ? 0.f : exp2f(lse[k] - mx);
      s_w[s] = w;
      wsum += w;
    }
  }
  for (int s = tid + kLsePerThread * kCombineThreads; s < ns; s += kCombineThreads) {
    const float w = mx == -INFINITY ? 0.f : exp2f(lse_base[s * stride] - mx);
    s_w[s] = w;
    wsum += w;
  }
  for (int off = 16; off > 0; off >>= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, off);
  if ((tid & 31) == 0) s_red[tid >> 5] = wsum;
  __syncthreads();
  float sum_w = 0.f;
  for (int i = 0; i < kCombineThreads / 32; ++i) sum_w += s_red[i];

  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  auto add = [&](float w, const float4& o) {
    if (w != 0.f) {  // splits that carry no weight are skipped
      acc.x += w * o.x;
      acc.y += w * o.y;
      acc.z += w * o.z;
      acc.w += w * o.w;
    }
  };
#pragma unroll
  for (int k = 0; k < kOPerThread; ++k) {
    const int s = sg + k * split_groups;
    if (s < ns) add(s_w[s], o_pre[k]);
  }
#pragma unroll 4
  for (int s = sg + kOPerThread * split_groups; s < ns; s += split_groups) {
    add(s_w[s],
        *reinterpret_cast<const float4*>(o_base + static_cast<int64_t>(s) * stride * kVDim));
  }
  s_acc[tid] = acc;
  __syncthreads();
  if (sg != 0) return;
  acc = s_acc[cg];
  for (int g = 1; g < split_groups; ++g) {
    const float4 o = s_acc[g * col_groups + cg];
    acc.x += o.x;
    acc.y += o.y;
    acc.z += o.z;
    acc.w += o.w;
  }
  const int64_t out_row = static_cast<int64_t>(item.out_row0) + r;
  const float inv = sum_w > 0.f ? 1.f / sum_w : 0.f;
  __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(args.out + out_row * kVDim + col);
  dst[0] = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
  dst[1] = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
  if (blockIdx.z == 0 && tid == 0 && args.lse != nullptr) {
    args.lse[out_row] = sum_w > 0.f ? (mx + log2f(sum_w)) * 0.69314718055994531f : -INFINITY;
  }
}

// Positional plans: one CTA per (item, row), 128 threads of 4 columns each; the row's splits
// folded left to right (fold.cuh) from split 0's partial row, which already holds splits
// [0, folded_splits) when the attention kernel folded a split group. The loads do not depend
// on the fold, so the unrolled loop keeps several in flight.
constexpr int kFoldThreads = kVDim / 4;

__global__ void __launch_bounds__(kFoldThreads)
    VerifyFoldCombineKernel(const VerifyCombineArgs args) {
  const VerifyCombineItem item = args.items[blockIdx.x];
  const int r = blockIdx.y;
  if (r >= item.num_rows) return;
  const int64_t stride = args.rows_per_cta;
  const int col = threadIdx.x * 4;
  const float* lse_base = args.part_lse + item.partial_row0 + r;
  const float* o_base = args.part_o + static_cast<int64_t>(item.partial_row0 + r) * kVDim + col;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  GridDepWait();
#endif
  float a = lse_base[0];
  float4 f = *reinterpret_cast<const float4*>(o_base);
#pragma unroll 4
  for (int s = max(1, item.folded_splits); s < item.num_splits; ++s) {
    const float b = lse_base[s * stride];
    const float4 o = *reinterpret_cast<const float4*>(o_base + s * stride * kVDim);
    const FoldWeights w = FoldWeightsOf(a, b);
    f.x = FoldValue(w, f.x, o.x);
    f.y = FoldValue(w, f.y, o.y);
    f.z = FoldValue(w, f.z, o.z);
    f.w = FoldValue(w, f.w, o.w);
    a = w.lse;
  }
  const int64_t out_row = static_cast<int64_t>(item.out_row0) + r;
  __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(args.out + out_row * kVDim + col);
  dst[0] = __floats2bfloat162_rn(f.x, f.y);
  dst[1] = __floats2bfloat162_rn(f.z, f.w);
  if (threadIdx.x == 0 && args.lse != nullptr) {
    args.lse[out_row] = a == -INFINITY ? -INFINITY : a * 0.69314718055994531f;
  }
}

}  // namespace

absl::Status LaunchCombine(const VerifyCombineArgs& args, int num_items, int num_sms,
                           bool dependent_launch, void* stream, bool fold) {
  VerifyCombineArgs c = args;
  // Few rows to merge: 64-column chunks so they spread over the SMs; else whole rows. (A
  // fixed layout of this kernel for positional plans, 2 split groups, was their combine
  // before the fold; the 64-column layout had launched 8 CTAs of 16 mostly idle split groups
  // per row: for a batch of trees at 64 heads, 266k CTAs for 520 nodes, docs/PERF.md.)
  const int64_t rows_to_merge = static_cast<int64_t>(num_items) * c.rows_per_cta;
  c.cols_per_cta = rows_to_merge < 4 * static_cast<int64_t>(num_sms) ? 64 : kVDim;
  cudaLaunchConfig_t lc{};
  lc.gridDim = dim3(static_cast<unsigned>(num_items), static_cast<unsigned>(c.rows_per_cta),
                    fold ? 1u : static_cast<unsigned>(kVDim / c.cols_per_cta));
  lc.blockDim = dim3(fold ? kFoldThreads : kCombineThreads);
  lc.dynamicSmemBytes = 0;
  lc.stream = static_cast<cudaStream_t>(stream);
  // Programmatic dependent launch (sm_90+): the combine grid is set up while the attention
  // kernel drains; GridDepWait() in the kernel orders it after the attention writes.
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  lc.attrs = attr;
  lc.numAttrs = dependent_launch ? 1 : 0;
  VERIFYD_CUDA_RETURN_IF_ERROR(
      cudaLaunchKernelEx(&lc, fold ? VerifyFoldCombineKernel : VerifyCombineKernel, c));
  return absl::OkStatus();
}

}  // namespace verifyd::kernels::cuda::detail
