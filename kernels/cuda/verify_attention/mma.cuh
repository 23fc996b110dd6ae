// The mma.sync (m16n8k16 bf16) verify attention kernel family, for every architecture from
// sm_80 up (sm_90: 5 stages; sm_80 / sm_120: 2 stages within 99 KB of shared memory).
//
// One CTA = one VerifyWorkItem: BM folded rows (row = node * heads + head) of one request
// against a range of its keys. The KV tile (BN keys x 576 columns, gathered per key through
// kv_indices with 16-byte cp.async, STAGES deep) is read once for all BM rows; V is the first
// 512 columns of the same shared-memory tile. Only tiles that reach the request's tail keys
// (or the end of the range) are masked. fp32 accumulation, online softmax in log2.
//
// Work split inside the CTA (8 warps):
//   S = Q K^T  [BM, BN]: T = (BM/16)*(BN/8) m16n8 tiles over 576 columns; when T < 8 the 576
//              columns are split over KSPLIT warp groups whose partial sums meet in smem.
//              BM = 16: each warp keeps its Q fragments in registers.
//   softmax    256/BM threads per row: max, exp2, sum; P -> smem as bf16; rescale factor.
//   O += P V   [BM, 512]: warp w owns output columns [64w, 64w+64) for all BM rows.
// Shared-memory layout and geometry: mma_traits.h. The variants that use this kernel and the
// architectures each has a body for: variants.h. Instantiated in mma_m16.cu.
//
// FP8 latent cache (V::kKvFp8; kernels/kv_fp8.h): the gathers copy the stored 656-byte rows
// into a ring of FP8 stages; when a tile's turn comes, the CTA dequantizes its stage into one
// bf16 tile (each value bf16(e4m3 * scale), the rope part copied) and the MMAs run on it as
// above. With Q in registers Q's shared-memory tile is that bf16 tile (read into registers
// before the first dequantization). The sm_90 FP8 variant keeps Q in shared memory instead
// and runs two CTAs per SM (<= 128 registers): the tile loop is bound by its barriers and
// dependent MMA chains, and a second CTA fills those gaps.
//
// Code: the kernel body (VerifyAttentionMmaKernel, at the end) is the tile loop calling one
// __device__ __forceinline__ function per role: KV slot / tile gathers and the pipeline
// prologue, FP8 dequantization, Q fragments, S = Q K^T (ComputeScores), masking (MaskScores),
// the online-softmax update, the O rescale and P V, and the epilogue (direct or partial). They
// take the CTA's context (MmaCta), the warp's MMA tiles (MmaWarpTiles) and the thread's
// running state (MmaState) by reference and compile to the code of one function.
// Internal CUDA header. Thread-safety: n/a (device code).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/verify_attention/kernel_args.cuh"
#include "kernels/cuda/verify_attention/mma_traits.h"
#include "kernels/cuda/verify_attention/ptx.cuh"
#include "kernels/cuda/verify_attention/variants.h"

namespace verifyd::kernels::cuda::detail {

// Whether variant V's kernel has a body in the architecture being compiled: the one its
// RunsOn() accepts (sm_90 for the 5-stage variant, everything else for the 2-stage one), so
// each build carries one copy of the mma.sync code.
template <class V>
__device__ constexpr bool MmaBodyOnThisArch() {
#if defined(__CUDA_ARCH__)
  return V::RunsOn(__CUDA_ARCH__ / 100);
#else
  return true;
#endif
}

// Two e4m3 codes (low byte first) times `scale`, as bf16x2 bits: each value
// bf16(float(code) * scale) (e4m3 -> f16 is exact, the product rounded once).
__device__ __forceinline__ uint32_t DequantE4m3x2(uint16_t codes, float scale) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(codes, __NV_E4M3);
  const float2 f = __half22float2(__half2(h));
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * scale, f.y * scale);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// ---- the kernel's roles ------------------------------------------------------------------

// What one CTA works on and where it keeps it, fixed for the whole kernel: the work item and
// the numbers derived from it, the thread's place in the CTA and the shared-memory regions
// (mma_traits.h).
template <class V>
struct MmaCta {
  static constexpr int BM = V::kRows;
  static constexpr int BN = V::kKeys;
  static constexpr int STAGES = V::kStages;
  static constexpr bool kFp8 = V::kKvFp8;
  using Tr = MmaTraits<BM, BN, STAGES, kFp8, V::kQInRegs>;
  // KV loader: warp w gathers keys w, w+8, ... of a tile.
  static constexpr int kKeysPerWarp = BN / kMmaWarps;

  __device__ __forceinline__ MmaCta(const VerifyKernelArgs& a, unsigned char* smem) : args(a) {
    sQ = reinterpret_cast<__nv_bfloat16*>(smem + Tr::kQOffset);
    sKV = reinterpret_cast<__nv_bfloat16*>(smem + Tr::kKvOffset);
    sStaging = smem + Tr::kStagingOffset;
    sS = reinterpret_cast<float*>(smem + Tr::kSOffset);
    sP = reinterpret_cast<__nv_bfloat16*>(smem + Tr::kPOffset);
    sM = reinterpret_cast<float*>(smem + Tr::kStatOffset);
    sL = sM + BM;
    sAlpha = sL + BM;
    tid = threadIdx.x;
    warp = tid >> 5;
    lane = tid & 31;
    wi = args.work[blockIdx.x];
    H = args.num_heads;
    M = wi.num_nodes * H;
    rows_here = min(BM, M - wi.fold_begin);
    ctx_len = wi.kv_len - wi.num_nodes;
    num_tiles = (wi.kv_end - wi.kv_begin + BN - 1) / BN;
    idx_base = WorkItemKeys(args, wi);
  }

  const VerifyKernelArgs& args;
  __nv_bfloat16* sQ;
  __nv_bfloat16* sKV;
  unsigned char* sStaging;  // FP8 cache only
  float* sS;
  __nv_bfloat16* sP;
  float* sM;      // running max per row
  float* sL;      // running sum per row
  float* sAlpha;  // this tile's rescale factor per row
  int tid, warp, lane;
  VerifyWorkItem wi;
  int H;
  int M;          // folded rows of the request
  int rows_here;  // rows of this CTA inside the request
  int ctx_len;    // P_b: keys before the tail
  int num_tiles;
  const int32_t* idx_base;
};

// The warp's share of the MMAs, fixed for the whole kernel: its m16n8 tile(s) of S (m-tile
// s_mt, n-tile s_nt on) over the k16 steps s_k0 .. of its k-split group s_ks, and the lane's
// fragment row g and column pair tq.
template <class V>
struct MmaWarpTiles {
  using Tr = typename MmaCta<V>::Tr;
  __device__ __forceinline__ explicit MmaWarpTiles(const MmaCta<V>& c) {
    const int s_tile0 = Tr::kKSplit > 1 ? (c.warp % Tr::kSTiles) : c.warp * Tr::kTilesPerWarp;
    s_ks = Tr::kKSplit > 1 ? (c.warp / Tr::kSTiles) : 0;
    s_mt = s_tile0 / Tr::kNTiles;
    s_nt = s_tile0 % Tr::kNTiles;
    s_k0 = s_ks * Tr::kKSteps;
    g = c.lane >> 2;
    tq = c.lane & 3;
  }
  int s_ks, s_mt, s_nt, s_k0;
  int g, tq;
};

// The thread's running state across tiles: the O accumulators (rows of m-tile mt, columns
// warp*64 + nt*8), Q's fragments (Q in registers) and the slot ids of the next tile to
// gather.
template <class V>
struct MmaState {
  using Tr = typename MmaCta<V>::Tr;
  float acc[Tr::kMTiles][8][4];
  uint32_t qfrag[Tr::kQInRegs ? Tr::kKSteps : 1][4];
  int32_t next_slots[MmaCta<V>::kKeysPerWarp];
};

// Running max -inf and sum 0 for each of the BM rows.
template <class V>
__device__ __forceinline__ void InitRowStats(const MmaCta<V>& c) {
  if (c.tid < MmaCta<V>::BM) {
    c.sM[c.tid] = -INFINITY;
    c.sL[c.tid] = 0.f;
  }
}

// The slot ids of the keys this warp gathers of tile `tile` (-1 past the range). They are
// fetched one tile ahead of the gather.
template <class V>
__device__ __forceinline__ void LoadKvSlots(const MmaCta<V>& c, int tile, int32_t* slots) {
#pragma unroll
  for (int j = 0; j < MmaCta<V>::kKeysPerWarp; ++j) {
    const int key = c.wi.kv_begin + tile * MmaCta<V>::BN + c.warp + j * kMmaWarps;
    slots[j] = key < c.wi.kv_end ? __ldg(c.idx_base + key) : -1;
  }
}

// KV tile gather into stage `stage` (16-byte cp.async): lanes stream each of the warp's key
// rows; an FP8 cache's rows land as stored (656 bytes: 41 chunks) in the FP8 ring.
template <class V>
__device__ __forceinline__ void LoadKvTile(const MmaCta<V>& c, int stage, const int32_t* slots) {
  using Tr = typename MmaCta<V>::Tr;
#pragma unroll
  for (int j = 0; j < MmaCta<V>::kKeysPerWarp; ++j) {
    const int k = c.warp + j * kMmaWarps;
    const bool valid = slots[j] >= 0;
    if constexpr (MmaCta<V>::kFp8) {
      const unsigned char* src_row = reinterpret_cast<const unsigned char*>(c.args.kv) +
                                     (valid ? static_cast<int64_t>(slots[j]) * kFp8RowBytes : 0);
      const uint32_t dst_row = SmemAddr(c.sStaging + stage * Tr::kFp8StageBytes + k * kFp8RowBytes);
#pragma unroll
      for (int ch = c.lane; ch < kFp8ChunksPerRow; ch += 32) {
        CpAsync16(dst_row + ch * 16, src_row + ch * 16, valid);
      }
    } else {
      const __nv_bfloat16* src_row =
          c.args.kv + (valid ? static_cast<int64_t>(slots[j]) * kQkDim : 0);
      const uint32_t dst_row =
          SmemAddr(c.sKV + stage * MmaCta<V>::BN * kMmaSmemStride + k * kMmaSmemStride);
#pragma unroll
      for (int ch = c.lane; ch < kChunksPerRow; ch += 32) {
        CpAsync16(dst_row + ch * 16, src_row + ch * 8, valid);
      }
    }
  }
}

// Pipeline prologue: tiles 0 .. STAGES-2 in flight (one commit group each, group 0 also holds
// Q) and the slot ids of tile STAGES-1 in st.next_slots.
template <class V>
__device__ __forceinline__ void StartKvPipeline(const MmaCta<V>& c, MmaState<V>& st) {
  constexpr int STAGES = MmaCta<V>::STAGES;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < c.num_tiles) {
      LoadKvSlots(c, s, st.next_slots);
      LoadKvTile(c, s, st.next_slots);
    }
    CpAsyncCommit();
  }
  if (STAGES - 1 < c.num_tiles) LoadKvSlots(c, STAGES - 1, st.next_slots);
}

template <class V>
__device__ __forceinline__ void ZeroAccumulators(MmaState<V>& st) {
#pragma unroll
  for (int mt = 0; mt < MmaState<V>::Tr::kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) st.acc[mt][nt][e] = 0.f;
}

// Q in registers: the warp's Q fragments (its k range of S), read once, at the first tile.
template <class V>
__device__ __forceinline__ void LoadQFragments(const MmaCta<V>& c, const MmaWarpTiles<V>& w,
                                               MmaState<V>& st) {
#pragma unroll
  for (int k = 0; k < MmaState<V>::Tr::kKSteps; ++k) {
    const int row = (c.lane & 7) + ((c.lane >> 3) & 1) * 8;
    const int col = (w.s_k0 + k) * 16 + (c.lane >> 4) * 8;
    LdMatrixX4(SmemAddr(c.sQ + row * kMmaSmemStride + col), st.qfrag[k][0], st.qfrag[k][1],
               st.qfrag[k][2], st.qfrag[k][3]);
  }
  // FP8 cache: Q's tile is the bf16 KV tile the dequantization overwrites next.
  if constexpr (MmaCta<V>::kFp8) __syncthreads();
}

// Issues the tile STAGES-1 ahead of `tile` into the stage freed by the previous iteration and
// fetches the slot ids of the one after it; commits a group (empty near the end).
template <class V>
__device__ __forceinline__ void IssueTileAhead(const MmaCta<V>& c, MmaState<V>& st, int tile) {
  constexpr int STAGES = MmaCta<V>::STAGES;
  const int ahead = tile + STAGES - 1;
  if (ahead < c.num_tiles) {
    LoadKvTile(c, ahead % STAGES, st.next_slots);
    if (ahead + 1 < c.num_tiles) LoadKvSlots(c, ahead + 1, st.next_slots);
  }
  CpAsyncCommit();
}

// FP8 cache: dequantizes stage `stage` into the bf16 tile. Codes: thread t takes 8 codes
// (8 bytes) of key t / 64 + 4 i, columns 8 (t % 64) on, i < BN / 4; each value becomes
// bf16(float(code) * scale) (one rounding of the exact product). Rope: 16 bytes a thread.
template <class V>
__device__ __forceinline__ void DequantizeStage(const MmaCta<V>& c, int stage) {
  constexpr int BN = MmaCta<V>::BN;
  const unsigned char* st = c.sStaging + stage * MmaCta<V>::Tr::kFp8StageBytes;
  const int part = c.tid & 63;  // 8-code chunk within the row
#pragma unroll
  for (int i = 0; i < BN * 64 / kMmaThreads; ++i) {
    const int key = (c.tid >> 6) + i * (kMmaThreads / 64);
    const unsigned char* row = st + key * kFp8RowBytes;
    const uint2 codes = *reinterpret_cast<const uint2*>(row + part * 8);
    const float scale = *reinterpret_cast<const float*>(row + kFp8ScaleOffset + (part >> 4) * 4);
    uint4 out;
    out.x = DequantE4m3x2(static_cast<uint16_t>(codes.x & 0xffffu), scale);
    out.y = DequantE4m3x2(static_cast<uint16_t>(codes.x >> 16), scale);
    out.z = DequantE4m3x2(static_cast<uint16_t>(codes.y & 0xffffu), scale);
    out.w = DequantE4m3x2(static_cast<uint16_t>(codes.y >> 16), scale);
    *reinterpret_cast<uint4*>(c.sKV + key * kMmaSmemStride + part * 8) = out;
  }
  static_assert(BN * 8 == kMmaThreads, "rope copy: one 16-byte chunk per thread");
  const int key = c.tid >> 3;
  const int ch = c.tid & 7;
  *reinterpret_cast<uint4*>(c.sKV + key * kMmaSmemStride + kVDim + ch * 8) =
      *reinterpret_cast<const uint4*>(st + key * kFp8RowBytes + kFp8RopeOffset + ch * 16);
}

// S = Q K^T over this warp's k range, its partial sums into the S region of its k-split
// group.
template <class V>
__device__ __forceinline__ void ComputeScores(const MmaCta<V>& c, const MmaWarpTiles<V>& w,
                                              const MmaState<V>& st, const __nv_bfloat16* sK) {
  using Tr = typename MmaCta<V>::Tr;
  const int lane = c.lane;
  // Two accumulator sets (even / odd k steps) halve the dependent-mma chain.
  float sacc[2][Tr::kTilesPerWarp][4];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int t = 0; t < Tr::kTilesPerWarp; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) sacc[h][t][e] = 0.f;
#pragma unroll
  for (int k = 0; k < Tr::kKSteps; ++k) {
    uint32_t a[4];
    if constexpr (Tr::kQInRegs) {
#pragma unroll
      for (int e = 0; e < 4; ++e) a[e] = st.qfrag[k][e];
    } else {
      const int row = w.s_mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
      const int col = (w.s_k0 + k) * 16 + (lane >> 4) * 8;
      LdMatrixX4(SmemAddr(c.sQ + row * kMmaSmemStride + col), a[0], a[1], a[2], a[3]);
    }
    const int dcol = (w.s_k0 + k) * 16 + ((lane >> 3) & 1) * 8;
    if constexpr (Tr::kTilesPerWarp == 2) {
      const int key = w.s_nt * 8 + (lane & 7) + (lane >> 4) * 8;
      uint32_t b0, b1, b2, b3;
      LdMatrixX4(SmemAddr(sK + key * kMmaSmemStride + dcol), b0, b1, b2, b3);
      Mma16816(sacc[k & 1][0], a, b0, b1);
      Mma16816(sacc[k & 1][Tr::kTilesPerWarp - 1], a, b2, b3);
    } else {
      const int key = w.s_nt * 8 + (lane & 7);
      uint32_t b0, b1;
      LdMatrixX2(SmemAddr(sK + key * kMmaSmemStride + dcol), b0, b1);
      Mma16816(sacc[k & 1][0], a, b0, b1);
    }
  }
#pragma unroll
  for (int t = 0; t < Tr::kTilesPerWarp; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) sacc[0][t][e] += sacc[1][t][e];
  float* sSk = c.sS + w.s_ks * MmaCta<V>::BM * Tr::kSStride;
#pragma unroll
  for (int t = 0; t < Tr::kTilesPerWarp; ++t) {
    const int col = (w.s_nt + t) * 8 + w.tq * 2;
    const int row = w.s_mt * 16 + w.g;
    *reinterpret_cast<float2*>(sSk + row * Tr::kSStride + col) =
        make_float2(sacc[0][t][0], sacc[0][t][1]);
    *reinterpret_cast<float2*>(sSk + (row + 8) * Tr::kSStride + col) =
        make_float2(sacc[0][t][2], sacc[0][t][3]);
  }
}

// Masking of a tile that reaches the request's tail keys or the end of the range: the
// thread's scores s (columns c0 .. of row `row`, request-local key of column 0: key0) become
// -inf past the range and, for tail keys, where the row's tree-mask bit is clear.
template <class V>
__device__ __forceinline__ void MaskScores(const MmaCta<V>& c, int row, int key0, int c0,
                                           float (&s)[MmaCta<V>::Tr::kEpt]) {
  const int f = c.wi.fold_begin + row;
  const uint64_t* mrow =
      f < c.M ? c.args.tree_mask + static_cast<int64_t>(c.wi.q_row0 + f / c.H) * c.args.mask_words
              : nullptr;
#pragma unroll
  for (int e = 0; e < MmaCta<V>::Tr::kEpt; ++e) {
    const int key = key0 + c0 + e;
    bool vis = key < c.wi.kv_end;
    if (vis && key >= c.ctx_len && mrow != nullptr) {
      const int t = key - c.ctx_len;
      vis = (__ldg(mrow + (t >> 6)) >> (t & 63)) & 1ull;
    }
    if (!vis) s[e] = -INFINITY;
  }
}

// Online softmax (log2 domain), kTpr threads per row: the k-split partial sums of S met and
// scaled, masked, the row max and sum through shuffles; P -> smem as bf16; the row's running
// max and sum updated and its rescale factor alpha published.
template <class V>
__device__ __forceinline__ void OnlineSoftmaxUpdate(const MmaCta<V>& c, int tile) {
  using Tr = typename MmaCta<V>::Tr;
  constexpr int BN = MmaCta<V>::BN;
  const int row = c.tid / Tr::kTpr;
  const int sub = c.tid % Tr::kTpr;
  const int c0 = sub * Tr::kEpt;
  const int key0 = c.wi.kv_begin + tile * BN;  // request-local key of column 0
  const bool masked = (key0 + BN > c.ctx_len) || (key0 + BN > c.wi.kv_end);
  float s[Tr::kEpt];
#pragma unroll
  for (int e = 0; e < Tr::kEpt; ++e) {
    float v = 0.f;
#pragma unroll
    for (int ks = 0; ks < Tr::kKSplit; ++ks)
      v += c.sS[(ks * MmaCta<V>::BM + row) * Tr::kSStride + c0 + e];
    s[e] = v * c.args.scale_log2;
  }
  if (masked) MaskScores(c, row, key0, c0, s);
  float mx = s[0];
#pragma unroll
  for (int e = 1; e < Tr::kEpt; ++e) mx = fmaxf(mx, s[e]);
#pragma unroll
  for (int off = Tr::kTpr / 2; off > 0; off >>= 1)
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  const float m_old = c.sM[row];
  const float m_new = fmaxf(m_old, mx);
  const bool none = (m_new == -INFINITY);
  const float alpha = none ? 1.f : exp2f(m_old - m_new);
  float sum = 0.f;
  __nv_bfloat16* prow = c.sP + row * Tr::kPStride + c0;
#pragma unroll
  for (int e = 0; e < Tr::kEpt; ++e) {
    const float p = none ? 0.f : exp2f(s[e] - m_new);
    sum += p;
    prow[e] = __float2bfloat16_rn(p);
  }
#pragma unroll
  for (int off = Tr::kTpr / 2; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (sub == 0) {
    c.sM[row] = m_new;
    c.sL[row] = c.sL[row] * alpha + sum;
    c.sAlpha[row] = alpha;
  }
}

// O *= alpha, row by row (the tile's rescale factors from the softmax).
template <class V>
__device__ __forceinline__ void RescaleAccumulators(const MmaCta<V>& c, const MmaWarpTiles<V>& w,
                                                    MmaState<V>& st) {
#pragma unroll
  for (int mt = 0; mt < MmaState<V>::Tr::kMTiles; ++mt) {
    const float a_lo = c.sAlpha[mt * 16 + w.g];
    const float a_hi = c.sAlpha[mt * 16 + w.g + 8];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      st.acc[mt][nt][0] *= a_lo;
      st.acc[mt][nt][1] *= a_lo;
      st.acc[mt][nt][2] *= a_hi;
      st.acc[mt][nt][3] *= a_hi;
    }
  }
}

// O += P V: warp w's output columns [64w, 64w+64) for all BM rows; V is the first 512 columns
// of the KV tile.
template <class V>
__device__ __forceinline__ void AccumulatePV(const MmaCta<V>& c, MmaState<V>& st,
                                             const __nv_bfloat16* sK) {
  using Tr = typename MmaCta<V>::Tr;
  const int lane = c.lane;
#pragma unroll
  for (int kk = 0; kk < MmaCta<V>::BN / 16; ++kk) {
    uint32_t pa[Tr::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < Tr::kMTiles; ++mt) {
      const int row = mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
      const int col = kk * 16 + (lane >> 4) * 8;
      LdMatrixX4(SmemAddr(c.sP + row * Tr::kPStride + col), pa[mt][0], pa[mt][1], pa[mt][2],
                 pa[mt][3]);
    }
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      const int key = kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
      const int col = c.warp * 64 + np * 16 + (lane >> 4) * 8;
      uint32_t b0, b1, b2, b3;
      LdMatrixX4Trans(SmemAddr(sK + key * kMmaSmemStride + col), b0, b1, b2, b3);
#pragma unroll
      for (int mt = 0; mt < Tr::kMTiles; ++mt) {
        Mma16816(st.acc[mt][2 * np], pa[mt], b0, b1);
        Mma16816(st.acc[mt][2 * np + 1], pa[mt], b2, b3);
      }
    }
  }
}

// Epilogue, O: each row divided by its sum, written directly (bf16, a single-split request)
// or as the split's partial (fp32, for the combine kernel).
template <class V>
__device__ __forceinline__ void WriteOutputRows(const MmaCta<V>& c, const MmaWarpTiles<V>& w,
                                                const MmaState<V>& st, bool direct,
                                                int64_t out_row0) {
#pragma unroll
  for (int mt = 0; mt < MmaState<V>::Tr::kMTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = mt * 16 + w.g + half * 8;
      if (r >= c.rows_here) continue;
      const float l = c.sL[r];
      const float inv = l > 0.f ? 1.f / l : 0.f;
      if (direct) {
        __nv_bfloat16* orow = c.args.out + (out_row0 + r) * kVDim + c.warp * 64 + w.tq * 2;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          *reinterpret_cast<__nv_bfloat162*>(orow + nt * 8) = __floats2bfloat162_rn(
              st.acc[mt][nt][half * 2] * inv, st.acc[mt][nt][half * 2 + 1] * inv);
        }
      } else {
        float* prow = c.args.part_o + static_cast<int64_t>(c.wi.partial_row + r) * kVDim +
                      c.warp * 64 + w.tq * 2;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          *reinterpret_cast<float2*>(prow + nt * 8) =
              make_float2(st.acc[mt][nt][half * 2] * inv, st.acc[mt][nt][half * 2 + 1] * inv);
        }
      }
    }
  }
}

// Epilogue, LSE per row: natural log when direct (if asked for), log2 of the split's sum
// (its max included) when partial.
template <class V>
__device__ __forceinline__ void WriteRowLse(const MmaCta<V>& c, bool direct, int64_t out_row0) {
  if (c.tid < c.rows_here) {
    const float l = c.sL[c.tid];
    const float lse2 = l > 0.f ? c.sM[c.tid] + log2f(l) : -INFINITY;
    if (direct) {
      if (c.args.lse != nullptr) c.args.lse[out_row0 + c.tid] = lse2 * 0.69314718055994531f;
    } else {
      c.args.part_lse[c.wi.partial_row + c.tid] = lse2;
    }
  }
}

// Epilogue: O and LSE of the CTA's rows, directly when the work item is the request's only
// split (partial_row < 0), else as partials for the combine kernel.
template <class V>
__device__ __forceinline__ void WriteEpilogue(const MmaCta<V>& c, const MmaWarpTiles<V>& w,
                                              const MmaState<V>& st) {
  const bool direct = c.wi.partial_row < 0;
  const int64_t out_row0 = static_cast<int64_t>(c.wi.q_row0) * c.H + c.wi.fold_begin;
  WriteOutputRows(c, w, st, direct, out_row0);
  WriteRowLse(c, direct, out_row0);
}

template <class V>
__global__ void __launch_bounds__(kMmaThreads, V::kCtasPerSm)
    VerifyAttentionMmaKernel(const VerifyKernelArgs args) {
  if constexpr (!MmaBodyOnThisArch<V>()) {
    return;
  } else {
    using Cta = MmaCta<V>;
    extern __shared__ __align__(128) unsigned char smem[];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Let the combine kernel (launched with programmatic stream serialization) get resident
    // early; it waits in GridDepWait() until this grid has finished.
    GridDepLaunchDependents();
#endif
    const Cta c(args, smem);
    InitRowStats(c);
    {
      // Q tile: BM folded rows x 576 (cp.async, in the first commit group), rows past the
      // request zero-filled. Kept in the kernel body: as an inlined function the loop's
      // induction variables come out in another order in the sm_120 build.
      const __nv_bfloat16* q_base =
          args.q + (static_cast<int64_t>(c.wi.q_row0) * c.H + c.wi.fold_begin) * kQkDim;
      for (int i = c.tid; i < Cta::BM * kChunksPerRow; i += kMmaThreads) {
        const int r = i / kChunksPerRow;
        const int ch = i - r * kChunksPerRow;
        const bool valid = r < c.rows_here;
        const __nv_bfloat16* src =
            valid ? q_base + static_cast<int64_t>(r) * kQkDim + ch * 8 : args.q;
        CpAsync16(SmemAddr(c.sQ + r * kMmaSmemStride + ch * 8), src, valid);
      }
    }
    MmaState<V> st;
    StartKvPipeline(c, st);
    const MmaWarpTiles<V> w(c);
    ZeroAccumulators(st);

    for (int tile = 0; tile < c.num_tiles; ++tile) {
      CpAsyncWait<Cta::STAGES - 2>();
      __syncthreads();
      if constexpr (Cta::Tr::kQInRegs) {
        if (tile == 0) LoadQFragments(c, w, st);
      }
      IssueTileAhead(c, st, tile);
      // The bf16 tile the MMAs read: the stage's, or with an FP8 cache the one dequantized
      // from it (the previous tile's P V is done: the barrier at the top).
      const __nv_bfloat16* sK = c.sKV;
      if constexpr (Cta::kFp8) {
        DequantizeStage(c, tile % Cta::STAGES);
        __syncthreads();
      } else {
        sK = c.sKV + (tile % Cta::STAGES) * Cta::BN * kMmaSmemStride;
      }
      ComputeScores(c, w, st, sK);
      __syncthreads();
      OnlineSoftmaxUpdate(c, tile);
      __syncthreads();
      RescaleAccumulators(c, w, st);
      AccumulatePV(c, st, sK);
    }
    CpAsyncWait<0>();
    __syncthreads();  // sM / sL final (also covers num_tiles == 0)

    WriteEpilogue(c, w, st);
  }
}

// Launches variant V's mma.sync kernel: grid CTAs of kMmaThreads, its shared memory.
template <class V>
absl::Status LaunchMmaVariant(const VerifyKernelArgs& args, int grid, void* stream) {
  using Tr = MmaTraits<V::kRows, V::kKeys, V::kStages, V::kKvFp8, V::kQInRegs>;
  static_assert(Tr::kSmemBytes == V::kSmemBytes, "variants.h and mma_traits.h disagree");
  static std::atomic<uint64_t> configured_devices{0};
  return LaunchWithSmem(
      &VerifyAttentionMmaKernel<V>, configured_devices, [] { return cudaSuccess; }, args, grid,
      kMmaThreads, Tr::kSmemBytes, stream);
}

}  // namespace verifyd::kernels::cuda::detail
