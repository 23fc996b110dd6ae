// The keys-on-M verify attention kernel's shared pieces (the kernel, its roles and its schedule:
// keys_on_m.cu): its named barriers, the wgmma operand helpers of the two products (K Q^T on
// key groups, V^T P_g^T on value steps), and the CTA's view of KeysOnMSmem (keys_on_m_layout.h)
// with its stage-ring mbarriers.
// Internal CUDA header, included by keys_on_m.cu only (through keys_on_m_math.cuh): the device
// code exists only in the sm_90a build (VERIFYD_KEYS_ON_M_BODY) and has internal linkage.
// Thread-safety: n/a (device code).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/verify_attention/kernel_args.cuh"
#include "kernels/cuda/verify_attention/keys_on_m_layout.h"
#include "kernels/cuda/verify_attention/ptx.cuh"

// The kernel body (and every device helper) exists only in the sm_90a build.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define VERIFYD_KEYS_ON_M_BODY 1
#endif

namespace verifyd::kernels::cuda::detail {
#ifdef VERIFYD_KEYS_ON_M_BODY
extern __shared__ unsigned char smem_raw[];  // KeysOnMSmem at its first 1024-byte boundary
#endif
namespace {
#ifdef VERIFYD_KEYS_ON_M_BODY

using Tr = KeysOnMTraits;

// Named barriers (0 is __syncthreads).
enum KeysOnMBarrier : int {
  kBarQ = 1,         // both math warpgroups: Q and its row scaling in shared memory
  kBarMax = 2,       // + wg: a warpgroup's row maxima of the tile exchanged (128 threads)
  kBarP = 4,         // + wg: a warpgroup's P_g tiles written (128 threads)
  kBarEpilogue = 6,  // both: every tile done (the stage ring is free)
  kBarMerge = 7,     // both: WG1's state staged for WG0
};

// The f16 / bf16 x 2 word at position (row, pos) of a [16 x 64] 128-byte-swizzled atom.
__device__ __forceinline__ uint32_t AtomOffset(int row, int byte) {
  return row * 128 + ((((byte >> 4) ^ row) & 7) << 4) + (byte & 15);
}

// The k16 step `k` (0..35) of Q's 576 columns: its B descriptor from Q's base descriptor q0
// (descriptor addresses are addr >> 4 in 14 bits and shared memory is < 256 KB: adding the
// offset >> 4 never carries out of the field).
__device__ __forceinline__ uint64_t QDesc(uint64_t q0, int k) {
  return q0 + (((k >> 2) * Tr::kQAtom + (k & 3) * 32) >> 4);
}

// A fragments of one scale group's 8 k16 steps (latent columns 128 grp ..): keys krow0 (M
// row g) and krow1 (g + 8) of the thread's warp, quad position tq.
__device__ __forceinline__ void LoadKeyGroup(const unsigned char* krow0, const unsigned char* krow1,
                                             int grp, int tq, uint32_t (&a)[8][4]) {
#pragma unroll
  for (int blk = 0; blk < 4; ++blk) {
    const int off = (grp * 4 + blk) * 32 + 8 * tq;
    const uint2 x0 = *reinterpret_cast<const uint2*>(krow0 + off);
    const uint2 x1 = *reinterpret_cast<const uint2*>(krow1 + off);
    E4m3x4ToF16x2x2(x0.x, a[2 * blk][0], a[2 * blk][2]);
    E4m3x4ToF16x2x2(x1.x, a[2 * blk][1], a[2 * blk][3]);
    E4m3x4ToF16x2x2(x0.y, a[2 * blk + 1][0], a[2 * blk + 1][2]);
    E4m3x4ToF16x2x2(x1.y, a[2 * blk + 1][1], a[2 * blk + 1][3]);
  }
}

__device__ __forceinline__ void MmaKeyGroup(float* acc, const uint32_t (&a)[8][4], uint64_t q0,
                                            int grp) {
#pragma unroll
  for (int j = 0; j < 8; ++j) WgmmaM64N16RegAF16(acc, a[j], QDesc(q0, grp * 8 + j));
}

__device__ __forceinline__ void KeepLiveAll(uint32_t (&a)[8][4]) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) KeepLive(a[j][e]);
}

// V^T A fragments of one 16-key step for all four scale groups: rows[e] = the stage rows of
// keys (t, t + 8, t + 4, t + 12) of the step (k slots 2t, 2t + 1, 2t + 8, 2t + 9);
// a[grp][blk] = block 2 grp + blk.
__device__ __forceinline__ void LoadValueStep(const unsigned char* const (&rows)[4], int col0,
                                              uint32_t (&a)[4][2][4]) {
#pragma unroll
  for (int grp = 0; grp < Tr::kGroups; ++grp) {
    const int off = grp * 128 + col0;
    const uint32_t w0 = *reinterpret_cast<const uint32_t*>(rows[0] + off);
    const uint32_t w1 = *reinterpret_cast<const uint32_t*>(rows[1] + off);
    const uint32_t w2 = *reinterpret_cast<const uint32_t*>(rows[2] + off);
    const uint32_t w3 = *reinterpret_cast<const uint32_t*>(rows[3] + off);
    // [w0.b0, w1.b0, w0.b1, w1.b1]: columns d0 / d1 of keys (t, t + 8); likewise d2 / d3.
    E4m3x4ToF16x2x2(__byte_perm(w0, w1, 0x5140), a[grp][0][0], a[grp][0][1]);
    E4m3x4ToF16x2x2(__byte_perm(w2, w3, 0x5140), a[grp][0][2], a[grp][0][3]);
    E4m3x4ToF16x2x2(__byte_perm(w0, w1, 0x7362), a[grp][1][0], a[grp][1][1]);
    E4m3x4ToF16x2x2(__byte_perm(w2, w3, 0x7362), a[grp][1][2], a[grp][1][3]);
  }
}

__device__ __forceinline__ void MmaValueStep(float (&o)[8][8], const uint32_t (&a)[4][2][4],
                                             uint64_t p0, int kk) {
#pragma unroll
  for (int grp = 0; grp < Tr::kGroups; ++grp) {
    const uint64_t desc = p0 + ((grp * Tr::kQAtom + kk * 32) >> 4);
    WgmmaM64N16RegAF16(o[2 * grp], a[grp][0], desc);
    WgmmaM64N16RegAF16(o[2 * grp + 1], a[grp][1], desc);
  }
}

__device__ __forceinline__ void KeepLiveAll(uint32_t (&a)[4][2][4]) {
#pragma unroll
  for (int grp = 0; grp < Tr::kGroups; ++grp)
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int e = 0; e < 4; ++e) KeepLive(a[grp][b][e]);
}

// ======================= the CTA's shared memory =======================

// Where KeysOnMSmem lies (`pad` bytes into smem_raw, at shared address `base`) and its stage
// ring's mbarriers. A role function forms its pointers itself as `smem_raw + cta.pad` (there is
// no pointer member or accessor): the compiler then knows they are shared memory while it
// optimizes the function before inlining it, and the address arithmetic stays what it was with
// the whole kernel in one function (a pointer handed in, or returned by an accessor, changes
// it: checked on the PTX).
struct KeysOnMCta {
  uint32_t pad;   // smem_raw to the aligned KeysOnMSmem, bytes
  uint32_t base;  // the aligned KeysOnMSmem's shared-window address

  // Producer -> math: stage s landed (128 cp.async arrivals).
  __device__ __forceinline__ uint32_t FullBar(int s) const {
    return base + static_cast<uint32_t>(offsetof(KeysOnMSmem, full)) + 8u * s;
  }
  // Math -> producer: stage s free (4 warp arrivals).
  __device__ __forceinline__ uint32_t EmptyBar(int s) const {
    return base + static_cast<uint32_t>(offsetof(KeysOnMSmem, empty)) + 8u * s;
  }
};

__device__ __forceinline__ KeysOnMCta LocateSmem() {
  const uint32_t raw_addr = SmemAddr(smem_raw);
  const uint32_t base = (raw_addr + 1023u) & ~1023u;
  return KeysOnMCta{base - raw_addr, base};
}

__device__ __forceinline__ void InitStageBarriers(const KeysOnMCta& cta) {
  for (int s = 0; s < Tr::kStages; ++s) {
    MbarInit(cta.FullBar(s), 128);
    MbarInit(cta.EmptyBar(s), 4);
  }
}

#endif  // VERIFYD_KEYS_ON_M_BODY
}  // namespace
}  // namespace verifyd::kernels::cuda::detail
