// The FP8-cache instance of the seesaw verify attention kernel (SeesawFp8S64; the kernel and
// its schedule: seesaw.cu): its producer warpgroup's role (SeesawFp8Producer: Q landed and
// scaled to f16, the stored rows' codes, scales and rope landed) and the math warpgroups'
// conversion of a landed tile to f16 (ConvertTileFp8), with their element-wise helpers.
// Internal CUDA header, included by seesaw.cu only (through seesaw_roles.cuh): the device code
// exists only in the sm_90a build (VERIFYD_SEESAW_BODY) and has internal linkage.
// Thread-safety: n/a (device code).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/verify_attention/kernel_args.cuh"
#include "kernels/cuda/verify_attention/ptx.cuh"
#include "kernels/cuda/verify_attention/seesaw_layout.h"
#include "kernels/cuda/verify_attention/seesaw_tiles.cuh"

namespace verifyd::kernels::cuda::detail {
namespace {
#ifdef VERIFYD_SEESAW_BODY

// ---- the FP8 variant (SeesawFp8S64): its producer and the math warpgroups' conversion -------
// The math warpgroups get the same tiles as in the bf16 kernel, with f16 latent columns:
//   Q: gathered as bf16 by the producer's cp.async, then converted in place by the lanes that
//      landed it: the 512 latent columns to f16 x 2^eq, the 64 rope columns to bf16 x 2^eq
//      (exact), with eq per row so that the row's largest latent value lands in [2^14, 2^15);
//      the row's factor softmax_scale * log2(e) * 2^-eq goes to q_row_factor.
//   KV tile t into buffer b: the producer (24 registers) lands the stored rows
//      (kernels/kv_fp8.h) by cp.async as soon as the math warpgroups released atoms 0-3
//      (empty_a; mid-pair for buffer 0): the codes in atoms 0-3 (row r's codes
//      128 k .. 128 k + 127 in atom k, row r, 16-byte chunks swizzled as the tiles are) and the
//      scales in scale_land[b] (full A: "codes landed"); once atoms 4-8 are free too
//      (empty_bc) the rope (stored bf16) straight into atom 8 (as in the bf16 kernel: full C).
//      The math warpgroup that computes the tile's Q K^T (WG b) converts the codes just before
//      (ConvertTileFp8; cvt.rn.f16x2.e4m3x2, exact; times f16(scale): one rounding of the
//      product): group B (columns 256..511: codes in atoms 2-3 -> atoms 4-7), then group A in
//      place (0..255: atoms 0-1 -> atoms 0-3). Both first wait for the release of atoms 4-8
//      of tile t - 2 (empty_bc: for WG1 that is its own four warps' last PV, as the warps of
//      a warpgroup are not in step); WG0's reads of atoms 0-3 ended before the codes could
//      land (empty_a). A proxy
//      fence and a named barrier of the warpgroup follow; the other warpgroup reads the tile's
//      V only after the P-ready barrier that follows its Q K^T. The converting warpgroup has
//      the registers (S and P are dead there, O is live); the producer converting alone took
//      ~5,000 cycles a tile (docs/KERNEL_NOTES.md). A scale outside [2^-14, 146] (its f16
//      subnormal, or a product past f16's range) takes the fp32 path: code x scale in fp32,
//      rounded once to f16, clamped to +-65504 (a latent value beyond f16's range saturates).

// 8 stored codes to 8 f16 of code x scale. (Converting half of the codes on the integer pipe
// instead, by byte permutes and adds, or all of them, was slower on the H200: docs/PERF.md.)
__device__ __forceinline__ uint4 CodesToF16x8(uint2 c, float scale) {
  uint32_t h[4];
  E4m3x4ToF16x2x2(c.x, h[0], h[1]);
  E4m3x4ToF16x2x2(c.y, h[2], h[3]);
  if (scale >= 6.103515625e-05f && scale <= 146.0f) {  // f16(scale) normal, |product| <= 65,408
    const __half2 s2 = __float2half2_rn(scale);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      __half2 v = __hmul2(*reinterpret_cast<const __half2*>(&h[k]), s2);
      h[k] = *reinterpret_cast<uint32_t*>(&v);
    }
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h[k]));
      __half2 v = __floats2half2_rn(fminf(fmaxf(f.x * scale, -65504.f), 65504.f),
                                    fminf(fmaxf(f.y * scale, -65504.f), 65504.f));
      h[k] = *reinterpret_cast<uint32_t*>(&v);
    }
  }
  return make_uint4(h[0], h[1], h[2], h[3]);
}

__device__ __forceinline__ float AbsMaxBf16x8(uint4 v) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  float m = 0.f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[k]));
    m = fmaxf(m, fmaxf(fabsf(f.x), fabsf(f.y)));
  }
  return m;
}

// 8 bf16 times the power of two f, as f16 (kToF16) or bf16 (exact).
template <bool kToF16>
__device__ __forceinline__ uint4 ScaleBf16x8(uint4 v, float f) {
  uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[k]));
    if constexpr (kToF16) {
      __half2 y = __floats2half2_rn(x.x * f, x.y * f);
      w[k] = *reinterpret_cast<uint32_t*>(&y);
    } else {
      __nv_bfloat162 y = __floats2bfloat162_rn(x.x * f, x.y * f);
      w[k] = *reinterpret_cast<uint32_t*>(&y);
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The stored codes of a landed tile (atoms 0-3 of `buf`, scales in `sl`) to its f16 latent
// columns, by the math warpgroup that computes the tile's Q K^T (see the FP8 notes above):
// warp wl converts rows 16 wl .. 16 wl + 15. Group B first (codes in atoms 2-3 -> f16 in atoms
// 4-7: no overlap), then group A in place (codes in atoms 0-1 -> f16 in atoms 0-3: every lane
// reads its codes before the warp's stores, and group B's codes of those rows were read in
// the loop before). Lane l handles row 2 i + (l >> 4) and the 8-column f16 chunk c = l & 7 of
// the group's atoms x = (l >> 3) & 1 and x + 2: each quarter warp reads 64 contiguous code
// bytes and stores 8 distinct chunks of one atom row.
__device__ __forceinline__ void ConvertTileFp8(unsigned char* buf, const float* sl, int wl,
                                               int lane) {
  const int half = lane >> 4;
  const int atom_lo = (lane >> 3) & 1;
  const int chunk = lane & 7;
#pragma unroll
  for (int grp = 1; grp >= 0; --grp) {
#pragma unroll 4
    for (int i = 0; i < 8; ++i) {
      const int r = 16 * wl + 2 * i + half;
      // The lane's f16 chunks: atoms x = atom_lo and x + 2 of the group, chunk `chunk`; their
      // codes: columns 256 grp + 64 x + 8 chunk, in landing atom (2 grp + x) / 2, 16-byte
      // chunk ((x & 1) * 4 + chunk / 2), half chunk & 1.
      uint2 c[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int x = atom_lo + 2 * h;
        const int piece = 2 * grp + (x >> 1);
        const int ch = (x & 1) * 4 + (chunk >> 1);
        c[h] = *reinterpret_cast<const uint2*>(buf + piece * Tr::kAtom + r * 128 +
                                               ((ch ^ (r & 7)) << 4) + 8 * (chunk & 1));
      }
      const float2 sc = *reinterpret_cast<const float2*>(sl + r * 4 + 2 * grp);
      if (grp == 0) __syncwarp();  // in place: every lane has read its codes first
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int atom = 4 * grp + atom_lo + 2 * h;
        *reinterpret_cast<uint4*>(buf + atom * Tr::kAtom + r * 128 + ((chunk ^ (r & 7)) << 4)) =
            CodesToF16x8(c[h], h == 0 ? sc.x : sc.y);
      }
    }
    __syncwarp();  // group A overwrites group B's codes of the warp's rows: all read first
  }
}

// The first of the four rows of each tile this FP8 producer lane copies (as GatherQ describes:
// producer warp pw, lane l: row 16 pw + (l >> 3) + 4 i; its 16-byte chunk: l & 7).
__device__ __forceinline__ int SeesawFp8KeyLane() {
  const int t128 = threadIdx.x & 127;
  const int lane = threadIdx.x & 31;
  const int pw = t128 >> 5;
  const int sub = lane >> 3;
  return 16 * pw + sub;
}

// The FP8 producer's Q: GatherQ, then converted in place by the lanes that landed it (see
// above); arrives on the q barrier.
__device__ __forceinline__ void SeesawFp8ProduceQ(const VerifyKernelArgs& args,
                                                  const VerifyWorkItem& wi, const SeesawCta& cta) {
  const int key_lane = SeesawFp8KeyLane();
  const int chunk = threadIdx.x & 7;
  const int rows_here = min(Tr::kRows, wi.num_nodes * args.num_heads - wi.fold_begin);
  GatherQ(args, wi, rows_here, cta.sQ(), key_lane, chunk);
  CpAsyncCommit();
  CpAsyncWait<0>();
  float* row_factor = reinterpret_cast<float*>(cta.smem + offsetof(SeesawFp8Smem, q_row_factor));
#pragma unroll 1
  for (int i = 0; i < 4; ++i) {
    const int r = key_lane + 4 * i;
    unsigned char* q = cta.smem + Tr::kQOff + r * 128 + ((chunk ^ (r & 7)) << 4);
    float mx = 0.f;
#pragma unroll 2
    for (int a = 0; a < 8; ++a)
      mx = fmaxf(mx, AbsMaxBf16x8(*reinterpret_cast<const uint4*>(q + a * Tr::kAtom)));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
    // mx in [2^(e - 127), 2^(e - 126)) for its biased exponent e: mx * 2^(141 - e) lands in
    // [2^14, 2^15). Rows of zeros (and rows past the request) keep eq = 0.
    const int e = (__float_as_int(mx) >> 23) & 0xff;
    const int eq = mx > 0.f ? min(max(141 - e, -32), 32) : 0;
    const float f = Pow2(eq);
#pragma unroll 2
    for (int a = 0; a < 8; ++a) {
      uint4* p = reinterpret_cast<uint4*>(q + a * Tr::kAtom);
      *p = ScaleBf16x8<true>(*p, f);
    }
    uint4* rope = reinterpret_cast<uint4*>(q + 8 * Tr::kAtom);
    *rope = ScaleBf16x8<false>(*rope, f);
    if (chunk == 0) row_factor[r] = args.scale_log2 * Pow2(-eq);
  }
  FenceProxyAsyncShared();  // Q is read by wgmma (async proxy)
  MbarArrive(cta.bars.q());
}

// The FP8 producer's KV tiles (see above): tile t's codes and scales into buffer t & 1 once
// atoms 0-3 are free (full A), its rope once atoms 4-8 are free (full C).
__device__ __forceinline__ void SeesawFp8ProduceKv(const VerifyKernelArgs& args,
                                                   const VerifyWorkItem& wi, const SeesawCta& cta) {
  const int key_lane = SeesawFp8KeyLane();
  const int chunk = threadIdx.x & 7;
  const int num_tiles = (wi.kv_end - wi.kv_begin + Tr::kKeys - 1) / Tr::kKeys;
  const uint8_t* kv8 = reinterpret_cast<const uint8_t*>(args.kv);
  const uint32_t s_scale_land = cta.base + offsetof(SeesawFp8Smem, scale_land);
  // Landing: the lanes' rows as in GatherQ, keeping those rows' slot ids (and the next tile's).
  TileSlotStream slots(args, wi, key_lane);
  for (int t = 0; t < num_tiles; ++t) {
    const int b = t & 1;
    const uint32_t parity = ((t >> 1) - 1) & 1;  // buffer b last held tile t - 2
    const uint32_t dst = cta.kv(b);
    int32_t cur[4];
    slots.Next(cur);
    // The codes in atoms 0-3 (row r's 128-byte piece k in atom k, row r, 16-byte chunks
    // swizzled as the tiles are) and the scales in scale_land[b], once atoms 0-3 are free:
    // full A ("codes landed").
    if (t >= 2) MbarWait(cta.bars.empty_a(b), parity);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = key_lane + 4 * i;
      const bool valid = cur[i] >= 0;  // keys past the range: zero rows (masked)
      const uint8_t* row =
          kv8 + static_cast<int64_t>(static_cast<uint32_t>(max(cur[i], 0))) * kFp8RowBytes;
      const uint32_t sw = r * 128 + ((chunk ^ (r & 7)) << 4);
#pragma unroll
      for (int k = 0; k < 4; ++k)
        CpAsync16(dst + k * Tr::kAtom + sw, row + 128 * k + 16 * chunk, valid);
      if (chunk == 0)
        CpAsync16(s_scale_land + (b * Tr::kRows + r) * 16, row + kFp8ScaleOffset, valid);
    }
    CpAsyncMbarArrive(cta.bars.full(kGroupA, b));
    // The rope (stored bf16) straight into atom 8, once atoms 4-8 are free: full C.
    if (t >= 2) MbarWait(cta.bars.empty_bc(b), parity);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = key_lane + 4 * i;
      const uint8_t* row =
          kv8 + static_cast<int64_t>(static_cast<uint32_t>(max(cur[i], 0))) * kFp8RowBytes;
      CpAsync16(dst + 8 * Tr::kAtom + r * 128 + ((chunk ^ (r & 7)) << 4),
                row + kFp8RopeOffset + 16 * chunk, cur[i] >= 0);
    }
    CpAsyncMbarArrive(cta.bars.full(kGroupC, b));
  }
}

// The FP8 producer warpgroup's whole job (see above), after its register split.
__device__ __forceinline__ void SeesawFp8Producer(const VerifyKernelArgs& args,
                                                  const SeesawCta& cta) {
  const VerifyWorkItem wi = args.work[blockIdx.x];
  SeesawFp8ProduceQ(args, wi, cta);
  SeesawFp8ProduceKv(args, wi, cta);
  CpAsyncCommit();
  CpAsyncWait<0>();  // no copies in flight when the warp exits
}
#endif  // VERIFYD_SEESAW_BODY
}  // namespace
}  // namespace verifyd::kernels::cuda::detail
