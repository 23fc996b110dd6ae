// The keys-on-M verify attention kernel for the FP8 latent cache (variant KeysOnMFp8Sm90 in
// variants.h; sm_90a: H100 / H200): 16 folded rows per CTA, 64-key tiles, keys on the wgmma
// M side, so the stored e4m3 codes become MMA operands in registers without a dequantized
// tile in shared memory. kAuto's FP8 choice on sm_90. Same work items, partial-output and LSE
// contract as the other variants (planner, combine kernel and tests shared). Shared memory:
// KeysOnMSmem (keys_on_m_layout.h). Compiled for every configured architecture; the body
// exists only in the sm_90a build. Notes and measurements: docs/KERNEL_NOTES.md.
//
// CTA = 3 warpgroups (384 threads):
//   producer (WG2, setmaxnreg 40)  16-byte cp.async gathers of the stored 656-byte rows of
//        tile t into stage t % 4 (row stride 672), signalled on full[stage] through
//        cp.async.mbarrier.arrive; a stage is refilled after its warpgroup's four warps
//        arrived on empty[stage].
//   math WG0 / WG1 (setmaxnreg 232)  tiles t = wg, wg + 2, ... each with its own online
//        softmax state and its own O^T [512 x 16] fp32 (64 registers a thread); merged in the
//        epilogue. Per tile:
//     S^T [64 keys x 16 rows] = K Q^T: A = the keys, from the stage's codes in registers
//        (cvt.rn.f16x2.e4m3x2: exact), B = Q in shared memory (latent columns as f16 times
//        2^e_row, rope columns bf16). One accumulator per 128-column scale group and one for
//        the rope columns: S = sum_g scale[key][g] acc_g * 2^-e_row + acc_rope, so no code is
//        ever multiplied by its scale.
//     softmax  row maxima over the tile: quad shuffles, then the four warps through shared
//        memory (one named barrier); row sums stay per thread until the epilogue.
//     O^T [512 x 16] += V^T P_g^T: A = V^T from the stage's codes (a 4 x 4 byte transpose with
//        prmt, then cvt), B = P_g = P * scale[key][g] * 2^c (f16, one [16 x 64] tile per scale
//        group, written to shared memory; a second named barrier). c: a power of two per
//        tile that keeps P_g below 2^14 (it only decreases; O^T is rescaled when it does).
// Operand permutations (free, because a dot product does not care about order):
//   Q K^T: in each 32-column block thread t of a quad loads codes 8t .. 8t + 7 of its key (one
//     8-byte load); those land in k slots (2t, 2t + 1, 2t + 8, 2t + 9) of two k16 steps, and Q
//     is stored with the same column order (pair 4t + i of the block at position 4i + t).
//   P V: thread t's k slots (2t, 2t + 1, 2t + 8, 2t + 9) of a 16-key step hold keys
//     (t, t + 8, t + 4, t + 12) (P_g is stored in that key order: a thread's two keys of S^T,
//     g and g + 8, are adjacent), and its M rows g, g + 8 of the two 64-column blocks of a
//     scale group hold columns 4 (8 w + g) + 0, 1 / 2, 3, so one 4-byte load per key gives
//     both blocks. Row stride 672 = 32 mod 128: the four keys of a load instruction (t = 0..3)
//     hit four different 32-byte bank groups, and so do the four keys of a Q K^T load.
// Masking: only tiles that reach the request's tail keys or the end of the key range.
// Code: one __device__ __forceinline__ function per role, the kernel calling them in turn:
// ProduceTiles (WG2); StageQ and LoadQInv, then MathTiles, per tile ScoreTile (S^T = K Q^T),
// ScaleScores / MaskTile / ExchangeTileMaxima, SoftmaxUpdate (the c exponent, O^T rescaled),
// WritePTiles (P_g), ValueTile (O^T += V^T P_g^T); then Epilogue (WG1's state to WG0, merged,
// normalised, written direct or as a partial row). A math warpgroup's running state is a
// MathState (o, m_run, l_part, c_run) passed by reference.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/verify_attention/kernel_args.cuh"
#include "kernels/cuda/verify_attention/keys_on_m_layout.h"
#include "kernels/cuda/verify_attention/ptx.cuh"
#include "kernels/cuda/verify_attention/variants.h"

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

// ======================= producer warpgroup (WG2) =======================

// cp.async gathers of the work item's tiles into the stage ring. Warp pw copies keys
// 16 pw .. 16 pw + 15 of each tile, one row per step: lanes 0-31 its first 512 bytes, lanes
// 0-8 the other 144 (coalesced); lane l (and l + 16) holds the slot id of key 16 pw + l % 16
// (the next tile's loaded while this one is copied). Keys past the range are zero-filled
// (masked; zero codes keep P V finite). Measured slower on the H200 and not done
// (docs/KERNEL_NOTES.md): one bulk copy per key through the TMA engine; an L2 bulk prefetch
// of the rows 2-8 tiles ahead.
__device__ __forceinline__ void ProduceTiles(const VerifyKernelArgs& args, const KeysOnMCta& cta,
                                             int t128, int lane) {
  const VerifyWorkItem wi = args.work[blockIdx.x];
  const int keys = wi.kv_end - wi.kv_begin;
  const int num_tiles = (keys + Tr::kKeys - 1) / Tr::kKeys;
  const int32_t* idx = WorkItemKeys(args, wi) + wi.kv_begin;
  const uint32_t sStage = cta.base + offsetof(KeysOnMSmem, stage);
  const int pw = t128 >> 5;
  const int my_key = 16 * pw + (lane & 15);
  const unsigned char* kv = reinterpret_cast<const unsigned char*>(args.kv) + lane * 16;
  int32_t slot = my_key < keys ? __ldg(idx + my_key) : -1;
  for (int t = 0; t < num_tiles; ++t) {
    const int s = t % Tr::kStages;
    if (t >= Tr::kStages) MbarWait(cta.EmptyBar(s), ((t / Tr::kStages) - 1) & 1);
    const int32_t cur = slot;
    const int next = (t + 1) * Tr::kKeys + my_key;
    slot = next < keys ? __ldg(idx + next) : -1;
    const uint32_t dst = sStage + s * Tr::kStageBytes + 16 * pw * Tr::kRowStride + lane * 16;
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const int32_t sl = __shfl_sync(0xffffffffu, cur, r);
      const unsigned char* src =
          kv + static_cast<int64_t>(static_cast<uint32_t>(max(sl, 0))) * kFp8RowBytes;
      CpAsync16(dst + r * Tr::kRowStride, src, sl >= 0);
      if (lane < kFp8ChunksPerRow - 32)
        CpAsync16(dst + r * Tr::kRowStride + 512, src + 512, sl >= 0);
    }
    CpAsyncMbarArrive(cta.FullBar(s));
  }
  CpAsyncWait<0>();
}

// ======================= math warpgroups (WG0, WG1) =======================

// The work item's sizes as the math warpgroups use them.
struct MathWork {
  int H;          // heads
  int M;          // folded rows of the request (nodes x heads)
  int rows_here;  // folded rows of this CTA (the rest of its 16 are padding)
  int ctx_len;    // request-local keys before the tree's nodes
  int num_tiles;  // 64-key tiles of the key range
};

// A math thread's place: its warpgroup, warp and quad position, and its 4 rows (the S^T / O^T
// accumulator columns): c -> 8 (c >> 1) + 2 tq + (c & 1); accumulator element i belongs to row
// c(i) = 2 (i >> 2) + (i & 1) and to M row g + 8 ((i >> 1) & 1) of the warp's 16. Made once by
// the kernel; a role function copies the fields it uses into locals first thing (`const int wl =
// th.wl, ...`): read through the reference inside its loops instead, they are not hoisted out
// of them before the loops are unrolled, and the code differs from the single-function
// kernel's.
struct MathThread {
  int wg;         // 0 or 1 (warp-uniform)
  int wl;         // warp in the warpgroup: keys 16 wl .. of a tile
  int lane;       // lane in the warp
  int g;          // lane / 4: accumulator M rows g, g + 8
  int tq;         // lane % 4
  int row_of[4];  // the thread's rows

  // t128 = threadIdx.x % 128, lane = threadIdx.x % 32 (the kernel's, shared with the producer).
  __device__ __forceinline__ MathThread(int warpgroup, int t128, int lane_in) {
    wg = warpgroup;
    lane = lane_in;
    wl = t128 >> 5;
    g = lane >> 2;
    tq = lane & 3;
#pragma unroll
    for (int c = 0; c < 4; ++c) row_of[c] = 8 * (c >> 1) + 2 * tq + (c & 1);
  }
};

// A math warpgroup's online-softmax state over its tiles (merged in the epilogue).
struct MathState {
  float o[8][8];    // O^T x 2^c_run: [64-column block][accumulator element]
  float m_run[4];   // running row maxima (log2 domain)
  float l_part[4];  // row sums over this thread's keys only (reduced at the end)
  int c_run;        // O^T holds O x 2^c_run
};

__device__ __forceinline__ void InitMathState(MathState& ms) {
#pragma unroll
  for (int b = 0; b < 8; ++b)
#pragma unroll
    for (int i = 0; i < 8; ++i) ms.o[b][i] = 0.f;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    ms.m_run[c] = -INFINITY;
    ms.l_part[c] = 0.f;
  }
  ms.c_run = 126;
}

// Q to shared memory (both math warpgroups): 16 threads a row; thread b takes latent block b
// (32 columns) and, b < 2, rope block b. Latent columns become f16 x 2^e with |q| 2^e < 2^15
// (e per row, 2^-e kept in q_inv); column pairs are permuted within each block (pair 4t + i to
// position 4i + t) and 128-byte swizzled. The caller syncs kBarQ.
__device__ __forceinline__ void StageQ(const VerifyKernelArgs& args, const VerifyWorkItem& wi,
                                       const MathWork& w, const KeysOnMCta& cta) {
  unsigned char* smem = smem_raw + cta.pad;
  const int tid = threadIdx.x;
  const int r = tid >> 4;
  const int b = tid & 15;
  const bool valid = r < w.rows_here;
  const __nv_bfloat16* qrow =
      args.q +
      (static_cast<int64_t>(wi.q_row0) * w.H + wi.fold_begin + min(r, w.rows_here - 1)) * kQkDim;
  uint4 v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    v[i] =
        valid ? __ldg(reinterpret_cast<const uint4*>(qrow + 32 * b) + i) : make_uint4(0, 0, 0, 0);
  const uint32_t* pr = reinterpret_cast<const uint32_t*>(v);  // pair p: columns 2p, 2p + 1
  float amax = 0.f;
#pragma unroll
  for (int p = 0; p < 16; ++p) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(pr + p));
    amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
  }
#pragma unroll
  for (int off = 1; off < 16; off <<= 1)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  int e = 0;
  if (amax > 0.f) {
    int ex;
    frexpf(amax, &ex);  // amax < 2^ex
    e = min(max(15 - ex, -126), 126);
  }
  const float mul = Pow2(e);
  uint32_t h[16];
#pragma unroll
  for (int p = 0; p < 16; ++p) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(pr + p));
    const __half2 x = __floats2half2_rn(f.x * mul, f.y * mul);
    h[p] = *reinterpret_cast<const uint32_t*>(&x);
  }
  unsigned char* atom = smem + offsetof(KeysOnMSmem, q) + (b >> 1) * Tr::kQAtom;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    *reinterpret_cast<uint4*>(atom + AtomOffset(r, (b & 1) * 64 + 16 * i)) =
        make_uint4(h[i], h[4 + i], h[8 + i], h[12 + i]);
  }
  if (b < 2) {
    uint4 x[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      x[i] = valid ? __ldg(reinterpret_cast<const uint4*>(qrow + kVDim + 32 * b) + i)
                   : make_uint4(0, 0, 0, 0);
    const uint32_t* rp = reinterpret_cast<const uint32_t*>(x);
    unsigned char* ratom = smem + offsetof(KeysOnMSmem, q) + 8 * Tr::kQAtom;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      *reinterpret_cast<uint4*>(ratom + AtomOffset(r, b * 64 + 16 * i)) =
          make_uint4(rp[i], rp[4 + i], rp[8 + i], rp[12 + i]);
    }
  }
  if (b == 0) reinterpret_cast<KeysOnMSmem*>(smem)->q_inv[r] = Pow2(-e);
  FenceProxyAsyncShared();  // Q is read by wgmma (async proxy)
}

// The 2^-e of the thread's 4 rows (Q's latent scaling), after kBarQ.
__device__ __forceinline__ void LoadQInv(const KeysOnMCta& cta, const MathThread& th,
                                         float (&q_inv)[4]) {
  const KeysOnMSmem& sm = *reinterpret_cast<const KeysOnMSmem*>(smem_raw + cta.pad);
#pragma unroll
  for (int c = 0; c < 4; ++c) q_inv[c] = sm.q_inv[th.row_of[c]];
}

// ---- tile phase 1: S^T [64 keys x 16 rows] = K Q^T. acc[grp] is scale group grp's latent
// sum, acc[4] the rope columns'. krow0 / krow1: the stage rows of the thread's keys g, g + 8.
__device__ __forceinline__ void ScoreTile(const unsigned char* krow0, const unsigned char* krow1,
                                          int tq, uint64_t q_desc, float (&acc)[5][8]) {
#pragma unroll
  for (int j = 0; j < 5; ++j)
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[j][i] = 0.f;
  // Scale group grp's A fragments in buffer grp % 2; a buffer is refilled once the wgmmas of
  // the group before have read it.
  uint32_t a[2][8][4];
#pragma unroll
  for (int grp = 0; grp < Tr::kGroups; ++grp) {
    if (grp >= 2) {
      WgmmaWait<1>();
      KeepLiveAll(a[grp & 1]);
    }
    LoadKeyGroup(krow0, krow1, grp, tq, a[grp & 1]);
    WgmmaFence();
    MmaKeyGroup(acc[grp], a[grp & 1], q_desc, grp);
    WgmmaCommit();
  }
  // Rope: bf16 as stored; 16 bytes (8 columns) a key per 32-column block.
  uint32_t ar[4][4];
#pragma unroll
  for (int blk = 0; blk < 2; ++blk) {
    const int off = kFp8RopeOffset + 64 * blk + 16 * tq;
    const uint4 y0 = *reinterpret_cast<const uint4*>(krow0 + off);
    const uint4 y1 = *reinterpret_cast<const uint4*>(krow1 + off);
    ar[2 * blk][0] = y0.x;
    ar[2 * blk][1] = y1.x;
    ar[2 * blk][2] = y0.y;
    ar[2 * blk][3] = y1.y;
    ar[2 * blk + 1][0] = y0.z;
    ar[2 * blk + 1][1] = y1.z;
    ar[2 * blk + 1][2] = y0.w;
    ar[2 * blk + 1][3] = y1.w;
  }
  WgmmaFence();
#pragma unroll
  for (int j = 0; j < 4; ++j) WgmmaM64N16RegABf16(acc[4], ar[j], QDesc(q_desc, 32 + j));
  WgmmaCommit();
  WgmmaWait<0>();
  KeepLiveAll(a[0]);
  KeepLiveAll(a[1]);
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) KeepLive(ar[j][e]);
}

// ---- tile phase 2a: scores in the log2 domain, S = (sum_g scale[key][g] acc_g) 2^-e_row +
// acc_rope, times the softmax scale. sc[hk]: the scales of key g + 8 hk.
__device__ __forceinline__ void ScaleScores(const VerifyKernelArgs& args, const float (&q_inv)[4],
                                            const float (&acc)[5][8], const float4 (&sc)[2],
                                            float (&sv)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int hk = (i >> 1) & 1;
    const int c = 2 * (i >> 2) + (i & 1);
    const float lat =
        acc[0][i] * sc[hk].x + acc[1][i] * sc[hk].y + acc[2][i] * sc[hk].z + acc[3][i] * sc[hk].w;
    sv[i] = (lat * q_inv[c] + acc[4][i]) * args.scale_log2;
  }
}

// ---- tile phase 2b: masking (-inf), only on tiles that reach the request's tail keys or the
// end of the key range. Rows past the request see every key (they are never written).
__device__ __forceinline__ void MaskTile(const VerifyKernelArgs& args, const VerifyWorkItem& wi,
                                         const MathWork& w, const MathThread& th, int t,
                                         float (&sv)[8]) {
  const int M = w.M, H = w.H, ctx_len = w.ctx_len;
  const int wl = th.wl, g = th.g;
  int row_of[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) row_of[c] = th.row_of[c];
  const int key0 = wi.kv_begin + t * Tr::kKeys;  // request-local key of tile row 0
  if (key0 + Tr::kKeys > ctx_len || key0 + Tr::kKeys > wi.kv_end) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int f = wi.fold_begin + row_of[c];
      uint64_t w0 = ~0ull, w1 = ~0ull;
      if (f < M) {
        const uint64_t* mrow =
            args.tree_mask + static_cast<int64_t>(wi.q_row0 + f / H) * args.mask_words;
        w0 = __ldg(mrow);
        w1 = args.mask_words > 1 ? __ldg(mrow + 1) : 0ull;
      }
#pragma unroll
      for (int hk = 0; hk < 2; ++hk) {
        const int i = 4 * (c >> 1) + 2 * hk + (c & 1);
        const int key = key0 + 16 * wl + g + 8 * hk;
        bool vis = key < wi.kv_end;
        if (vis && key >= ctx_len) {
          const int tt = key - ctx_len;
          vis = (((tt >> 6) ? w1 : w0) >> (tt & 63)) & 1ull;
        }
        if (!vis) sv[i] = -INFINITY;
      }
    }
  }
}

// ---- tile phase 2c: the warp's row maxima over the tile (quad shuffles) and its largest
// scale, exchanged with the warpgroup's other warps through shared memory (kBarMax + wg).
__device__ __forceinline__ void ExchangeTileMaxima(const KeysOnMCta& cta, const MathThread& th,
                                                   const float (&sv)[8], const float4 (&sc)[2]) {
  KeysOnMSmem& sm = *reinterpret_cast<KeysOnMSmem*>(smem_raw + cta.pad);
  const int wg = th.wg, wl = th.wl, g = th.g, tq = th.tq;
  int row_of[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) row_of[c] = th.row_of[c];
  float mx[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int i = 4 * (c >> 1) + (c & 1);
    mx[c] = fmaxf(sv[i], sv[i + 2]);
#pragma unroll
    for (int off = 4; off < 32; off <<= 1)
      mx[c] = fmaxf(mx[c], __shfl_xor_sync(0xffffffffu, mx[c], off));
  }
  float smax = fmaxf(fmaxf(fmaxf(sc[0].x, sc[0].y), fmaxf(sc[0].z, sc[0].w)),
                     fmaxf(fmaxf(sc[1].x, sc[1].y), fmaxf(sc[1].z, sc[1].w)));
#pragma unroll
  for (int off = 1; off < 32; off <<= 1)
    smax = fmaxf(smax, __shfl_xor_sync(0xffffffffu, smax, off));
  if (g == 0) {
#pragma unroll
    for (int c = 0; c < 4; ++c) sm.red[wg][wl][row_of[c]] = mx[c];
    if (tq == 0) sm.red[wg][wl][Tr::kRows] = smax;
  }
  NamedBarSync(kBarMax + wg, 128);
}

// ---- tile phase 3: online-softmax update from the exchanged maxima: the new c exponent and
// running maxima, l_part and O^T rescaled, P = 2^(S - m) into pv (and its row sums into
// l_part). Returns 2^c for P_g.
__device__ __forceinline__ float SoftmaxUpdate(const KeysOnMCta& cta, const MathThread& th,
                                               const float (&sv)[8], MathState& ms,
                                               float (&pv)[8]) {
  const KeysOnMSmem& sm = *reinterpret_cast<const KeysOnMSmem*>(smem_raw + cta.pad);
  const int wg = th.wg;
  int row_of[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) row_of[c] = th.row_of[c];
  float m_new[4], factor[4];
  const float smax = fmaxf(fmaxf(sm.red[wg][0][Tr::kRows], sm.red[wg][1][Tr::kRows]),
                           fmaxf(sm.red[wg][2][Tr::kRows], sm.red[wg][3][Tr::kRows]));
  // P_g = P x scale x 2^c < 2^14: c from the tile's largest scale, never raised (O^T holds
  // O x 2^c_run; lowering c rescales it exactly).
  int c_new = ms.c_run;
  if (smax > 0.f) {
    int ex;
    frexpf(smax, &ex);  // smax < 2^ex
    c_new = min(ms.c_run, 14 - ex);
  }
  const float c_fix = ldexpf(1.f, c_new - ms.c_run);
  ms.c_run = c_new;
  const float p_mul = ldexpf(1.f, c_new);
  bool all_one = c_fix == 1.f;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int r = row_of[c];
    const float tmax =
        fmaxf(fmaxf(sm.red[wg][0][r], sm.red[wg][1][r]), fmaxf(sm.red[wg][2][r], sm.red[wg][3][r]));
    m_new[c] = fmaxf(ms.m_run[c], tmax);
    const float alpha = m_new[c] == -INFINITY ? 1.f : FastExp2(ms.m_run[c] - m_new[c]);
    ms.l_part[c] *= alpha;
    factor[c] = alpha * c_fix;
    all_one = all_one && factor[c] == 1.f;
    ms.m_run[c] = m_new[c];
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int c = 2 * (i >> 2) + (i & 1);
    const float mu = m_new[c] == -INFINITY ? 0.f : m_new[c];
    pv[i] = FastExp2(sv[i] - mu);
    ms.l_part[c] += pv[i];
  }
  if (!__all_sync(0xffffffffu, all_one)) {
#pragma unroll
    for (int b = 0; b < 8; ++b)
#pragma unroll
      for (int i = 0; i < 8; ++i) ms.o[b][i] *= factor[2 * (i >> 2) + (i & 1)];
  }
  return p_mul;
}

// ---- tile phase 4: P_g = P x scale[key][g] x 2^c (f16) to the warpgroup's P tiles, then
// kBarP + wg. Keys 16 wl + g and 16 wl + g + 8 sit at k positions 16 wl + 2 (g & 3) +
// 8 (g >> 2) and the next one: one f16x2 per row and scale group.
__device__ __forceinline__ void WritePTiles(const KeysOnMCta& cta, const MathThread& th,
                                            const float (&pv)[8], float p_mul,
                                            const float4 (&sc)[2]) {
  const int wg = th.wg, wl = th.wl, g = th.g;
  int row_of[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) row_of[c] = th.row_of[c];
  unsigned char* p_tile =
      smem_raw + cta.pad + offsetof(KeysOnMSmem, p) + wg * Tr::kGroups * Tr::kQAtom;
  const int byte = 2 * (16 * wl + 2 * (g & 3) + 8 * (g >> 2));
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int i = 4 * (c >> 1) + (c & 1);
    const uint32_t off = AtomOffset(row_of[c], byte);
    const float p0 = pv[i] * p_mul;
    const float p1 = pv[i + 2] * p_mul;
    const float s0[4] = {sc[0].x, sc[0].y, sc[0].z, sc[0].w};
    const float s1[4] = {sc[1].x, sc[1].y, sc[1].z, sc[1].w};
#pragma unroll
    for (int grp = 0; grp < Tr::kGroups; ++grp) {
      *reinterpret_cast<__half2*>(p_tile + grp * Tr::kQAtom + off) =
          __floats2half2_rn(p0 * s0[grp], p1 * s1[grp]);
    }
  }
  FenceProxyAsyncShared();  // P_g is read by wgmma (async proxy)
  NamedBarSync(kBarP + wg, 128);
}

// ---- tile phase 5: O^T [512 x 16] += V^T P_g^T over the tile's four 16-key steps (V^T
// fragments double-buffered); each warp arrives on empty[s] once its last stage read is done.
__device__ __forceinline__ void ValueTile(const KeysOnMCta& cta, const MathThread& th,
                                          const unsigned char* st, int s, uint64_t p_desc,
                                          float (&o)[8][8]) {
  const int wl = th.wl, lane = th.lane, g = th.g, tq = th.tq;
  const int col0 = 32 * wl + 4 * g;
  uint32_t va[4][2][4], vb[4][2][4];
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const unsigned char* rows[4];
#pragma unroll
    for (int e = 0; e < 4; ++e)
      rows[e] = st + (16 * kk + (e & 1) * 8 + (e >> 1) * 4 + tq) * Tr::kRowStride;
    if (kk & 1) {
      if (kk == 3) {
        WgmmaWait<1>();
        KeepLiveAll(vb);
      }
      LoadValueStep(rows, col0, vb);
      if (kk == 3) {
        __syncwarp();
        if (lane == 0) MbarArrive(cta.EmptyBar(s));  // this warp's stage reads are done
      }
      WgmmaFence();
      MmaValueStep(o, vb, p_desc, kk);
    } else {
      if (kk == 2) {
        WgmmaWait<1>();
        KeepLiveAll(va);
      }
      LoadValueStep(rows, col0, va);
      WgmmaFence();
      MmaValueStep(o, va, p_desc, kk);
    }
    WgmmaCommit();
  }
  WgmmaWait<0>();
  KeepLiveAll(va);
  KeepLiveAll(vb);
}

// The math warpgroup's tiles t = wg, wg + 2, ...: every phase of each, in order. The state is
// worked on in a local copy (written back at the end), as the kernel's own locals were: through
// the reference, c_run's initial value is placed differently.
__device__ __forceinline__ void MathTiles(const VerifyKernelArgs& args, const VerifyWorkItem& wi,
                                          const MathWork& w, const KeysOnMCta& cta,
                                          const MathThread& th, const float (&q_inv)[4],
                                          MathState& state) {
  MathState ms = state;
  unsigned char* smem = smem_raw + cta.pad;
  const int wg = th.wg, wl = th.wl, g = th.g, tq = th.tq;
  const int num_tiles = w.num_tiles;
  const uint64_t p_desc =
      WgmmaDesc(cta.base + offsetof(KeysOnMSmem, p) + wg * Tr::kGroups * Tr::kQAtom, 16, 1024);
  const uint32_t sQ = cta.base + offsetof(KeysOnMSmem, q);
  const uint64_t q_desc = WgmmaDesc(sQ, 16, 1024);
  for (int t = wg; t < num_tiles; t += 2) {
    const int s = t % Tr::kStages;
    const unsigned char* st = smem + offsetof(KeysOnMSmem, stage) + s * Tr::kStageBytes;
    MbarWait(cta.FullBar(s), (t / Tr::kStages) & 1);
    const unsigned char* krow0 = st + (16 * wl + g) * Tr::kRowStride;
    const unsigned char* krow1 = krow0 + 8 * Tr::kRowStride;
    float acc[5][8];
    ScoreTile(krow0, krow1, tq, q_desc, acc);
    const float4 sc[2] = {*reinterpret_cast<const float4*>(krow0 + kFp8ScaleOffset),
                          *reinterpret_cast<const float4*>(krow1 + kFp8ScaleOffset)};
    float sv[8];
    ScaleScores(args, q_inv, acc, sc, sv);
    MaskTile(args, wi, w, th, t, sv);
    ExchangeTileMaxima(cta, th, sv, sc);
    float pv[8];
    const float p_mul = SoftmaxUpdate(cta, th, sv, ms, pv);
    WritePTiles(cta, th, pv, p_mul, sc);
    ValueTile(cta, th, st, s, p_desc, ms.o);
  }
  state = ms;
}

// ======================= epilogue =======================

// Both math warpgroups: every warp's row sums to shared memory; once every tile is done (the
// stage ring is free), WG1 hands its state to WG0: its O^T in true scale ([16][512] fp32, in
// the stage ring) and its running maxima. WG1 then leaves; WG0 merges the two states,
// normalises, and writes the CTA's rows: bf16 output and LSE (natural log) when the work item
// is the rows' only one, else fp32 partial rows and their log2 LSE for the combine kernel.
__device__ __forceinline__ void Epilogue(const VerifyKernelArgs& args, const VerifyWorkItem& wi,
                                         const MathWork& w, const KeysOnMCta& cta,
                                         const MathThread& th, const MathState& ms) {
  unsigned char* smem = smem_raw + cta.pad;
  KeysOnMSmem& sm = *reinterpret_cast<KeysOnMSmem*>(smem);
  const int wg = th.wg, wl = th.wl, g = th.g;
  int row_of[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) row_of[c] = th.row_of[c];
  float l_sum[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    float l = ms.l_part[c];
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
    l_sum[c] = l;
  }
  NamedBarSync(kBarEpilogue, Tr::kMathThreads);  // every tile done: the stage ring is free
  float* o_stage = reinterpret_cast<float*>(smem + offsetof(KeysOnMSmem, stage));  // [16][512]
  const int col0 = 32 * wl + 4 * g;  // O^T rows (value columns) of this thread: + 128 grp + 0..3
  if (g == 0) {
#pragma unroll
    for (int c = 0; c < 4; ++c) sm.l[wg][wl][row_of[c]] = l_sum[c];
  }
  if (wg == 1) {
    const float to_true = ldexpf(1.f, -ms.c_run);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int i0 = 4 * (c >> 1) + (c & 1);
#pragma unroll
      for (int grp = 0; grp < Tr::kGroups; ++grp) {
        *reinterpret_cast<float4*>(o_stage + row_of[c] * kVDim + grp * 128 + col0) =
            make_float4(ms.o[2 * grp][i0] * to_true, ms.o[2 * grp][i0 + 2] * to_true,
                        ms.o[2 * grp + 1][i0] * to_true, ms.o[2 * grp + 1][i0 + 2] * to_true);
      }
      if (wl == 0 && g == 0) sm.m1[row_of[c]] = ms.m_run[c];
    }
  }
  NamedBarSync(kBarMerge, Tr::kMathThreads);
  if (wg == 1) return;
  const bool direct = wi.partial_row < 0;
  const int64_t out_row0 = static_cast<int64_t>(wi.q_row0) * w.H + wi.fold_begin;
  const float to_true = ldexpf(1.f, -ms.c_run);
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int r = row_of[c];
    const float l0 = sm.l[0][0][r] + sm.l[0][1][r] + sm.l[0][2][r] + sm.l[0][3][r];
    const float l1 = sm.l[1][0][r] + sm.l[1][1][r] + sm.l[1][2][r] + sm.l[1][3][r];
    const float m0 = ms.m_run[c];
    const float m1 = sm.m1[r];
    const float m = fmaxf(m0, m1);
    const float f0 = m0 == -INFINITY ? 0.f : exp2f(m0 - m);
    const float f1 = m1 == -INFINITY ? 0.f : exp2f(m1 - m);
    const float l = l0 * f0 + l1 * f1;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    if (r >= w.rows_here) continue;
    const float w0 = f0 * inv * to_true;
    const float w1 = f1 * inv;
    const int i0 = 4 * (c >> 1) + (c & 1);
#pragma unroll
    for (int grp = 0; grp < Tr::kGroups; ++grp) {
      const float4 ob = *reinterpret_cast<const float4*>(o_stage + r * kVDim + grp * 128 + col0);
      const float4 v = make_float4(
          ms.o[2 * grp][i0] * w0 + ob.x * w1, ms.o[2 * grp][i0 + 2] * w0 + ob.y * w1,
          ms.o[2 * grp + 1][i0] * w0 + ob.z * w1, ms.o[2 * grp + 1][i0 + 2] * w0 + ob.w * w1);
      const int col = grp * 128 + col0;
      if (direct) {
        const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y);
        const __nv_bfloat162 hi = __floats2bfloat162_rn(v.z, v.w);
        uint2 packed;
        packed.x = *reinterpret_cast<const uint32_t*>(&lo);
        packed.y = *reinterpret_cast<const uint32_t*>(&hi);
        *reinterpret_cast<uint2*>(args.out + (out_row0 + r) * kVDim + col) = packed;
      } else {
        *reinterpret_cast<float4*>(args.part_o + static_cast<int64_t>(wi.partial_row + r) * kVDim +
                                   col) = v;
      }
    }
    if (wl == 0 && g == 0) {
      const float lse2 = l > 0.f ? m + log2f(l) : -INFINITY;
      if (direct) {
        if (args.lse != nullptr) args.lse[out_row0 + r] = lse2 * 0.69314718055994531f;
      } else {
        args.part_lse[wi.partial_row + r] = lse2;
      }
    }
  }
}

#endif  // VERIFYD_KEYS_ON_M_BODY
}  // namespace

// Warp-specialized (roles above): WG2 produces the stage ring; WG0 / WG1 stage Q, consume
// alternate tiles, then WG1 hands its state to WG0, which writes the rows.
__global__ void __launch_bounds__(KeysOnMTraits::kThreads, 1)
    VerifyAttentionKeysOnMKernel(const VerifyKernelArgs args) {
#ifdef VERIFYD_KEYS_ON_M_BODY
  const KeysOnMCta cta = LocateSmem();

  GridDepLaunchDependents();
  const int tid = threadIdx.x;
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);  // warp-uniform, known to be
  const int t128 = tid & 127;
  const int lane = tid & 31;

  if (tid == 0) InitStageBarriers(cta);
  __syncthreads();

  if (wg == 2) {
    SetMaxRegsDec<Tr::kProducerRegs>();
    ProduceTiles(args, cta, t128, lane);
    return;
  }

  SetMaxRegsInc<Tr::kMathRegs>();
  const VerifyWorkItem wi = args.work[blockIdx.x];
  MathWork w;
  w.H = args.num_heads;
  w.M = wi.num_nodes * w.H;
  w.rows_here = min(Tr::kRows, w.M - wi.fold_begin);
  w.ctx_len = wi.kv_len - wi.num_nodes;
  w.num_tiles = (wi.kv_end - wi.kv_begin + Tr::kKeys - 1) / Tr::kKeys;
  StageQ(args, wi, w, cta);
  NamedBarSync(kBarQ, Tr::kMathThreads);
  const MathThread th(wg, t128, lane);
  float q_inv[4];  // the thread's rows' 2^-e (Q's latent scaling)
  LoadQInv(cta, th, q_inv);
  MathState ms;
  InitMathState(ms);
  MathTiles(args, wi, w, cta, th, q_inv, ms);
  Epilogue(args, wi, w, cta, th, ms);
#endif  // VERIFYD_KEYS_ON_M_BODY
}

absl::Status KeysOnMFp8Sm90::Launch(const VerifyKernelArgs& args, int grid, void* stream) {
  static std::atomic<uint64_t> configured_devices{0};
  return LaunchSm90aBody(&VerifyAttentionKeysOnMKernel, configured_devices, args, grid,
                         KeysOnMTraits::kThreads, kKeysOnMSmemBytes, stream);
}

}  // namespace verifyd::kernels::cuda::detail
