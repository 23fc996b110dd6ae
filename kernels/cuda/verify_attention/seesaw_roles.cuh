// The roles of the seesaw verify attention kernel's warpgroups (the kernel and its schedule:
// seesaw.cu), as the kernel calls them: the mbarriers' set-up (SeesawInitBarriers), the bf16
// producer (SeesawProducer; the FP8 one: seesaw_fp8.cuh), the math warpgroups' set-up, their
// steps of a tile pair (SeesawMathWg0 / SeesawMathWg1, built of the phases below), a split's
// flush after a pair (SeesawEndOfPair), and the epilogue (SeesawEpilogue). A math thread's
// fixed coordinates are a SeesawMathThread, its running softmax state a SeesawMathState,
// passed by reference; every function is inlined into the kernel.
// Internal CUDA header, included by seesaw.cu only: the device code exists only in the sm_90a
// build (VERIFYD_SEESAW_BODY) and has internal linkage. Thread-safety: n/a (device code).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/verify_attention/fold.cuh"
#include "kernels/cuda/verify_attention/kernel_args.cuh"
#include "kernels/cuda/verify_attention/ptx.cuh"
#include "kernels/cuda/verify_attention/seesaw_fp8.cuh"
#include "kernels/cuda/verify_attention/seesaw_layout.h"
#include "kernels/cuda/verify_attention/seesaw_tiles.cuh"

namespace verifyd::kernels::cuda::detail {
namespace {
#ifdef VERIFYD_SEESAW_BODY

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
__device__ __forceinline__ void SeesawInitBarriers(const SeesawBarriers& bars) {
  for (int i = 0; i < 6; ++i) MbarInit(bars.base + 8u * i, 128);
  MbarInit(bars.empty_a(0), 4);
  MbarInit(bars.empty_bc(0), 4);
  MbarInit(bars.empty_a(1), 4);
  MbarInit(bars.empty_bc(1), 8);
  MbarInit(bars.q(), 128);
}

// ================= producer warpgroup (bf16 cache): cp.async gathers =================

// Copies atoms [a0, a1) of this producer lane's four rows of a KV tile into the 64-row tile at
// `dst` (SeesawProducer: row i at dst + off_even + 512 i, the odd rows with bit 6 flipped: their
// swizzle chunk differs in bit 2, and dst and 512 i leave that bit clear); row i's slot id is
// cur[i], a key past the range (slot -1) is zero-filled (and masked), its source address stays
// inside the tensor. The producer has 24 registers: its tile loop holds the four row addresses,
// the next tile's slot ids (TileSlotStream), the key pointer and count and one row offset (the
// odd rows' offset is derived here: kept, it was one of two values ptxas put on the stack).
__device__ __forceinline__ void SeesawCopyKvAtoms(uint32_t dst, int a0, int a1,
                                                  const int32_t (&cur)[4],
                                                  const __nv_bfloat16* kv_lane, uint32_t off_even) {
  const uint32_t row_even = dst + off_even;
  const uint32_t row_odd = row_even ^ 64u;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const bool valid = cur[i] >= 0;
    const __nv_bfloat16* src =
        kv_lane + static_cast<int64_t>(static_cast<uint32_t>(max(cur[i], 0))) * kQkDim;
#pragma unroll
    for (int a = a0; a < a1; ++a)
      CpAsync16((i & 1 ? row_odd : row_even) + i * 512 + a * Tr::kAtom, src + a * 64, valid);
  }
}

// The bf16 producer warpgroup's whole job, after its register split (t128: thread in the
// warpgroup): Q, then every KV tile in three column groups (A, B, C), each group once its
// readers released it.
__device__ __forceinline__ void SeesawProducer(const VerifyKernelArgs& args, const SeesawCta& cta,
                                               int t128, int lane) {
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
  GatherQ(args, wi, rows_here, cta.sQ(), key_lane, chunk);
  CpAsyncMbarArrive(cta.bars.q());
  const int num_tiles = (wi.kv_end - wi.kv_begin + Tr::kKeys - 1) / Tr::kKeys;
  TileSlotStream slots(args, wi, key_lane);
  const __nv_bfloat16* kv_lane = args.kv + chunk * 8;
  for (int t = 0; t < num_tiles; ++t) {
    const int b = t & 1;
    const uint32_t dst = cta.kv(b);
    const uint32_t parity = ((t >> 1) - 1) & 1;  // buffer b last held tile t - 2
    int32_t cur[4];
    slots.Next(cur);
    if (t >= 2) MbarWait(cta.bars.empty_a(b), parity);
    SeesawCopyKvAtoms(dst, 0, 4, cur, kv_lane, off_even);
    CpAsyncMbarArrive(cta.bars.full(kGroupA, b));
    if (t >= 2) MbarWait(cta.bars.empty_bc(b), parity);
    SeesawCopyKvAtoms(dst, 4, 8, cur, kv_lane, off_even);
    CpAsyncMbarArrive(cta.bars.full(kGroupB, b));
    SeesawCopyKvAtoms(dst, 8, 9, cur, kv_lane, off_even);
    CpAsyncMbarArrive(cta.bars.full(kGroupC, b));
  }
  CpAsyncWait<0>();  // no copies in flight when the warp exits
}

// ================= math warpgroups =================

// A math thread's fixed coordinates for its work item.
struct SeesawMathThread {
  VerifyWorkItem wi;  // the work item (its output coordinates are re-read at the end)
  int H;              // heads
  int M;              // the request's folded rows (num_nodes * H)
  int rows_here;      // rows of this CTA
  int ctx_len;        // context keys (the tail keys after them are tree-masked)
  int num_tiles;
  int num_pairs;
  int split_pairs;  // pairs per split of a work item that holds several; 0: one range
  int tid;          // 0 .. 255
  int wg;           // math warpgroup: 0 or 1 (warp-uniform)
  int wl;           // warp in the warpgroup: rows 16 wl ..
  int lane;
  int g;            // lane / 4
  int q4;           // lane % 4
  int row0;         // this thread's rows: row0, row0 + 8
  int fold_row0;    // wi.fold_begin + row0
  uint32_t sV_own;  // first V atom of this warpgroup's columns (offset in a KV buffer)
  float sc[2];      // FP8: the two rows' logit factors (q_row_factor), read by SeesawWaitQ
};

// A math thread's running softmax state over its work item (or over its current split). (The
// field order decides the order in which the compiler promotes them to registers; this one
// comes closest to the code of the kernel before its roles were functions.)
struct SeesawMathState {
  float lse_fold[2];  // a folding split group: the fold's log2 LSE so far
  float l_run[2];     // this warpgroup's partial row sums
  float m_run[2];     // running max (log2 domain), same in both WGs
  float o[2][64];     // O[:, this warpgroup's 256 columns]: the thread's fragments
};

template <bool kFp8>
__device__ __forceinline__ SeesawMathThread SeesawMathThreadOf(const VerifyKernelArgs& args,
                                                               int tid, int wg, int t128,
                                                               int lane) {
  SeesawMathThread th;
  th.wi = args.work[blockIdx.x];
  th.H = args.num_heads;
  th.M = th.wi.num_nodes * th.H;
  th.rows_here = min(Tr::kRows, th.M - th.wi.fold_begin);
  th.ctx_len = th.wi.kv_len - th.wi.num_nodes;
  th.num_tiles = (th.wi.kv_end - th.wi.kv_begin + Tr::kKeys - 1) / Tr::kKeys;
  th.num_pairs = (th.num_tiles + 1) / 2;
  // Several splits in this item (bf16 instance only): a split ends every split_pairs pairs
  // (split_keys is a multiple of 128 keys, two tiles).
  th.split_pairs = kFp8 ? 0 : th.wi.split_keys / (2 * Tr::kKeys);
  th.tid = tid;
  th.wg = wg;
  th.wl = t128 >> 5;
  th.lane = lane;
  th.g = th.lane >> 2;
  th.q4 = th.lane & 3;
  th.row0 = th.wl * 16 + th.g;
  th.fold_row0 = th.wi.fold_begin + th.row0;
  th.sV_own = wg * 4 * Tr::kAtom;
  return th;
}

__device__ __forceinline__ void InitSeesawMathState(SeesawMathState& st) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
#pragma unroll
    for (int i = 0; i < 64; ++i) st.o[hf][i] = 0.f;
  st.m_run[0] = st.m_run[1] = -INFINITY;
  st.l_run[0] = st.l_run[1] = 0.f;
  st.lse_fold[0] = st.lse_fold[1] = 0.f;
}

// Waits for Q (FP8: and its conversion); FP8: reads this thread's two rows' logit factors
// (written by the producer before q_bar).
template <bool kFp8>
__device__ __forceinline__ void SeesawWaitQ(const SeesawCta& cta, SeesawMathThread& th) {
  MbarWait(cta.bars.q(), 0);
  th.sc[0] = th.sc[1] = 0.f;
  if constexpr (kFp8) {
    const float* row_factor =
        reinterpret_cast<const float*>(cta.smem + offsetof(SeesawFp8Smem, q_row_factor));
    th.sc[0] = row_factor[th.row0];
    th.sc[1] = row_factor[th.row0 + 8];
  }
}

// S = Q K^T of the pair's tile in buffer kBuf, computed by WG kBuf, waited for. FP8: the tile's
// codes have landed (full A) and its atoms 4-8 are free (empty_bc of tile t - 2: for WG0 that is
// WG1's last read of them; for WG1 every warp of this warpgroup finished P1 V1_R of the last pair,
// the last read of atoms 4-7 -- the warps of a warpgroup are not in step, and a warp that got here
// could otherwise overwrite V rows another warp's wgmma still reads; WG0's reads of atoms 0-3 ended
// before the codes could land: empty_a): convert, then the whole warpgroup's stores before its
// wgmmas.
template <bool kFp8, int kBuf>
__device__ __forceinline__ void SeesawScoreTile(float (&s)[32], const SeesawCta& cta,
                                                const SeesawMathThread& th, int p) {
  constexpr int b = kBuf;
  if constexpr (kFp8) {
    MbarWait(cta.bars.full(kGroupA, b), p & 1);
    if (p >= 1) MbarWait(cta.bars.empty_bc(b), (p - 1) & 1);
    // The landed scales, [buffer][row][4] (SeesawFp8Smem::scale_land).
    const float* fp8_scales =
        reinterpret_cast<const float*>(cta.smem + offsetof(SeesawFp8Smem, scale_land));
    ConvertTileFp8(cta.smem + Tr::kKvOff + b * Tr::kStageBytes, fp8_scales + b * Tr::kRows * 4,
                   th.wl, th.lane);
    FenceProxyAsyncShared();
    NamedBarSync(kBarConverted + b, 128);
  }
  ComputeS<kFp8>(s, cta.sQ(), cta.kv(b), cta.bars.full(kGroupA, b), p & 1);
  WgmmaWait<0>();
}

// WG0: softmax of S0 (tile t0) against the running max: m0 = max(m, rowmax S0),
// scale0 = 2^(m - m0), P0 = 2^(S0 - m0) packed into pa; the row sums rescaled and added.
template <bool kFp8>
__device__ __forceinline__ void SeesawSoftmaxS0(const VerifyKernelArgs& args,
                                                const SeesawMathThread& th, SeesawMathState& st,
                                                float (&s)[32], int t0, float (&m0)[2],
                                                float (&scale0)[2], uint32_t (&pa)[4][4]) {
  float mx[2], sum[2];
  ScaleMaskMax<kFp8>(s, th.sc, args, th.wi, t0, th.ctx_len, th.M, th.fold_row0, th.q4, mx);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m0[h] = fmaxf(st.m_run[h], mx[h]);
    scale0[h] = RescaleFactor(st.m_run[h], m0[h]);
  }
  Exp2Rows(s, m0, sum);
#pragma unroll
  for (int h = 0; h < 2; ++h) st.l_run[h] = st.l_run[h] * scale0[h] + sum[h];
  PackP<kFp8>(s, pa);
}

// WG1: WG0's m0 / scale0 (after P0Ready), then the softmax of S1 (tile t1, when has1) against
// m0: m1 = max(m0, rowmax S1), scale1 = 2^(m0 - m1), P1 = 2^(S1 - m1) packed into pa (m1 = m0
// and scale1 = 1 without t1); the row sums rescaled by both factors and added, m_run = m1.
template <bool kFp8>
__device__ __forceinline__ void SeesawSoftmaxS1(const VerifyKernelArgs& args, const SeesawCta& cta,
                                                const SeesawMathThread& th, SeesawMathState& st,
                                                float (&s)[32], bool has1, int t1,
                                                float (&scale0)[2], float (&m1)[2],
                                                float (&scale1)[2], uint32_t (&pa)[4][4]) {
  NamedBarSync(kBarP0Ready, kMathThreads);
  float m0[2], sum[2] = {0.f, 0.f};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m0[h] = cta.s_m0()[th.row0 + 8 * h];
    scale0[h] = cta.s_scale0()[th.row0 + 8 * h];
    m1[h] = m0[h];
    scale1[h] = 1.f;
  }
  if (has1) {
    float mx[2];
    ScaleMaskMax<kFp8>(s, th.sc, args, th.wi, t1, th.ctx_len, th.M, th.fold_row0, th.q4, mx);
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
    st.l_run[h] = st.l_run[h] * (scale0[h] * scale1[h]) + sum[h];
    st.m_run[h] = m1[h];
  }
}

// Hands this warpgroup's P of the pair (when has_p; into sP, atom 8 of its tile's buffer) and
// its rows' m and scale (into s_m, s_scale) to the other warpgroup, then arrives on `bar`
// (kBarP0Ready / kBarP1Ready). The proxy fence before: P is read by the other warpgroup's
// wgmma (async proxy), and WG1 next reads V0 (landed by cp.async, never waited on by it) with
// its own wgmma.
__device__ __forceinline__ void SeesawHandOff(const SeesawCta& cta, const SeesawMathThread& th,
                                              uint32_t sP, const uint32_t (&pa)[4][4], bool has_p,
                                              float* s_m, float* s_scale, const float (&m)[2],
                                              const float (&scale)[2], int bar) {
  if (has_p) StoreP(cta.smem + (sP - cta.base), pa, th.wl, th.g, th.q4);
  if (th.q4 == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      s_m[th.row0 + 8 * h] = m[h];
      s_scale[th.row0 + 8 * h] = scale[h];
    }
  }
  FenceProxyAsyncShared();
  NamedBarArrive(bar, kMathThreads);
}

// WG0 after its hand-off: O_L = O_L * scale0 + P0 V0_L (P0 from registers), then WG1's P1:
// O_L = O_L * scale1 + P1 V1_L (P1 from smem; m_run = m1), releasing what it read.
template <bool kFp8>
__device__ __forceinline__ void SeesawPvWg0(const SeesawCta& cta, const SeesawMathThread& th,
                                            SeesawMathState& st, const uint32_t (&pa)[4][4],
                                            const float (&scale0)[2], bool has1) {
  ScaleO(st.o, scale0);
  WgmmaFence();
  PvRegP<kFp8>(st.o, pa, cta.kv(0) + th.sV_own);
  WgmmaCommit();
  WgmmaWait<0>();
  // Buffer 0, atoms 0-3: nobody else reads them; the producer may refill them now.
  if (th.lane == 0) MbarArrive(cta.bars.empty_a(0));
  NamedBarSync(kBarP1Ready, kMathThreads);
  // V1 landed by cp.async (generic proxy) is read below by wgmma, and this warpgroup never
  // waited on buffer 1's full barriers itself: order the two proxies on this side too.
  FenceProxyAsyncShared();
  float scale1[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    scale1[h] = cta.s_scale1()[th.row0 + 8 * h];
    st.m_run[h] = cta.s_m1()[th.row0 + 8 * h];
  }
  if (has1) {
#pragma unroll
    for (int h = 0; h < 2; ++h) st.l_run[h] *= scale1[h];
    ScaleO(st.o, scale1);
    WgmmaFence();
    PvSmemP<kFp8>(st.o, cta.p(1), cta.kv(1) + th.sV_own);
    WgmmaCommit();
    WgmmaWait<0>();
    if (th.lane == 0) {
      MbarArrive(cta.bars.empty_a(1));   // WG1's S1 reads are ordered before P1Ready
      MbarArrive(cta.bars.empty_bc(1));  // P1 (atom 8) read
    }
  }
}

// WG1 after its hand-off: O_R = (O_R * scale0 + P0 V0_R) * scale1 + P1 V1_R. P0 is relative to
// m0, P1 to m1: the P0 product must be rescaled by scale1 before P1's is added, so the two PV
// products of this warpgroup are waited for in between.
template <bool kFp8>
__device__ __forceinline__ void SeesawPvWg1(const SeesawCta& cta, const SeesawMathThread& th,
                                            SeesawMathState& st, const uint32_t (&pa)[4][4],
                                            const float (&scale0)[2], const float (&scale1)[2],
                                            bool has1) {
  ScaleO(st.o, scale0);
  WgmmaFence();
  PvSmemP<kFp8>(st.o, cta.p(0), cta.kv(0) + th.sV_own);
  WgmmaCommit();
  WgmmaWait<0>();
  // Buffer 0, atoms 4-8 (V0_R, P0): WG0's reads (S0) and writes (P0) precede P0Ready.
  if (th.lane == 0) MbarArrive(cta.bars.empty_bc(0));
  if (has1) {
    ScaleO(st.o, scale1);
    WgmmaFence();  // also orders this thread's pa writes before the wgmma reads them
    PvRegP<kFp8>(st.o, pa, cta.kv(1) + th.sV_own);
    WgmmaCommit();
    WgmmaWait<0>();
    if (th.lane == 0) MbarArrive(cta.bars.empty_bc(1));
  }
}

// WG0's step of pair p (tiles t0 = 2p in buffer 0, t1 = 2p + 1 in buffer 1; seesaw.cu):
// S0 = Q K0^T, its softmax, P0 / m0 / scale0 to WG1, then the PV products of O_L.
template <bool kFp8>
__device__ __forceinline__ void SeesawMathWg0(const VerifyKernelArgs& args, const SeesawCta& cta,
                                              const SeesawMathThread& th, SeesawMathState& st,
                                              int p) {
  const bool has1 = 2 * p + 1 < th.num_tiles;
  float s[32];
  SeesawScoreTile<kFp8, 0>(s, cta, th, p);
  float m0[2], scale0[2];
  uint32_t pa[4][4];
  SeesawSoftmaxS0<kFp8>(args, th, st, s, 2 * p, m0, scale0, pa);
  SeesawHandOff(cta, th, cta.p(0), pa, /*has_p=*/true, cta.s_m0(), cta.s_scale0(), m0, scale0,
                kBarP0Ready);
  SeesawPvWg0<kFp8>(cta, th, st, pa, scale0, has1);
}

// WG1's step of pair p: S1 = Q K1^T (in parallel with WG0's S0 / softmax / PV), its softmax
// against WG0's m0, P1 / m1 / scale1 to WG0, then the PV products of O_R.
template <bool kFp8>
__device__ __forceinline__ void SeesawMathWg1(const VerifyKernelArgs& args, const SeesawCta& cta,
                                              const SeesawMathThread& th, SeesawMathState& st,
                                              int p) {
  const bool has1 = 2 * p + 1 < th.num_tiles;
  float s[32];
  if (has1) SeesawScoreTile<kFp8, 1>(s, cta, th, p);
  float scale0[2], m1[2], scale1[2];
  uint32_t pa[4][4];
  SeesawSoftmaxS1<kFp8>(args, cta, th, st, s, has1, 2 * p + 1, scale0, m1, scale1, pa);
  SeesawHandOff(cta, th, cta.p(1), pa, has1, cta.s_m1(), cta.s_scale1(), m1, scale1, kBarP1Ready);
  SeesawPvWg1<kFp8>(cta, th, st, pa, scale0, scale1, has1);
}

// Both math warpgroups: this warpgroup's row-sum partials (quad-reduced) into l[wg][row]
// (SeesawCta::s_l), then a barrier, after which l[0][r] + l[1][r] is the row's sum (a split's
// end and the final epilogue).
__device__ __forceinline__ void SeesawExchangeRowSums(const SeesawMathState& st,
                                                      const SeesawCta& cta,
                                                      const SeesawMathThread& th) {
  float* s_l = cta.s_l();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = st.l_run[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (th.q4 == 0) s_l[th.wg * 64 + th.row0 + 8 * h] = l;
  }
  NamedBarSync(kBarEpilogue, kMathThreads);
}

// Split j of a work item that holds several (VerifyWorkItem::split_keys), after the row-sum
// exchange: each thread writes its own fragment of the split's normalised rows (fp32) and,
// WG0, the log2 sum to partial row `prow0` + j * 64 + r, straight from registers (the KV ring,
// which the final epilogue stages through, is still streaming). Or, when the item folds
// (its range starts at the rows' first key), split j > 0 is folded into split 0's rows
// (fold.cuh, the combine's arithmetic): each thread reads back the fragment it wrote itself
// (no other thread touches it), and every thread of a row carries the fold's LSE in
// st.lse_fold[h] (all compute the same values).
__device__ __forceinline__ void SeesawWriteSplit(const VerifyKernelArgs& args, const SeesawCta& cta,
                                                 const SeesawMathThread& th, SeesawMathState& st,
                                                 int64_t prow0, int j, bool fold) {
  const float* s_l = cta.s_l();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = th.row0 + 8 * h;
    if (r < th.rows_here) {
      const float l_tot = s_l[r] + s_l[64 + r];  // the final epilogue's order
      const float inv = l_tot > 0.f ? 1.f / l_tot : 0.f;
      const float lse = SplitLse(st.m_run[h], l_tot);
      if (fold && j > 0) {
        const FoldWeights w = FoldWeightsOf(st.lse_fold[h], lse);
        float* frow = args.part_o + (prow0 + r) * kVDim;
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int col0 = th.wg * 256 + hf * 128 + th.q4 * 2;
#pragma unroll
          for (int nb = 0; nb < 16; ++nb) {
            float2* f = reinterpret_cast<float2*>(frow + col0 + nb * 8);
            const float2 a = *f;
            *f = make_float2(FoldValue(w, a.x, st.o[hf][nb * 4 + 2 * h] * inv),
                             FoldValue(w, a.y, st.o[hf][nb * 4 + 2 * h + 1] * inv));
          }
        }
        st.lse_fold[h] = w.lse;
        if (th.wg == 0 && th.q4 == 0) args.part_lse[prow0 + r] = w.lse;
      } else {
        const int64_t prow = prow0 + static_cast<int64_t>(fold ? 0 : j) * Tr::kRows;
        float* orow = args.part_o + (prow + r) * kVDim;
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int col0 = th.wg * 256 + hf * 128 + th.q4 * 2;
#pragma unroll
          for (int nb = 0; nb < 16; ++nb) {
            *reinterpret_cast<float2*>(orow + col0 + nb * 8) =
                make_float2(st.o[hf][nb * 4 + 2 * h] * inv, st.o[hf][nb * 4 + 2 * h + 1] * inv);
          }
        }
        st.lse_fold[h] = lse;
        if (th.wg == 0 && th.q4 == 0) args.part_lse[prow + r] = lse;
      }
    }
  }
}

// The end of split j of a work item that holds several (not its last): both math warpgroups
// add their row sums (as the final epilogue), write or fold the split (SeesawWriteSplit), then
// restart the softmax state, so the next split is computed from scratch exactly as a work item
// of its own would be: m_run = -inf makes the next pair's rescale factor 0 for every row that
// sees a key of its first tile (every written row of a context split), which clears O and the
// row sums there (a reset of O here would make ptxas spill the accumulators). Both warpgroups
// hold this split's final m_run (WG0 read m1 after P1). The row-sum slots' reuse is ordered by
// the P-ready barriers of the pairs in between (as the final epilogue's).
__device__ __forceinline__ void SeesawFlushSplit(const VerifyKernelArgs& args, const SeesawCta& cta,
                                                 const SeesawMathThread& th, SeesawMathState& st,
                                                 int64_t prow0, int j, bool fold) {
  SeesawExchangeRowSums(st, cta, th);
  SeesawWriteSplit(args, cta, th, st, prow0, j, fold);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    st.m_run[h] = -INFINITY;
    st.l_run[h] = 0.f;
  }
}

// After pair p (bf16 instance): the end of a split of an item that holds several but of its
// last one flushes the split (SeesawFlushSplit).
__device__ __forceinline__ void SeesawEndOfPair(const VerifyKernelArgs& args, const SeesawCta& cta,
                                                const SeesawMathThread& th, SeesawMathState& st,
                                                int p) {
  if (th.split_pairs > 0 && (p + 1) % th.split_pairs == 0 && p + 1 < th.num_pairs) {
    SeesawFlushSplit(args, cta, th, st, LoadFresh(&args.work[blockIdx.x].partial_row),
                     (p + 1) / th.split_pairs - 1, LoadFresh(&args.work[blockIdx.x].kv_begin) == 0);
  }
}

// The epilogue's rows, normalised, into the KV ring (every wgmma that read it has completed,
// each warpgroup waited for its own before the row-sum barrier): bf16 rows of `stride` bytes
// when `direct`, else fp32; WG0 writes each row's LSE (natural log to args.lse when direct,
// log2 to the partial row's part_lse).
__device__ __forceinline__ void SeesawStageRows(const VerifyKernelArgs& args, const SeesawCta& cta,
                                                const SeesawMathThread& th,
                                                const SeesawMathState& st, bool direct, int stride,
                                                int partial_row, int64_t out_row0) {
  const float* s_l = cta.s_l();
  unsigned char* stage = cta.smem + Tr::kKvOff;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = th.row0 + 8 * h;
    if (r >= th.rows_here) continue;
    // Same order in both warpgroups: identical l.
    const float l_tot = s_l[r] + s_l[64 + r];
    const float inv = l_tot > 0.f ? 1.f / l_tot : 0.f;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int col0 = th.wg * 256 + hf * 128 + th.q4 * 2;
      if (direct) {
        __nv_bfloat16* srow = reinterpret_cast<__nv_bfloat16*>(stage + r * stride) + col0;
#pragma unroll
        for (int nb = 0; nb < 16; ++nb) {
          *reinterpret_cast<__nv_bfloat162*>(srow + nb * 8) = __floats2bfloat162_rn(
              st.o[hf][nb * 4 + 2 * h] * inv, st.o[hf][nb * 4 + 2 * h + 1] * inv);
        }
      } else {
        float* srow = reinterpret_cast<float*>(stage + r * stride) + col0;
#pragma unroll
        for (int nb = 0; nb < 16; ++nb) {
          *reinterpret_cast<float2*>(srow + nb * 8) =
              make_float2(st.o[hf][nb * 4 + 2 * h] * inv, st.o[hf][nb * 4 + 2 * h + 1] * inv);
        }
      }
    }
    if (th.wg == 0 && th.q4 == 0) {
      const float lse2 = SplitLse(st.m_run[h], l_tot);
      if (direct) {
        if (args.lse != nullptr) args.lse[out_row0 + r] = lse2 * 0.69314718055994531f;
      } else {
        args.part_lse[partial_row + r] = lse2;
      }
    }
  }
}

// The epilogue (both math warpgroups): adds the two warpgroups' row sums, normalises, stages the
// rows in the KV ring and stores each with one bulk copy (thread r: row r); or, for the last
// split of a folding split group, folds it from registers.
template <bool kFp8>
__device__ __forceinline__ void SeesawEpilogue(const VerifyKernelArgs& args, const SeesawCta& cta,
                                               const SeesawMathThread& th, SeesawMathState& st) {
  SeesawExchangeRowSums(st, cta, th);
  if constexpr (!kFp8) {
    // A folding split group: its last split folds from registers too (split 0's rows were
    // written by these threads' generic stores; no bulk copy mixes in).
    if (th.split_pairs > 0 && LoadFresh(&args.work[blockIdx.x].kv_begin) == 0) {
      SeesawWriteSplit(args, cta, th, st, LoadFresh(&args.work[blockIdx.x].partial_row),
                       (th.num_pairs - 1) / th.split_pairs, /*fold=*/true);
      return;
    }
  }
  // The output coordinates are re-read here rather than kept live across the loop (at 240
  // registers that would cost a spill).
  int partial_row = LoadFresh(&args.work[blockIdx.x].partial_row);
  const bool direct = partial_row < 0;
  if constexpr (!kFp8) {
    if (th.split_pairs > 0 && !direct)
      partial_row += ((th.num_pairs - 1) / th.split_pairs) * Tr::kRows;
  }
  const int64_t out_row0 =
      static_cast<int64_t>(LoadFresh(&args.work[blockIdx.x].q_row0)) * th.H + th.wi.fold_begin;
  // A store from registers would be 64 scattered 8-byte (or 4-byte) stores per thread, which
  // stalled the split CTAs of short contexts on the LSU. Row strides of 2080 (fp32) and 1040
  // (bf16) bytes keep the register -> smem writes free of bank conflicts and every row 16-byte
  // aligned.
  const int stride = direct ? 1040 : 2080;
  SeesawStageRows(args, cta, th, st, direct, stride, partial_row, out_row0);
  FenceProxyAsyncShared();  // the staged rows are read by the bulk copies (async proxy)
  NamedBarSync(kBarStore, kMathThreads);
  if (th.tid < th.rows_here) {
    const uint32_t src = cta.kv(0) + th.tid * stride;
    if (direct) {
      BulkStore(args.out + (out_row0 + th.tid) * kVDim, src, kVDim * 2);
    } else {
      BulkStore(args.part_o + static_cast<int64_t>(partial_row + th.tid) * kVDim, src, kVDim * 4);
    }
    // The copies must have read shared memory before the CTA exits and frees it.
    BulkCommit();
    BulkWaitRead0();
  }
}
#endif  // VERIFYD_SEESAW_BODY
}  // namespace
}  // namespace verifyd::kernels::cuda::detail
