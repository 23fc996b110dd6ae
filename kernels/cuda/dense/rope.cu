// Rope table, query rope and latent KV write kernels (see rope.h).
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dense/rope.h"
#include "kernels/kv_fp8.h"

namespace verifyd::kernels::cuda {
namespace {

using internal::BlockSum;
using internal::GridFor;

// cos/sin of angle = float(pos) * inv_freq[i] (float product), evaluated in double, rounded
// to float and multiplied by the attention factor (exact for 1), as the reference.
__global__ void RopeTableKernel(const int32_t* __restrict__ positions,
                                const float* __restrict__ inv_freq, float factor, int rows,
                                int half, float* __restrict__ cos_t, float* __restrict__ sin_t) {
  const int64_t n = static_cast<int64_t>(rows) * half;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = idx / half;
    const int i = static_cast<int>(idx % half);
    const float angle = __fmul_rn(static_cast<float>(positions[r]), inv_freq[i]);
    cos_t[idx] = __fmul_rn(static_cast<float>(cos(static_cast<double>(angle))), factor);
    sin_t[idx] = __fmul_rn(static_cast<float>(sin(static_cast<double>(angle))), factor);
  }
}

// a, b: the de-interleaved pair (x[2i], x[2i+1]); out[i] = a c - b s, out[half+i] = b c + a s.
__device__ __forceinline__ void Rotate(float a, float b, float c, float s, float* lo, float* hi) {
  *lo = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  *hi = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

__global__ void QRopeKernel(const __nv_bfloat16* __restrict__ in, int64_t in_hs, int64_t in_off,
                            __nv_bfloat16* __restrict__ out, int64_t out_hs, int64_t out_off,
                            const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                            int rows, int heads, int half) {
  const int64_t n = static_cast<int64_t>(rows) * heads * half;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int i = static_cast<int>(idx % half);
    const int64_t rh = idx / half;  // r * heads + h
    const int64_t r = rh / heads;
    const __nv_bfloat16* src = in + rh * in_hs + in_off;
    __nv_bfloat16* dst = out + rh * out_hs + out_off;
    float lo, hi;
    Rotate(__bfloat162float(src[2 * i]), __bfloat162float(src[2 * i + 1]), cos_t[r * half + i],
           sin_t[r * half + i], &lo, &hi);
    dst[i] = __float2bfloat16_rn(lo);
    dst[half + i] = __float2bfloat16_rn(hi);
  }
}

constexpr int kLatentThreads = 256;

// The FP8 format's c_kv part (kernels/kv_fp8.h) of one row from its kv_lora float values `y`
// (shared memory): a warp per group computes the group's amax and scale (stored after the
// codes), then every thread encodes columns; `sc` is shared scratch of one float per group.
// Called by every thread of the block.
__device__ void EncodeKvFp8Groups(const float* y, int kv_lora, unsigned char* dst, float* sc) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int groups = (kv_lora + kKvFp8Group - 1) / kKvFp8Group;
  for (int g = warp; g < groups; g += blockDim.x / 32) {
    const int g1 = min((g + 1) * kKvFp8Group, kv_lora);
    float amax = 0.f;
    for (int j = g * kKvFp8Group + lane; j < g1; j += 32) amax = fmaxf(amax, fabsf(y[j]));
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float s = __fdiv_rn(fmaxf(amax, kKvFp8MinAmax), kE4m3Max);
    if (lane == 0) {
      sc[g] = s;
      reinterpret_cast<float*>(dst + KvFp8ScaleOffset(kv_lora))[g] = s;
    }
  }
  __syncthreads();
  for (int j = threadIdx.x; j < kv_lora; j += blockDim.x) {
    dst[j] = __nv_cvt_float_to_fp8(__fdiv_rn(y[j], sc[j / kKvFp8Group]), __NV_SATFINITE, __NV_E4M3);
  }
}

// One CTA per row: RMSNorm of the kv_lora columns, rope of the next rope_dim, store bf16 (or
// the FP8 format: y holds the normed values, sc the group scales; dynamic shared memory
// kv_lora floats + one per group).
template <bool kFp8>
__global__ void LatentKvWriteKernel(const float* __restrict__ kva, int64_t ld_kva,
                                    const __nv_bfloat16* __restrict__ w, float eps, int kv_lora,
                                    int half, const float* __restrict__ cos_t,
                                    const float* __restrict__ sin_t,
                                    const int32_t* __restrict__ slots, void* __restrict__ cache) {
  __shared__ float scratch[32];
  extern __shared__ float y[];
  const int64_t r = blockIdx.x;
  const float* x = kva + r * ld_kva;
  float ss = 0.f;
  for (int j = threadIdx.x; j < kv_lora; j += blockDim.x) ss = __fmaf_rn(x[j], x[j], ss);
  ss = BlockSum(ss, scratch);
  const float inv_rms = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)kv_lora), eps)));
  const int64_t width = kv_lora + 2 * half;
  __nv_bfloat16* rope_dst;
  if constexpr (kFp8) {
    unsigned char* dst =
        static_cast<unsigned char*>(cache) +
        static_cast<int64_t>(slots[r]) * KvFp8RowBytes(kv_lora, 2 * half, kKvFp8Group);
    for (int j = threadIdx.x; j < kv_lora; j += blockDim.x) {
      y[j] = __fmul_rn(__fmul_rn(x[j], inv_rms), __bfloat162float(w[j]));
    }
    __syncthreads();
    EncodeKvFp8Groups(y, kv_lora, dst, y + kv_lora);
    rope_dst = reinterpret_cast<__nv_bfloat16*>(dst + KvFp8RopeOffset(kv_lora, kKvFp8Group));
  } else {
    __nv_bfloat16* dst =
        static_cast<__nv_bfloat16*>(cache) + static_cast<int64_t>(slots[r]) * width;
    for (int j = threadIdx.x; j < kv_lora; j += blockDim.x) {
      dst[j] = __float2bfloat16_rn(__fmul_rn(__fmul_rn(x[j], inv_rms), __bfloat162float(w[j])));
    }
    rope_dst = dst + kv_lora;
  }
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float lo, hi;
    Rotate(x[kv_lora + 2 * i], x[kv_lora + 2 * i + 1], cos_t[r * half + i], sin_t[r * half + i],
           &lo, &hi);
    rope_dst[i] = __float2bfloat16_rn(lo);
    rope_dst[half + i] = __float2bfloat16_rn(hi);
  }
}

// One CTA per row: bf16 row -> the FP8 format (y, sc as above).
__global__ void KvFp8EncodeRowsKernel(const __nv_bfloat16* __restrict__ in, int64_t ld_in,
                                      int kv_lora, int rope, unsigned char* __restrict__ out) {
  extern __shared__ float y[];
  const int64_t r = blockIdx.x;
  const __nv_bfloat16* x = in + r * ld_in;
  unsigned char* dst = out + r * KvFp8RowBytes(kv_lora, rope, kKvFp8Group);
  for (int j = threadIdx.x; j < kv_lora; j += blockDim.x) y[j] = __bfloat162float(x[j]);
  __syncthreads();
  EncodeKvFp8Groups(y, kv_lora, dst, y + kv_lora);
  auto* rope_dst = reinterpret_cast<__nv_bfloat16*>(dst + KvFp8RopeOffset(kv_lora, kKvFp8Group));
  for (int j = threadIdx.x; j < rope; j += blockDim.x) rope_dst[j] = x[kv_lora + j];
}

// Dynamic shared memory of the FP8 kernels: kv_lora values and one scale per group.
size_t Fp8SmemBytes(int kv_lora) {
  return sizeof(float) * (kv_lora + (kv_lora + kKvFp8Group - 1) / kKvFp8Group);
}

// The FP8 kernels store each group's scale as an aligned float: kv_lora % 4 == 0, and the
// dynamic shared memory (kv_lora + groups floats) stays within the default 48 KB.
absl::Status CheckFp8Row(int kv_lora, const void* cache) {
  if (kv_lora % 4 != 0 || kv_lora > 8192) {
    return absl::InvalidArgumentError(
        absl::StrCat("FP8 latent cache: kv_lora ", kv_lora, " must be a multiple of 4, <= 8192"));
  }
  if (reinterpret_cast<uintptr_t>(cache) % 4 != 0) {
    return absl::InvalidArgumentError("FP8 latent cache: the cache must be 4-byte aligned");
  }
  return absl::OkStatus();
}

absl::Status CheckRope(int rope_dim) {
  if (rope_dim <= 0 || rope_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope_dim must be even and > 0, got ", rope_dim));
  }
  return absl::OkStatus();
}

// A latent row (LatentKvWriteCuda's input, KvFp8EncodeRowsCuda's): kv_lora > 0 values, then
// the rope columns (CheckRope), in a row of stride `ld` (named `ld_name` in the message).
absl::Status CheckLatentRow(int kv_lora, int rope_dim, int64_t ld, const char* ld_name) {
  VERIFYD_RETURN_IF_ERROR(CheckRope(rope_dim));
  if (kv_lora <= 0) return absl::InvalidArgumentError("kv_lora must be > 0");
  if (ld < kv_lora + rope_dim)
    return absl::InvalidArgumentError(absl::StrCat(ld_name, " too small"));
  return absl::OkStatus();
}

}  // namespace

std::vector<float> RopeInvFreq(int rope_dim, double theta) {
  std::vector<float> f(static_cast<size_t>(rope_dim / 2));
  for (int i = 0; i < rope_dim / 2; ++i) {
    f[i] = static_cast<float>(1.0 / std::pow(theta, static_cast<double>(2 * i) / rope_dim));
  }
  return f;
}

absl::Status RopeTableCuda(const RopeTableParams& p) {
  VERIFYD_RETURN_IF_ERROR(CheckRope(p.rope_dim));
  if (p.rows < 0) return absl::InvalidArgumentError("rows < 0");
  if (p.rows == 0) return absl::OkStatus();
  if (!p.positions || !p.inv_freq || !p.cos_table || !p.sin_table) {
    return absl::InvalidArgumentError("positions, inv_freq, cos_table, sin_table must be set");
  }
  if (!(p.attention_factor > 0.0f) || !std::isfinite(p.attention_factor)) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention_factor must be finite and > 0, got ", p.attention_factor));
  }
  const int half = p.rope_dim / 2;
  RopeTableKernel<<<GridFor(static_cast<int64_t>(p.rows) * half, 256), 256, 0,
                    static_cast<cudaStream_t>(p.stream)>>>(
      p.positions, p.inv_freq, p.attention_factor, p.rows, half, p.cos_table, p.sin_table);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("RopeTableKernel");
  return absl::OkStatus();
}

absl::Status QRopeCuda(const QRopeParams& p) {
  VERIFYD_RETURN_IF_ERROR(CheckRope(p.rope_dim));
  if (p.rows < 0 || p.heads <= 0) return absl::InvalidArgumentError("rows < 0 or heads <= 0");
  if (p.rows == 0) return absl::OkStatus();
  if (!p.in || !p.out || !p.cos_table || !p.sin_table) {
    return absl::InvalidArgumentError("in, out, cos_table, sin_table must be set");
  }
  if (p.in_offset + p.rope_dim > p.in_head_stride) {
    return absl::InvalidArgumentError("in_offset + rope_dim exceeds in_head_stride");
  }
  if (p.out_offset + p.rope_dim > p.out_head_stride) {
    return absl::InvalidArgumentError("out_offset + rope_dim exceeds out_head_stride");
  }
  const int half = p.rope_dim / 2;
  QRopeKernel<<<GridFor(static_cast<int64_t>(p.rows) * p.heads * half, 256), 256, 0,
                static_cast<cudaStream_t>(p.stream)>>>(
      reinterpret_cast<const __nv_bfloat16*>(p.in), p.in_head_stride, p.in_offset,
      reinterpret_cast<__nv_bfloat16*>(p.out), p.out_head_stride, p.out_offset, p.cos_table,
      p.sin_table, p.rows, p.heads, half);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("QRopeKernel");
  return absl::OkStatus();
}

absl::Status LatentKvWriteCuda(const LatentKvWriteParams& p) {
  VERIFYD_RETURN_IF_ERROR(CheckLatentRow(p.kv_lora, p.rope_dim, p.ld_kva, "ld_kva"));
  if (p.rows < 0) return absl::InvalidArgumentError("rows < 0");
  if (p.rows == 0) return absl::OkStatus();
  if (!p.kva || !p.kv_norm_weight || !p.cos_table || !p.sin_table || !p.slots || !p.cache) {
    return absl::InvalidArgumentError("kva, kv_norm_weight, tables, slots, cache must be set");
  }
  const auto* w = reinterpret_cast<const __nv_bfloat16*>(p.kv_norm_weight);
  const cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  if (p.fp8) {
    VERIFYD_RETURN_IF_ERROR(CheckFp8Row(p.kv_lora, p.cache));
    LatentKvWriteKernel<true>
        <<<static_cast<unsigned>(p.rows), kLatentThreads, Fp8SmemBytes(p.kv_lora), stream>>>(
            p.kva, p.ld_kva, w, p.eps, p.kv_lora, p.rope_dim / 2, p.cos_table, p.sin_table, p.slots,
            p.cache);
  } else {
    LatentKvWriteKernel<false><<<static_cast<unsigned>(p.rows), kLatentThreads, 0, stream>>>(
        p.kva, p.ld_kva, w, p.eps, p.kv_lora, p.rope_dim / 2, p.cos_table, p.sin_table, p.slots,
        p.cache);
  }
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("LatentKvWriteKernel");
  return absl::OkStatus();
}

absl::Status KvFp8EncodeRowsCuda(const KvFp8EncodeRowsParams& p) {
  VERIFYD_RETURN_IF_ERROR(CheckLatentRow(p.kv_lora, p.rope_dim, p.ld_in, "ld_in"));
  if (p.rows < 0 || p.rows > INT32_MAX) return absl::InvalidArgumentError("rows out of range");
  if (p.rows == 0) return absl::OkStatus();
  if (!p.in || !p.out) return absl::InvalidArgumentError("in, out must be set");
  VERIFYD_RETURN_IF_ERROR(CheckFp8Row(p.kv_lora, p.out));
  KvFp8EncodeRowsKernel<<<static_cast<unsigned>(p.rows), kLatentThreads, Fp8SmemBytes(p.kv_lora),
                          static_cast<cudaStream_t>(p.stream)>>>(
      reinterpret_cast<const __nv_bfloat16*>(p.in), p.ld_in, p.kv_lora, p.rope_dim,
      static_cast<unsigned char*>(p.out));
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR("KvFp8EncodeRowsKernel");
  return absl::OkStatus();
}

}  // namespace verifyd::kernels::cuda
