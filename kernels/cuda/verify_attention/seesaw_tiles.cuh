// The seesaw verify attention kernel's shared pieces (the kernel and its schedule: seesaw.cu):
// its named barriers, the shared-memory addressing of SeesawSmem (seesaw_layout.h) by offset
// (Tr), its mbarriers (SeesawBarriers) and the aligned CTA view (SeesawCta), and the tile-level
// steps the roles are built of: the producers' Q gather and slot-id loads, Q K^T, the softmax
// of a score tile, P's packing and hand-off store, and the P V products.
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
              "row statistics: SeesawCta::s_m0() + 64 * i below");
static_assert(offsetof(SeesawSmem, empty_a) == Tr::kBarOff + 48 &&
                  offsetof(SeesawSmem, empty_bc) == Tr::kBarOff + 64 &&
                  offsetof(SeesawSmem, q_full) == Tr::kBarOff + 80,
              "mbarrier offsets used by the barrier accessors below");

// SeesawSmem's mbarriers by role (offsets asserted above). Who arrives on which:
// SeesawInitBarriers (seesaw_roles.cuh).
struct SeesawBarriers {
  uint32_t base;  // shared-window address of SeesawSmem::full
  __device__ uint32_t full(SeesawColumnGroup grp, int b) const { return base + 8u * (2 * grp + b); }
  __device__ uint32_t empty_a(int b) const { return base + 48u + 8u * b; }
  __device__ uint32_t empty_bc(int b) const { return base + 64u + 8u * b; }
  __device__ uint32_t q() const { return base + 80u; }
};

// SeesawSmem at the first 1024-byte boundary of the dynamic shared memory (128-byte swizzle
// atoms repeat every 1024 B): its shared-window address (PTX operands: base + offset), its
// generic pointer, its mbarriers, and the addresses of its parts the roles use.
struct SeesawCta {
  uint32_t base;        // shared-window address of the aligned SeesawSmem
  unsigned char* smem;  // its generic pointer
  SeesawBarriers bars;

  __device__ uint32_t sQ() const { return base + Tr::kQOff; }
  // KV buffer b (tile t lives in buffer t & 1) and P of its tile (SeesawTraits::kPAtom).
  __device__ uint32_t kv(int b) const { return base + Tr::kKvOff + b * Tr::kStageBytes; }
  __device__ uint32_t p(int b) const { return kv(b) + Tr::kPAtom * Tr::kAtom; }
  // Row statistics handed between the math warpgroups, [64] per row (SeesawSmem::m0 ..), and
  // s_l: [2][64], each math warpgroup's row sums.
  __device__ float* s_m0() const { return reinterpret_cast<float*>(smem + Tr::kStatOff); }
  __device__ float* s_scale0() const { return s_m0() + 64; }
  __device__ float* s_m1() const { return s_m0() + 128; }
  __device__ float* s_scale1() const { return s_m0() + 192; }
  __device__ float* s_l() const { return s_m0() + 256; }
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

// The slot ids of this lane's four rows of a tile: idx points at the lane's first row's key of
// the tile (the work item's keys from kv_begin, plus key_lane and the tile's first key), left
// is how many of the work item's keys there are from that one on; -1 past the work item.
__device__ __forceinline__ void LoadTileSlots(const int32_t* idx, int left, int32_t (&slot)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) slot[i] = 4 * i < left ? __ldg(idx + 4 * i) : -1;
}

// A producer lane's slot ids, one tile ahead: construction loads the first tile's; Next hands
// over the current tile's and loads the next tile's (in flight while the current one is
// copied). The key count runs down with the key pointer: the producers have 24 registers, and
// keeping the lane's key index and the work item's key count instead cost two stack slots.
struct TileSlotStream {
  const int32_t* idx;  // the lane's first row's key of the next tile
  int left;            // the work item's keys from that one on
  int32_t slot[4];     // the next tile's slot ids

  __device__ TileSlotStream(const VerifyKernelArgs& args, const VerifyWorkItem& wi, int key_lane)
      : idx(WorkItemKeys(args, wi) + wi.kv_begin + key_lane),
        left(wi.kv_end - wi.kv_begin - key_lane) {
    LoadTileSlots(idx, left, slot);
  }
  __device__ void Next(int32_t (&cur)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) cur[i] = slot[i];
    idx += Tr::kKeys;
    left -= Tr::kKeys;
    LoadTileSlots(idx, left, slot);
  }
};

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
#endif  // VERIFYD_SEESAW_BODY
}  // namespace
}  // namespace verifyd::kernels::cuda::detail
