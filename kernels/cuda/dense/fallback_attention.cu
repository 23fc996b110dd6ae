// The fallback verify attention (see fallback_attention.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dense/fallback_attention.h"
#include "kernels/kv_fp8.h"

namespace verifyd::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxQk = 1024;
constexpr int kMaxVPerLane = 16;  // v_dim <= 512

// One CTA per (row, head). Warp w handles visible keys w, w + kWarps, ...: the 32 lanes split the
// dot product over qk_dim and the value columns (lane owns columns lane + 32 i); each warp
// keeps its own running max / sum / accumulator, merged at the end (log-sum-exp merge).
// Key element i of a cache row: bf16, or (kFp8) the FP8 format's dequantized value.
template <bool kFp8>
__device__ __forceinline__ float KeyAt(const unsigned char* row, int i, int kv_lora) {
  if constexpr (kFp8) {
    if (i < kv_lora) {
      const float s =
          reinterpret_cast<const float*>(row + KvFp8ScaleOffset(kv_lora))[i / kKvFp8Group];
      const __half_raw h = __nv_cvt_fp8_to_halfraw(row[i], __NV_E4M3);
      return __half2float(__half(h)) * s;
    }
    return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(
        row + KvFp8RopeOffset(kv_lora, kKvFp8Group))[i - kv_lora]);
  } else {
    return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(row)[i]);
  }
}

template <bool kFp8>
__global__ void __launch_bounds__(kWarps * 32)
    FallbackAttentionKernel(const __nv_bfloat16* __restrict__ q,
                            const unsigned char* __restrict__ kv, int64_t row_bytes,
                            const int32_t* __restrict__ q_indptr,
                            const int32_t* __restrict__ kv_indptr,
                            const int32_t* __restrict__ kv_indices,
                            const uint64_t* __restrict__ mask, int mask_words, int batch, int heads,
                            int qk_dim, int v_dim, float scale, __nv_bfloat16* __restrict__ out) {
  __shared__ float qs[kMaxQk];
  __shared__ float wm[kWarps], wl[kWarps];
  __shared__ float wacc[kWarps][kMaxVPerLane * 32];
  const int r = blockIdx.x, h = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Request of row r: the last b with q_indptr[b] <= r.
  int lo = 0, hi = batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (q_indptr[mid] <= r)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int b = lo;
  const int n = q_indptr[b + 1] - q_indptr[b];
  const int kv0 = kv_indptr[b], L = kv_indptr[b + 1] - kv0, P = L - n;
  const __nv_bfloat16* qr = q + (static_cast<int64_t>(r) * heads + h) * qk_dim;
  for (int i = threadIdx.x; i < qk_dim; i += blockDim.x) qs[i] = __bfloat162float(qr[i]);
  __syncthreads();
  const uint64_t* mrow = mask + static_cast<int64_t>(r) * mask_words;
  float m = -INFINITY, l = 0.f;
  float acc[kMaxVPerLane];
#pragma unroll
  for (int i = 0; i < kMaxVPerLane; ++i) acc[i] = 0.f;
  const int vper = (v_dim + 31) / 32;
  auto attend = [&](int j) {
    const unsigned char* k = kv + static_cast<int64_t>(kv_indices[kv0 + j]) * row_bytes;
    float s = 0.f;
    for (int i = lane; i < qk_dim; i += 32) s += qs[i] * KeyAt<kFp8>(k, i, v_dim);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    s *= scale;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);  // exp(-inf) = 0 on the first key
    const float p = expf(s - m_new);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < kMaxVPerLane; ++i) {
      if (i < vper) {
        const int c = lane + 32 * i;
        const float v = c < v_dim ? KeyAt<kFp8>(k, c, v_dim) : 0.f;
        acc[i] = acc[i] * corr + p * v;
      }
    }
    m = m_new;
  };
  // The row's visible keys in position order (context, then its visible tail rows in index
  // order: ancestors, then itself); visible key number t goes to warp t % kWarps. The row's
  // arithmetic is then a function of its visible keys alone: a draft-tree node computes what
  // its token computes decoded as a chain (masked siblings shift no key to another warp).
  for (int j = warp; j < P; j += kWarps) attend(j);
  int t = P;
  for (int tj = 0; tj < n; ++tj) {
    if (((mrow[tj / 64] >> (tj % 64)) & 1ull) == 0) continue;
    if (t % kWarps == warp) attend(P + tj);
    ++t;
  }
  if (lane == 0) {
    wm[warp] = m;
    wl[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kMaxVPerLane; ++i) {
    if (i < vper) wacc[warp][lane + 32 * i] = acc[i];
  }
  __syncthreads();
  float gm = -INFINITY;
  for (int w = 0; w < kWarps; ++w) gm = fmaxf(gm, wm[w]);
  float gl = 0.f;
  for (int w = 0; w < kWarps; ++w) {
    if (wm[w] != -INFINITY) gl += wl[w] * expf(wm[w] - gm);
  }
  __nv_bfloat16* o = out + (static_cast<int64_t>(r) * heads + h) * v_dim;
  for (int c = threadIdx.x; c < v_dim; c += blockDim.x) {
    float a = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      if (wm[w] != -INFINITY) a += wacc[w][c] * expf(wm[w] - gm);
    }
    o[c] = __float2bfloat16_rn(gl > 0.f ? a / gl : 0.f);  // a row that sees nothing: 0
  }
}

}  // namespace

absl::Status FallbackAttentionCuda(const FallbackAttentionParams& p) {
  if (p.qk_dim <= 0 || p.qk_dim > kMaxQk) {
    return absl::UnimplementedError(
        absl::StrCat("fallback verify attention: qk_dim ", p.qk_dim, " > ", kMaxQk));
  }
  if (p.v_dim <= 0 || p.v_dim > 32 * kMaxVPerLane || p.v_dim > p.qk_dim) {
    return absl::UnimplementedError(absl::StrCat("fallback verify attention: v_dim ", p.v_dim));
  }
  if (p.batch < 0 || p.total_rows < 0 || p.num_heads <= 0) {
    return absl::InvalidArgumentError("fallback verify attention: bad batch/total_rows/num_heads");
  }
  if (p.total_rows == 0 || p.batch == 0) return absl::OkStatus();
  if (p.kv_fp8 && (p.v_dim % 4 != 0 || reinterpret_cast<uintptr_t>(p.kv) % 4 != 0)) {
    return absl::InvalidArgumentError(
        "fallback verify attention: an FP8 cache needs v_dim % 4 == 0 and 4-byte alignment");
  }
  dim3 grid(static_cast<unsigned>(p.total_rows), static_cast<unsigned>(p.num_heads));
  const auto* q = static_cast<const __nv_bfloat16*>(p.q);
  const auto* kv = static_cast<const unsigned char*>(p.kv);
  auto* out = static_cast<__nv_bfloat16*>(p.out);
  const cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  if (p.kv_fp8) {
    FallbackAttentionKernel<true><<<grid, kWarps * 32, 0, stream>>>(
        q, kv, KvFp8RowBytes(p.v_dim, p.qk_dim - p.v_dim, kKvFp8Group), p.q_indptr, p.kv_indptr,
        p.kv_indices, p.tree_mask, p.mask_words, p.batch, p.num_heads, p.qk_dim, p.v_dim,
        p.softmax_scale, out);
  } else {
    FallbackAttentionKernel<false><<<grid, kWarps * 32, 0, stream>>>(
        q, kv, int64_t{p.qk_dim} * 2, p.q_indptr, p.kv_indptr, p.kv_indices, p.tree_mask,
        p.mask_words, p.batch, p.num_heads, p.qk_dim, p.v_dim, p.softmax_scale, out);
  }
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("FallbackAttentionKernel");
  return absl::OkStatus();
}

}  // namespace verifyd::kernels::cuda
