// The seesaw verify attention kernel (variant SeesawS64 in variants.h; sm_90a: H100 / H200):
// 64 folded rows per CTA, 64-key tiles, warp-specialised. kAuto's choice on sm_90 for every
// batch but tiny decode ones. Instantiated twice: the bf16 cache (kFp8 = false, described
// below) and the FP8 cache (SeesawFp8S64: the same math on f16 tiles that the math warpgroups
// convert from the rows its own producer, SeesawFp8Producer, lands; kAuto's FP8 choice for
// many-row batches). Same
// work items, partial-output and LSE contract as the mma.sync family, so the planner, the combine
// kernel and the tests are shared. Design, measurements and the reasoning behind the schedule:
// docs/KERNEL_NOTES.md. Shared memory: SeesawSmem (seesaw_layout.h). Compiled for every configured
// architecture; the kernel has a body only in the sm_90a build.
//
// CTA = 3 warpgroups (384 threads), one role each:
//   SeesawProducer (WG2, setmaxnreg 24)  16-byte cp.async gathers of Q [64 x 576] and of the
//        KV tiles [64 keys x 576] (page size 1: one row address per key, no TMA) into the
//        2-buffer ring, in three column groups per tile (A: atoms 0-3 = columns 0..255,
//        B: atoms 4-7, C: atom 8 = rope), each signalled with cp.async.mbarrier.arrive on
//        full[group][buffer]. A group is refilled once its readers released it (empty_a /
//        empty_bc): group A of buffer 0 is read only by WG0 (S0, P0 V0_L) and is released
//        in the middle of the pair, groups B/C of buffer 0 after WG1's P0 V0_R.
//   SeesawMathWg0 / SeesawMathWg1 (setmaxnreg 240)  the 64 x 512 fp32 output is split by
//        columns: WG0 owns O_L = columns [0, 256), WG1 owns O_R = [256, 512) (128 fp32 per
//        thread). Tiles come in pairs (t0 = 2p in buffer 0, t1 = 2p + 1 in buffer 1):
//          WG0: S0 = Q K0^T (36 wgmma k-steps, n64) -> softmax against the running max m:
//               m0 = max(m, rowmax S0), scale0 = 2^(m - m0), P0 = 2^(S0 - m0) -> P0 (bf16)
//               and (m0, scale0) to smem -> O_L = O_L*scale0 + P0 V0_L (P0 from registers)
//               -> wait for WG1's P1 -> O_L = O_L*scale1 + P1 V1_L (P1 from smem).
//          WG1: S1 = Q K1^T (in parallel with WG0's S0 / softmax / PV) -> wait for P0 ->
//               m1 = max(m0, rowmax S1), scale1 = 2^(m0 - m1), P1 = 2^(S1 - m1) -> P1 and
//               (m1, scale1) to smem -> O_R = (O_R*scale0 + P0 V0_R)*scale1 + P1 V1_R
//               (P0 is relative to m0, P1 to m1: the rescale sits between the products).
//        so one warpgroup's softmax runs while the other one's wgmmas keep the tensor pipe
//        busy, the scores never leave registers in fp32, and only bf16 P (8 KB) crosses.
//        Each warpgroup keeps its own row-sum partial (relative to the same running max).
//   SeesawEpilogue (both math warpgroups)  adds the row-sum partials, normalises, stages the
//        rows in the KV ring and stores each with one bulk copy; writes the LSE.
// Masking: only tiles that reach the request's tail keys or the end of the key range;
// tree-mask words are read from global memory only there.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/verify_attention/fold.cuh"
#include "kernels/cuda/verify_attention/kernel_args.cuh"
#include "kernels/cuda/verify_attention/ptx.cuh"
#include "kernels/cuda/verify_attention/seesaw_layout.h"
#include "kernels/cuda/verify_attention/variants.h"

// The kernel body (and every device helper) exists only in the sm_90a build.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define VERIFYD_SEESAW_BODY 1
#endif

namespace verifyd::kernels::cuda::detail {
namespace {
#ifdef VERIFYD_SEESAW_BODY

// Named barriers between the two math warpgroups (256 threads: one side arrives, the other
// syncs). 0 is __syncthreads.
// Reuse of P0 / m0 / scale0 and P1 / m1 / scale1 across pairs needs no barrier of its own:
// P lives in its KV buffer (refilled only after both warpgroups arrived on "empty"), and
// WG1 writes m1 / scale1 of pair p + 1 only after WG0's P0Ready of pair p + 1, which WG0
// arrives after it has read m1 / scale1 of pair p (m0 / scale0: symmetric, via P1Ready and
// the buffer-0 refill).
enum SeesawBarrier : int {
  kBarP0Ready = 1,   // WG0 -> WG1: P0, m0, scale0 of this pair are in smem
  kBarP1Ready = 2,   // WG1 -> WG0: P1, m1, scale1 of this pair are in smem
  kBarEpilogue = 3,  // both: row-sum partials exchanged
  kBarStore = 4,     // both: output rows staged in shared memory
  // FP8 variant: the 128 threads of one math warpgroup (5 + wg) after converting a tile.
  kBarConverted = 5,
};
constexpr int kMathThreads = SeesawTraits::kMathThreads;

// SeesawTraits plus the byte offsets of SeesawSmem's parts (the kernel addresses shared
// memory as base + offset: shared-window addresses for PTX operands).
struct Tr : SeesawTraits {
  static constexpr int kQOff = offsetof(SeesawSmem, q);
  static constexpr int kKvOff = offsetof(SeesawSmem, kv);
  static constexpr int kStageBytes = kAtoms * kAtom;  // one KV buffer
  static constexpr int kStatOff = offsetof(SeesawSmem, m0);
  static constexpr int kBarOff = offsetof(SeesawSmem, full);
};
static_assert(offsetof(SeesawSmem, kv[1]) == Tr::kKvOff + Tr::kStageBytes, "KV ring");
static_assert(offsetof(SeesawSmem, scale0) == Tr::kStatOff + 64 * 4 &&
                  offsetof(SeesawSmem, m1) == Tr::kStatOff + 128 * 4 &&
                  offsetof(SeesawSmem, scale1) == Tr::kStatOff + 192 * 4 &&
                  offsetof(SeesawSmem, l) == Tr::kStatOff + 256 * 4,
              "row statistics: s_m0 + 64 * i below");
static_assert(offsetof(SeesawSmem, empty_a) == Tr::kBarOff + 48 &&
                  offsetof(SeesawSmem, empty_bc) == Tr::kBarOff + 64 &&
                  offsetof(SeesawSmem, q_full) == Tr::kBarOff + 80,
              "mbarrier offsets used by the barrier accessors below");

// SeesawSmem's mbarriers by role (offsets asserted above). Who arrives on which: the kernel.
struct SeesawBarriers {
  uint32_t base;  // shared-window address of SeesawSmem::full
  __device__ uint32_t full(SeesawColumnGroup grp, int b) const { return base + 8u * (2 * grp + b); }
  __device__ uint32_t empty_a(int b) const { return base + 48u + 8u * b; }
  __device__ uint32_t empty_bc(int b) const { return base + 64u + 8u * b; }
  __device__ uint32_t q() const { return base + 80u; }
};

// Both producers copy rows 16 pw .. 16 pw + 15 of every 64-row tile with producer warp pw,
// four rows at a time: lane l copies 16-byte chunk `chunk` = l & 7 of each 128-byte atom row
// of row key_lane + 4 i, key_lane = 16 pw + (l >> 3), i = 0..3.

// Q [64 rows x 576] (bf16) into the swizzled Q tile at sQ; rows past the request zero-filled.
__device__ __forceinline__ void GatherQ(const VerifyKernelArgs& args, const VerifyWorkItem& wi,
                                        int rows_here, uint32_t sQ, int key_lane, int chunk) {
  const __nv_bfloat16* q_base =
      args.q + (static_cast<int64_t>(wi.q_row0) * args.num_heads + wi.fold_begin) * kQkDim;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = key_lane + 4 * i;
    const uint32_t off = r * 128 + ((chunk ^ (r & 7)) << 4);
    const __nv_bfloat16* src = q_base + min(r, rows_here - 1) * kQkDim + chunk * 8;
#pragma unroll
    for (int a = 0; a < Tr::kAtoms; ++a)
      CpAsync16(sQ + off + a * Tr::kAtom, src + a * 64, r < rows_here);
  }
}

// The slot ids of this lane's four rows of the tile whose first request-local key is `first`
// (idx: the work item's keys from kv_begin, plus key_lane); -1 past the work item's `keys`.
__device__ __forceinline__ void LoadTileSlots(const int32_t* idx, int key_lane, int keys, int first,
                                              int32_t (&slot)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
    slot[i] = key_lane + 4 * i + first < keys ? __ldg(idx + first + 4 * i) : -1;
}

// Scales one 64-key score tile into the log2 domain, masks it when needed and returns the
// row maxima (quad-reduced) of this thread's two rows. s: the wgmma m64n64 accumulator
// (element i: row 16*wl + g + 8*((i >> 1) & 1), key (i >> 2)*8 + 2*q4 + (i & 1)).
// The logits are s * softmax_scale * log2(e); in the FP8 variant s * sc[row] (sc: the
// factors of this thread's two rows, q_row_factor, which also undo the row's power of two).
template <bool kFp8>
__device__ __forceinline__ void ScaleMaskMax(float* s, const float* sc,
                                             const VerifyKernelArgs& args, const VerifyWorkItem& wi,
                                             int tile, int ctx_len, int M, int fold_row0, int q4,
                                             float* mx) {
  const int key0 = wi.kv_begin + tile * Tr::kKeys;  // request-local key of column 0
  const bool masked = (key0 + Tr::kKeys > ctx_len) || (key0 + Tr::kKeys > wi.kv_end);
  mx[0] = mx[1] = -INFINITY;
  if (!masked) {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      s[i] *= kFp8 ? sc[(i >> 1) & 1] : args.scale_log2;
      mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
    }
  } else {
    // Tree-mask words of the two rows (rows past the request see every key; never written).
    uint64_t w[2][2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int f = fold_row0 + 8 * h;
      w[h][0] = w[h][1] = ~0ull;
      if (f < M) {
        const uint64_t* mrow =
            args.tree_mask + static_cast<int64_t>(wi.q_row0 + f / args.num_heads) * args.mask_words;
        w[h][0] = __ldg(mrow);
        w[h][1] = args.mask_words > 1 ? __ldg(mrow + 1) : 0ull;
      }
    }
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int h = (i >> 1) & 1;
      const int key = key0 + (i >> 2) * 8 + q4 * 2 + (i & 1);
      bool vis = key < wi.kv_end;
      if (vis && key >= ctx_len) {
        const int t = key - ctx_len;
        vis = (((t >> 6) ? w[h][1] : w[h][0]) >> (t & 63)) & 1ull;
      }
      s[i] = vis ? s[i] * (kFp8 ? sc[h] : args.scale_log2) : -INFINITY;
      mx[h] = fmaxf(mx[h], s[i]);
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
  }
}

// s <- 2^(s - m) (0 where m is -inf: the row has seen nothing yet); returns this thread's
// partial sums of the two rows. m = max(running max, this tile) >= every s, so m = -inf
// only when every s of the row is -inf: subtracting 0 then gives 2^-inf = 0 without a
// per-element test.
__device__ __forceinline__ void Exp2Rows(float* s, const float* m, float* sum) {
  const float m_use[2] = {m[0] == -INFINITY ? 0.f : m[0], m[1] == -INFINITY ? 0.f : m[1]};
  sum[0] = sum[1] = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int h = (i >> 1) & 1;
    const float p = FastExp2(s[i] - m_use[h]);
    s[i] = p;
    sum[h] += p;
  }
}

// The running-max update factor 2^(m_old - m_new) (1 while both are -inf).
__device__ __forceinline__ float RescaleFactor(float m_old, float m_new) {
  return m_new == -INFINITY ? 1.f : exp2f(m_old - m_new);
}

// S[64 x 64] = Q K^T over the 576 columns (36 k16 steps, both operands K-major in smem).
// Progressive: the 16 k-steps of column group A (atoms 0-3) are issued as soon as that
// group has landed (full barrier full_a), those of B (atoms 4-7) and C (atom 8) after their
// own barriers (full_a + 16, + 32), so the tensor pipe starts while the rest of the tile is
// in flight. Returns with the wgmmas in flight (the caller waits). (With nvcc 13.0 this no
// longer makes ptxas serialise the wgmmas, as it did with the earlier register budget:
// ptxas only injects a warpgroup.arrive after each wait, C7519.)
// kFp8: the latent columns (groups A and B) were converted by this warpgroup just before
// (ConvertTileFp8: no wait); their 32 k-steps take f16 operands, the 4 rope steps bf16 (one
// fp32 accumulator: it does not care which 16-bit type fed it) after full C.
template <bool kFp8>
__device__ __forceinline__ void ComputeS(float* s, uint32_t sQ, uint32_t sK, uint32_t full_a,
                                         uint32_t parity) {
  // Descriptor address fields are addr >> 4 in 14 bits and smem < 256 KB: adding
  // (offset >> 4) to a base descriptor never carries out of the field.
  const uint64_t da0 = WgmmaDesc(sQ, 16, 1024);
  const uint64_t db0 = WgmmaDesc(sK, 16, 1024);
  if constexpr (!kFp8) {
    MbarWait(full_a, parity);
    FenceProxyAsyncShared();
  }
  WgmmaFence();
  if constexpr (kFp8) {
    WgmmaM64N64SmemAFirstF16(s, da0, db0);
  } else {
    WgmmaM64N64SmemAFirst(s, da0, db0);
  }
#pragma unroll
  for (int k = 1; k < 36; ++k) {
    if ((!kFp8 && k == 16) || k == 32) {
      MbarWait(full_a + (k == 16 ? 16u : 32u), parity);
      FenceProxyAsyncShared();
    }
    const uint32_t off = (k >> 2) * Tr::kAtom + (k & 3) * 32;
    if (kFp8 && k < 32) {
      WgmmaM64N64SmemAF16(s, da0 + (off >> 4), db0 + (off >> 4), 1);
    } else {
      WgmmaM64N64SmemA(s, da0 + (off >> 4), db0 + (off >> 4), 1);
    }
  }
  WgmmaCommit();
}

// P (bf16; f16 in the FP8 variant, whose V tile is f16) as wgmma A fragments: pa[j] covers
// keys 16j .. 16j + 15.
template <bool kFp8>
__device__ __forceinline__ void PackP(const float* s, uint32_t (&pa)[4][4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      if constexpr (kFp8) {
        __half2 v = __floats2half2_rn(s[8 * j + 2 * r], s[8 * j + 2 * r + 1]);
        pa[j][r] = *reinterpret_cast<uint32_t*>(&v);
      } else {
        __nv_bfloat162 v = __floats2bfloat162_rn(s[8 * j + 2 * r], s[8 * j + 2 * r + 1]);
        pa[j][r] = *reinterpret_cast<uint32_t*>(&v);
      }
    }
}

// Stores P into the 64 x 64 bf16 smem tile sP (one K-major 128-byte-swizzled atom: the
// wgmma A operand of the other warpgroup). Conflict-free: the 8 rows of a quad column land
// in 8 different 16-byte chunks.
__device__ __forceinline__ void StoreP(unsigned char* sP, const uint32_t (&pa)[4][4], int wl, int g,
                                       int q4) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int row = wl * 16 + g + 8 * (r & 1);
      const int chunk = 2 * j + (r >> 1);  // keys 8*chunk .. 8*chunk + 7
      *reinterpret_cast<uint32_t*>(sP + row * 128 + ((chunk ^ (row & 7)) << 4) + q4 * 4) = pa[j][r];
    }
}

__device__ __forceinline__ void ScaleO(float (&o)[2][64], const float* f) {
  if (__all_sync(0xffffffffu, f[0] == 1.f && f[1] == 1.f)) return;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
#pragma unroll
    for (int i = 0; i < 64; ++i) o[hf][i] *= f[(i >> 1) & 1];
}

// O[:, this warpgroup's 256 columns] += P V with P from registers. sV: the warpgroup's first
// V atom (columns 256*wg ..) of a KV buffer; V is read as an MN-major operand.
template <bool kFp8>
__device__ __forceinline__ void PvRegP(float (&o)[2][64], const uint32_t (&pa)[4][4], uint32_t sV) {
  const uint64_t dv0 = WgmmaDesc(sV, Tr::kAtom, 1024);
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const uint64_t dv = dv0 + ((hf * 2 * Tr::kAtom + j * 2048) >> 4);
      if constexpr (kFp8) {
        WgmmaM64N128RegAF16(o[hf], pa[j], dv, 1);
      } else {
        WgmmaM64N128RegA(o[hf], pa[j], dv, 1);
      }
    }
}

// Same with P from the smem tile sP (the other warpgroup's P).
template <bool kFp8>
__device__ __forceinline__ void PvSmemP(float (&o)[2][64], uint32_t sP, uint32_t sV) {
  const uint64_t dp0 = WgmmaDesc(sP, 16, 1024);
  const uint64_t dv0 = WgmmaDesc(sV, Tr::kAtom, 1024);
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const uint64_t dp = dp0 + ((j * 32) >> 4);
      const uint64_t dv = dv0 + ((hf * 2 * Tr::kAtom + j * 2048) >> 4);
      if constexpr (kFp8) {
        WgmmaM64N128SmemAVTransF16(o[hf], dp, dv);
      } else {
        WgmmaM64N128SmemAVTrans(o[hf], dp, dv);
      }
    }
}

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

// The FP8 producer warpgroup's whole job (see above).
__device__ __forceinline__ void SeesawFp8Producer(const VerifyKernelArgs& args, unsigned char* smem,
                                                  uint32_t base, const SeesawBarriers& bars) {
  const VerifyWorkItem wi = args.work[blockIdx.x];
  const int t128 = threadIdx.x & 127;
  const int lane = threadIdx.x & 31;
  const int pw = t128 >> 5;
  const int rows_here = min(Tr::kRows, wi.num_nodes * args.num_heads - wi.fold_begin);
  const uint32_t sQ = base + Tr::kQOff;
  const uint32_t sKV = base + Tr::kKvOff;
  const int sub = lane >> 3;
  const int chunk = lane & 7;
  const int key_lane = 16 * pw + sub;
  // ---- Q: GatherQ, then converted in place by the lanes that landed it ----
  {
    GatherQ(args, wi, rows_here, sQ, key_lane, chunk);
    CpAsyncCommit();
    CpAsyncWait<0>();
    float* row_factor = reinterpret_cast<float*>(smem + offsetof(SeesawFp8Smem, q_row_factor));
#pragma unroll 1
    for (int i = 0; i < 4; ++i) {
      const int r = key_lane + 4 * i;
      unsigned char* q = smem + Tr::kQOff + r * 128 + ((chunk ^ (r & 7)) << 4);
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
    MbarArrive(bars.q());
  }
  // ---- KV tiles ----
  const int num_tiles = (wi.kv_end - wi.kv_begin + Tr::kKeys - 1) / Tr::kKeys;
  const int keys = wi.kv_end - wi.kv_begin;
  const uint8_t* kv8 = reinterpret_cast<const uint8_t*>(args.kv);
  const uint32_t s_scale_land = base + offsetof(SeesawFp8Smem, scale_land);
  // Landing: the lanes' rows as in GatherQ, keeping those rows' slot ids (and the next tile's).
  const int32_t* idx = WorkItemKeys(args, wi) + wi.kv_begin + key_lane;
  int32_t slot[4];
  LoadTileSlots(idx, key_lane, keys, 0, slot);
  for (int t = 0; t < num_tiles; ++t) {
    const int b = t & 1;
    const uint32_t parity = ((t >> 1) - 1) & 1;  // buffer b last held tile t - 2
    const uint32_t dst = sKV + b * Tr::kStageBytes;
    int32_t cur[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) cur[i] = slot[i];
    LoadTileSlots(idx, key_lane, keys, (t + 1) * Tr::kKeys, slot);
    // The codes in atoms 0-3 (row r's 128-byte piece k in atom k, row r, 16-byte chunks
    // swizzled as the tiles are) and the scales in scale_land[b], once atoms 0-3 are free:
    // full A ("codes landed").
    if (t >= 2) MbarWait(bars.empty_a(b), parity);
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
    CpAsyncMbarArrive(bars.full(kGroupA, b));
    // The rope (stored bf16) straight into atom 8, once atoms 4-8 are free: full C.
    if (t >= 2) MbarWait(bars.empty_bc(b), parity);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = key_lane + 4 * i;
      const uint8_t* row =
          kv8 + static_cast<int64_t>(static_cast<uint32_t>(max(cur[i], 0))) * kFp8RowBytes;
      CpAsync16(dst + 8 * Tr::kAtom + r * 128 + ((chunk ^ (r & 7)) << 4),
                row + kFp8RopeOffset + 16 * chunk, cur[i] >= 0);
    }
    CpAsyncMbarArrive(bars.full(kGroupC, b));
  }
  CpAsyncCommit();
  CpAsyncWait<0>();  // no copies in flight when the warp exits
}

// Both math warpgroups: this warpgroup's row-sum partials (quad-reduced) into s_l[wg][row],
// then a barrier, after which s_l[0][r] + s_l[1][r] is the row's sum (a split's end and the
// final epilogue).
__device__ __forceinline__ void SeesawExchangeRowSums(const float (&l_run)[2], float* s_l, int wg,
                                                      int row0, int q4) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_run[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (q4 == 0) s_l[wg * 64 + row0 + 8 * h] = l;
  }
  NamedBarSync(kBarEpilogue, kMathThreads);
}

// Split j of a work item that holds several (VerifyWorkItem::split_keys), after the row-sum
// exchange: each thread writes its own fragment of the split's normalised rows (fp32) and,
// WG0, the log2 sum to partial row `base` + j * 64 + r, straight from registers (the KV ring,
// which the final epilogue stages through, is still streaming). Or, when the item folds
// (its range starts at the rows' first key), split j > 0 is folded into split 0's rows
// (fold.cuh, the combine's arithmetic): each thread reads back the fragment it wrote itself
// (no other thread touches it), and every thread of a row carries the fold's LSE in
// lse_fold[h] (all compute the same values).
__device__ __forceinline__ void SeesawWriteSplit(const VerifyKernelArgs& args,
                                                 const float (&o)[2][64], const float (&m_run)[2],
                                                 float (&lse_fold)[2], const float* s_l, int wg,
                                                 int row0, int q4, int rows_here, int64_t base,
                                                 int j, bool fold) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row0 + 8 * h;
    if (r < rows_here) {
      const float l_tot = s_l[r] + s_l[64 + r];  // the final epilogue's order
      const float inv = l_tot > 0.f ? 1.f / l_tot : 0.f;
      const float lse = SplitLse(m_run[h], l_tot);
      if (fold && j > 0) {
        const FoldWeights w = FoldWeightsOf(lse_fold[h], lse);
        float* frow = args.part_o + (base + r) * kVDim;
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int col0 = wg * 256 + hf * 128 + q4 * 2;
#pragma unroll
          for (int nb = 0; nb < 16; ++nb) {
            float2* f = reinterpret_cast<float2*>(frow + col0 + nb * 8);
            const float2 a = *f;
            *f = make_float2(FoldValue(w, a.x, o[hf][nb * 4 + 2 * h] * inv),
                             FoldValue(w, a.y, o[hf][nb * 4 + 2 * h + 1] * inv));
          }
        }
        lse_fold[h] = w.lse;
        if (wg == 0 && q4 == 0) args.part_lse[base + r] = w.lse;
      } else {
        const int64_t prow = base + static_cast<int64_t>(fold ? 0 : j) * Tr::kRows;
        float* orow = args.part_o + (prow + r) * kVDim;
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int col0 = wg * 256 + hf * 128 + q4 * 2;
#pragma unroll
          for (int nb = 0; nb < 16; ++nb) {
            *reinterpret_cast<float2*>(orow + col0 + nb * 8) =
                make_float2(o[hf][nb * 4 + 2 * h] * inv, o[hf][nb * 4 + 2 * h + 1] * inv);
          }
        }
        lse_fold[h] = lse;
        if (wg == 0 && q4 == 0) args.part_lse[prow + r] = lse;
      }
    }
  }
}

// The end of split j of a work item that holds several (not its last): both math warpgroups
// add their row sums (through s_l, as the final epilogue), write or fold the split
// (SeesawWriteSplit), then restart the softmax state, so the next split is computed from
// scratch exactly as a work item of its own would be: m_run = -inf makes the next pair's
// rescale factor 0 for every row that sees a key of its first tile (every written row of a
// context split), which clears O and the row sums there (a reset of O here would make ptxas
// spill the accumulators). Both warpgroups hold this split's final m_run (WG0 read m1 after
// P1). s_l reuse is ordered by the P-ready barriers of the pairs in between (as the final
// epilogue's).
__device__ __forceinline__ void SeesawFlushSplit(const VerifyKernelArgs& args, float (&o)[2][64],
                                                 float (&m_run)[2], float (&l_run)[2],
                                                 float (&lse_fold)[2], float* s_l, int wg, int row0,
                                                 int q4, int rows_here, int64_t base, int j,
                                                 bool fold) {
  SeesawExchangeRowSums(l_run, s_l, wg, row0, q4);
  SeesawWriteSplit(args, o, m_run, lse_fold, s_l, wg, row0, q4, rows_here, base, j, fold);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m_run[h] = -INFINITY;
    l_run[h] = 0.f;
  }
}
#endif  // VERIFYD_SEESAW_BODY

}  // namespace

// kFp8: the FP8-cache variant (SeesawFp8S64): its own producer (SeesawFp8Producer), each tile
// converted by the math warpgroup that computes its Q K^T (ConvertTileFp8), f16 latent
// operands, P in f16, Q rows with their own factor; the schedule is the same.
template <bool kFp8>
__global__ void __launch_bounds__(SeesawTraits::kThreads, 1)
    VerifyAttentionSeesawKernel(const VerifyKernelArgs args) {
#ifdef VERIFYD_SEESAW_BODY
  extern __shared__ unsigned char smem_raw[];
  // 128-byte swizzle atoms repeat every 1024 B: align the tiles to that.
  const uint32_t raw_addr = SmemAddr(smem_raw);
  const uint32_t base = (raw_addr + 1023u) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw_addr);
  const uint32_t sQ = base + Tr::kQOff;
  const uint32_t sKV = base + Tr::kKvOff;
  float* s_m0 = reinterpret_cast<float*>(smem + Tr::kStatOff);  // [64] per row
  float* s_scale0 = s_m0 + 64;
  float* s_m1 = s_m0 + 128;
  float* s_scale1 = s_m0 + 192;
  float* s_l = s_m0 + 256;  // [2][64]: each warpgroup's row sums
  const SeesawBarriers bars{base + Tr::kBarOff};
  // mbarriers. full[group][buffer] (group A = atoms 0-3, B = 4-7, C = 8), count 128: one
  // arrival per producer thread (cp.async-tracked; in the FP8 instance full A means the codes
  // and scales landed, and full B is unused: the math warpgroups convert). Empty barriers,
  // one arrival per math warp
  // that reads the part (the other warpgroup's reads are ordered before it through the
  // P-ready named barriers, see below):
  //   emptyA[0]  (buffer 0, atoms 0-3)  WG0 after P0 V0_L            count 4
  //   emptyBC[0] (buffer 0, atoms 4-8)  WG1 after P0 V0_R            count 4
  //   emptyA[1]  (buffer 1, atoms 0-3)  WG0 after P1 V1_L            count 4
  //   emptyBC[1] (buffer 1, atoms 4-8)  WG0 after P1 V1_L (P1 is in atom 8) and WG1 after
  //                                     P1 V1_R                     count 8
  // q (count 128): Q landed (FP8: and converted).

  GridDepLaunchDependents();
  const int tid = threadIdx.x;
  // Warp-uniform by construction; the shuffle lets the compiler know (wgmma in a branch the
  // compiler thinks divergent gets serialised).
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
  const int t128 = tid & 127;
  const int lane = tid & 31;

  if (tid == 0) {
    for (int i = 0; i < 6; ++i) MbarInit(bars.base + 8u * i, 128);
    MbarInit(bars.empty_a(0), 4);
    MbarInit(bars.empty_bc(0), 4);
    MbarInit(bars.empty_a(1), 4);
    MbarInit(bars.empty_bc(1), 8);
    MbarInit(bars.q(), 128);
  }
  __syncthreads();

  if constexpr (kFp8) {
    if (wg == 2) {
      SetMaxRegsDec<Tr::kProducerRegs>();
      SeesawFp8Producer(args, smem, base, bars);
      return;
    }
  }
  if (!kFp8 && wg == 2) {
    // ================= producer warpgroup: cp.async gathers =================
    SetMaxRegsDec<Tr::kProducerRegs>();
    // Everything is computed after the register split (values live across it would have
    // to fit the producer's 24 registers).
    const VerifyWorkItem wi = args.work[blockIdx.x];
    const int rows_here = min(Tr::kRows, wi.num_nodes * args.num_heads - wi.fold_begin);
    // Producer warp pw copies rows 16 pw .. 16 pw + 15 of each 64-row tile (Q, then every KV
    // tile), four at a time: lane l copies 16-byte chunk (l & 7) of each 128-byte atom row of
    // row 16 pw + 4 i + (l >> 3), i = 0..3, so one warp instruction moves four whole 128-byte
    // rows (coalesced) and each lane keeps its own four slot ids (no shuffles). The per-lane
    // destination offsets are fixed: the swizzle term (chunk ^ (row & 7)) depends only on the
    // lane and on i & 1 (16 pw is a multiple of 8); atom and i add immediates. The slot ids
    // of tile t + 1 are loaded while tile t is copied. (An L2 bulk prefetch of tile t + 1
    // issued after tile t's copies made the compute-bound shapes 5-15 % slower on the H200:
    // not done.)
    const int pw = t128 >> 5;
    const int sub = lane >> 3;   // row within a group of four
    const int chunk = lane & 7;  // 16-byte chunk within a 128-byte atom row
    const int key_lane = 16 * pw + sub;
    const uint32_t off_even = key_lane * 128 + ((chunk ^ sub) << 4);
    const uint32_t off_odd = key_lane * 128 + ((chunk ^ sub ^ 4) << 4);
    // Copies atoms [a0, a1) of this lane's four rows into the 64-row tile at `tile`; row i's
    // source is row_src(i) (an address inside the tensor even for invalid rows), zero-filled
    // where row_valid(i) is false.
    auto copy_rows = [&](uint32_t tile, int a0, int a1, auto row_valid, auto row_src) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const bool valid = row_valid(i);
        const __nv_bfloat16* src = row_src(i);
#pragma unroll
        for (int a = a0; a < a1; ++a)
          CpAsync16(tile + (i & 1 ? off_odd : off_even) + i * 512 + a * Tr::kAtom, src + a * 64,
                    valid);
      }
    };
    GatherQ(args, wi, rows_here, sQ, key_lane, chunk);
    CpAsyncMbarArrive(bars.q());
    const int num_tiles = (wi.kv_end - wi.kv_begin + Tr::kKeys - 1) / Tr::kKeys;
    const int32_t* idx = WorkItemKeys(args, wi) + wi.kv_begin + key_lane;
    const int keys = wi.kv_end - wi.kv_begin;
    const __nv_bfloat16* kv_lane = args.kv + chunk * 8;
    int32_t slot[4];
    LoadTileSlots(idx, key_lane, keys, 0, slot);
    for (int t = 0; t < num_tiles; ++t) {
      const int b = t & 1;
      const uint32_t dst = sKV + b * Tr::kStageBytes;
      const uint32_t parity = ((t >> 1) - 1) & 1;  // buffer b last held tile t - 2
      int32_t cur[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) cur[i] = slot[i];
      // Next tile's slot ids: in flight while this tile is copied.
      LoadTileSlots(idx, key_lane, keys, (t + 1) * Tr::kKeys, slot);
      // Row addresses are recomputed per column group (one IMAD each) rather than kept:
      // the producer has 24 registers.
      auto copy_atoms = [&](int a0, int a1) {
        // Keys past the range (slot -1) are zero-filled (and masked).
        copy_rows(
            dst, a0, a1, [&](int i) { return cur[i] >= 0; },
            [&](int i) {
              return kv_lane + static_cast<int64_t>(static_cast<uint32_t>(max(cur[i], 0))) * kQkDim;
            });
      };
      if (t >= 2) MbarWait(bars.empty_a(b), parity);
      copy_atoms(0, 4);
      CpAsyncMbarArrive(bars.full(kGroupA, b));
      if (t >= 2) MbarWait(bars.empty_bc(b), parity);
      copy_atoms(4, 8);
      CpAsyncMbarArrive(bars.full(kGroupB, b));
      copy_atoms(8, 9);
      CpAsyncMbarArrive(bars.full(kGroupC, b));
    }
    CpAsyncWait<0>();  // no copies in flight when the warp exits
    return;
  }

  // ================= math warpgroups =================
  SetMaxRegsInc<Tr::kMathRegs>();
  const VerifyWorkItem wi = args.work[blockIdx.x];
  const int H = args.num_heads;
  const int M = wi.num_nodes * H;
  const int rows_here = min(Tr::kRows, M - wi.fold_begin);
  const int ctx_len = wi.kv_len - wi.num_nodes;
  const int num_tiles = (wi.kv_end - wi.kv_begin + Tr::kKeys - 1) / Tr::kKeys;
  const int num_pairs = (num_tiles + 1) / 2;
  // Several splits in this item (bf16 instance only): a split ends every split_pairs pairs
  // (split_keys is a multiple of 128 keys, two tiles).
  const int split_pairs = kFp8 ? 0 : wi.split_keys / (2 * Tr::kKeys);
  const int wl = t128 >> 5;  // warp in the warpgroup: rows 16 wl ..
  const int g = lane >> 2;
  const int q4 = lane & 3;
  const int row0 = wl * 16 + g;  // this thread's rows: row0, row0 + 8
  const int fold_row0 = wi.fold_begin + row0;

  float o[2][64];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
#pragma unroll
    for (int i = 0; i < 64; ++i) o[hf][i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};     // running max (log2 domain), same in both WGs
  float l_run[2] = {0.f, 0.f};                 // this warpgroup's partial row sums
  float lse_fold[2] = {0.f, 0.f};              // a folding split group: the fold's log2 LSE so far
  const uint32_t sV_own = wg * 4 * Tr::kAtom;  // first V atom of this warpgroup's columns

  // FP8: the landed scales, [buffer][row][4] (SeesawFp8Smem::scale_land).
  const float* fp8_scales = nullptr;
  if constexpr (kFp8)
    fp8_scales = reinterpret_cast<const float*>(smem + offsetof(SeesawFp8Smem, scale_land));
  MbarWait(bars.q(), 0);
  // This thread's two rows' logit factors (FP8: written by the producer before q_bar).
  float sc[2] = {0.f, 0.f};
  if constexpr (kFp8) {
    const float* row_factor =
        reinterpret_cast<const float*>(smem + offsetof(SeesawFp8Smem, q_row_factor));
    sc[0] = row_factor[row0];
    sc[1] = row_factor[row0 + 8];
  }

  for (int p = 0; p < num_pairs; ++p) {
    const int t0 = 2 * p;
    const int t1 = 2 * p + 1;
    const bool has1 = t1 < num_tiles;
    const uint32_t sK0 = sKV;
    const uint32_t sK1 = sKV + Tr::kStageBytes;
    const uint32_t sP0 = sK0 + Tr::kPAtom * Tr::kAtom;  // P0 / P1: see SeesawTraits::kPAtom
    const uint32_t sP1 = sK1 + Tr::kPAtom * Tr::kAtom;
    if (wg == 0) {
      // ---- S0 = Q K0^T ----
      float s[32];
      if constexpr (kFp8) {
        // Tile t0's codes have landed (full A) and WG1 no longer reads atoms 4-8 of tile
        // t0 - 2 (empty_bc): convert, then the whole warpgroup's stores before its wgmmas.
        MbarWait(bars.full(kGroupA, 0), p & 1);
        if (p >= 1) MbarWait(bars.empty_bc(0), (p - 1) & 1);
        ConvertTileFp8(smem + Tr::kKvOff, fp8_scales, wl, lane);
        FenceProxyAsyncShared();
        NamedBarSync(kBarConverted, 128);
      }
      ComputeS<kFp8>(s, sQ, sK0, bars.full(kGroupA, 0), p & 1);
      WgmmaWait<0>();
      // ---- softmax against the running max ----
      float mx[2], m0[2], scale0[2], sum[2];
      ScaleMaskMax<kFp8>(s, sc, args, wi, t0, ctx_len, M, fold_row0, q4, mx);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        m0[h] = fmaxf(m_run[h], mx[h]);
        scale0[h] = RescaleFactor(m_run[h], m0[h]);
      }
      Exp2Rows(s, m0, sum);
#pragma unroll
      for (int h = 0; h < 2; ++h) l_run[h] = l_run[h] * scale0[h] + sum[h];
      uint32_t pa[4][4];
      PackP<kFp8>(s, pa);
      // ---- hand P0, m0, scale0 to WG1 ----
      StoreP(smem + (sP0 - base), pa, wl, g, q4);
      if (q4 == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          s_m0[row0 + 8 * h] = m0[h];
          s_scale0[row0 + 8 * h] = scale0[h];
        }
      }
      FenceProxyAsyncShared();  // P0 is read by WG1's wgmma (async proxy)
      NamedBarArrive(kBarP0Ready, kMathThreads);
      // ---- O_L = O_L * scale0 + P0 V0_L ----
      ScaleO(o, scale0);
      WgmmaFence();
      PvRegP<kFp8>(o, pa, sK0 + sV_own);
      WgmmaCommit();
      WgmmaWait<0>();
      // Buffer 0, atoms 0-3: nobody else reads them; the producer may refill them now.
      if (lane == 0) MbarArrive(bars.empty_a(0));
      // ---- WG1's P1: O_L = O_L * scale1 + P1 V1_L ----
      NamedBarSync(kBarP1Ready, kMathThreads);
      // V1 landed by cp.async (generic proxy) is read below by wgmma, and this warpgroup never
      // waited on buffer 1's full barriers itself: order the two proxies on this side too.
      FenceProxyAsyncShared();
      float scale1[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        scale1[h] = s_scale1[row0 + 8 * h];
        m_run[h] = s_m1[row0 + 8 * h];
      }
      if (has1) {
#pragma unroll
        for (int h = 0; h < 2; ++h) l_run[h] *= scale1[h];
        ScaleO(o, scale1);
        WgmmaFence();
        PvSmemP<kFp8>(o, sP1, sK1 + sV_own);
        WgmmaCommit();
        WgmmaWait<0>();
        if (lane == 0) {
          MbarArrive(bars.empty_a(1));   // WG1's S1 reads are ordered before P1Ready
          MbarArrive(bars.empty_bc(1));  // P1 (atom 8) read
        }
      }
    } else {
      // ---- S1 = Q K1^T (overlaps WG0's softmax / PV) ----
      float s[32];
      if (has1) {
        if constexpr (kFp8) {
          // Tile t1's codes have landed (WG0's reads of atoms 0-3 ended before they could land:
          // empty_a) and every warp of this warpgroup finished P1 V1_R of the last pair, the
          // last read of atoms 4-7 (empty_bc: the warps of a warpgroup are not in step, and a
          // warp that got here could otherwise overwrite V rows another warp's wgmma still
          // reads): convert.
          MbarWait(bars.full(kGroupA, 1), p & 1);
          if (p >= 1) MbarWait(bars.empty_bc(1), (p - 1) & 1);
          ConvertTileFp8(smem + Tr::kKvOff + Tr::kStageBytes, fp8_scales + Tr::kRows * 4, wl, lane);
          FenceProxyAsyncShared();
          NamedBarSync(kBarConverted + 1, 128);
        }
        ComputeS<kFp8>(s, sQ, sK1, bars.full(kGroupA, 1), p & 1);
        WgmmaWait<0>();
      }
      // ---- WG0's m0 / scale0, then softmax of S1 against m0 ----
      NamedBarSync(kBarP0Ready, kMathThreads);
      float m0[2], scale0[2], m1[2], scale1[2], sum[2] = {0.f, 0.f};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        m0[h] = s_m0[row0 + 8 * h];
        scale0[h] = s_scale0[row0 + 8 * h];
        m1[h] = m0[h];
        scale1[h] = 1.f;
      }
      uint32_t pa[4][4];
      if (has1) {
        float mx[2];
        ScaleMaskMax<kFp8>(s, sc, args, wi, t1, ctx_len, M, fold_row0, q4, mx);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          m1[h] = fmaxf(m0[h], mx[h]);
          scale1[h] = RescaleFactor(m0[h], m1[h]);
        }
        Exp2Rows(s, m1, sum);
        PackP<kFp8>(s, pa);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        l_run[h] = l_run[h] * (scale0[h] * scale1[h]) + sum[h];
        m_run[h] = m1[h];
      }
      // ---- hand P1, m1, scale1 to WG0 ----
      if (has1) StoreP(smem + (sP1 - base), pa, wl, g, q4);
      if (q4 == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          s_m1[row0 + 8 * h] = m1[h];
          s_scale1[row0 + 8 * h] = scale1[h];
        }
      }
      // P1 is read by WG0's wgmma; V0 (cp.async, never waited on by this warpgroup) is read
      // by this warpgroup's wgmma below.
      FenceProxyAsyncShared();
      NamedBarArrive(kBarP1Ready, kMathThreads);
      // ---- O_R = (O_R * scale0 + P0 V0_R) * scale1 + P1 V1_R ----
      // P0 is relative to m0, P1 to m1: the P0 product must be rescaled by scale1 before P1's
      // is added, so the two PV products of this warpgroup are waited for in between.
      ScaleO(o, scale0);
      WgmmaFence();
      PvSmemP<kFp8>(o, sP0, sK0 + sV_own);
      WgmmaCommit();
      WgmmaWait<0>();
      // Buffer 0, atoms 4-8 (V0_R, P0): WG0's reads (S0) and writes (P0) precede P0Ready.
      if (lane == 0) MbarArrive(bars.empty_bc(0));
      if (has1) {
        ScaleO(o, scale1);
        WgmmaFence();  // also orders this thread's pa writes before the wgmma reads them
        PvRegP<kFp8>(o, pa, sK1 + sV_own);
        WgmmaCommit();
        WgmmaWait<0>();
        if (lane == 0) MbarArrive(bars.empty_bc(1));
      }
    }
    if constexpr (!kFp8) {
      if (split_pairs > 0 && (p + 1) % split_pairs == 0 && p + 1 < num_pairs) {
        SeesawFlushSplit(args, o, m_run, l_run, lse_fold, s_l, wg, row0, q4, rows_here,
                         LoadFresh(&args.work[blockIdx.x].partial_row), (p + 1) / split_pairs - 1,
                         LoadFresh(&args.work[blockIdx.x].kv_begin) == 0);
      }
    }
  }

  // ---- epilogue: add the two warpgroups' row sums, normalise, write ----
  SeesawExchangeRowSums(l_run, s_l, wg, row0, q4);
  if constexpr (!kFp8) {
    // A folding split group: its last split folds from registers too (split 0's rows were
    // written by these threads' generic stores; no bulk copy mixes in).
    if (split_pairs > 0 && LoadFresh(&args.work[blockIdx.x].kv_begin) == 0) {
      SeesawWriteSplit(args, o, m_run, lse_fold, s_l, wg, row0, q4, rows_here,
                       LoadFresh(&args.work[blockIdx.x].partial_row), (num_pairs - 1) / split_pairs,
                       /*fold=*/true);
      return;
    }
  }
  // The output coordinates are re-read here rather than kept live across the loop (at 240
  // registers that would cost a spill).
  int partial_row = LoadFresh(&args.work[blockIdx.x].partial_row);
  const bool direct = partial_row < 0;
  if constexpr (!kFp8) {
    if (split_pairs > 0 && !direct) partial_row += ((num_pairs - 1) / split_pairs) * Tr::kRows;
  }
  const int64_t out_row0 =
      static_cast<int64_t>(LoadFresh(&args.work[blockIdx.x].q_row0)) * H + wi.fold_begin;
  // The rows are staged in shared memory (the KV buffers: every wgmma that read them has
  // completed, each warpgroup waited for its own before the barrier above) and stored with
  // one bulk copy per row: a store from registers would be 64 scattered 8-byte (or 4-byte)
  // stores per thread, which stalled the split CTAs of short contexts on the LSU. Row
  // strides of 2080 (fp32) and 1040 (bf16) bytes keep the register -> smem writes free of
  // bank conflicts and every row 16-byte aligned.
  const int stride = direct ? 1040 : 2080;
  unsigned char* stage = smem + Tr::kKvOff;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row0 + 8 * h;
    if (r >= rows_here) continue;
    // Same order in both warpgroups: identical l.
    const float l_tot = s_l[r] + s_l[64 + r];
    const float inv = l_tot > 0.f ? 1.f / l_tot : 0.f;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int col0 = wg * 256 + hf * 128 + q4 * 2;
      if (direct) {
        __nv_bfloat16* srow = reinterpret_cast<__nv_bfloat16*>(stage + r * stride) + col0;
#pragma unroll
        for (int nb = 0; nb < 16; ++nb) {
          *reinterpret_cast<__nv_bfloat162*>(srow + nb * 8) =
              __floats2bfloat162_rn(o[hf][nb * 4 + 2 * h] * inv, o[hf][nb * 4 + 2 * h + 1] * inv);
        }
      } else {
        float* srow = reinterpret_cast<float*>(stage + r * stride) + col0;
#pragma unroll
        for (int nb = 0; nb < 16; ++nb) {
          *reinterpret_cast<float2*>(srow + nb * 8) =
              make_float2(o[hf][nb * 4 + 2 * h] * inv, o[hf][nb * 4 + 2 * h + 1] * inv);
        }
      }
    }
    if (wg == 0 && q4 == 0) {
      const float lse2 = SplitLse(m_run[h], l_tot);
      if (direct) {
        if (args.lse != nullptr) args.lse[out_row0 + r] = lse2 * 0.69314718055994531f;
      } else {
        args.part_lse[partial_row + r] = lse2;
      }
    }
  }
  FenceProxyAsyncShared();  // the staged rows are read by the bulk copies (async proxy)
  NamedBarSync(kBarStore, kMathThreads);
  if (tid < rows_here) {
    const uint32_t src = sKV + tid * stride;
    if (direct) {
      BulkStore(args.out + (out_row0 + tid) * kVDim, src, kVDim * 2);
    } else {
      BulkStore(args.part_o + static_cast<int64_t>(partial_row + tid) * kVDim, src, kVDim * 4);
    }
    // The copies must have read shared memory before the CTA exits and frees it.
    BulkCommit();
    BulkWaitRead0();
  }
#endif  // VERIFYD_SEESAW_BODY
}

absl::Status SeesawS64::Launch(const VerifyKernelArgs& args, int grid, void* stream) {
  static std::atomic<uint64_t> configured_devices{0};
  return LaunchSm90aBody(&VerifyAttentionSeesawKernel<false>, configured_devices, args, grid,
                         SeesawTraits::kThreads, kSeesawSmemBytes, stream);
}

absl::Status SeesawFp8S64::Launch(const VerifyKernelArgs& args, int grid, void* stream) {
  static std::atomic<uint64_t> configured_devices{0};
  return LaunchSm90aBody(&VerifyAttentionSeesawKernel<true>, configured_devices, args, grid,
                         SeesawTraits::kThreads, kSeesawFp8SmemBytes, stream);
}

}  // namespace verifyd::kernels::cuda::detail
