// The keys-on-M verify attention kernel's math warpgroups (WG0, WG1; the kernel and its
// schedule: keys_on_m.cu): the work item's sizes (MathWork), a math thread's place
// (MathThread) and its online-softmax state (MathState), and the phases of a tile: StageQ /
// LoadQInv once, then per tile ScoreTile (S^T = K Q^T), ScaleScores, MaskTile,
// ExchangeTileMaxima, SoftmaxUpdate, WritePTiles and ValueTile, driven by MathTiles.
// Internal CUDA header, included by keys_on_m.cu only: the device code exists only in the
// sm_90a build (VERIFYD_KEYS_ON_M_BODY) and has internal linkage.
// Thread-safety: n/a (device code).
#pragma once

#include "kernels/cuda/verify_attention/keys_on_m_tiles.cuh"

namespace verifyd::kernels::cuda::detail {
namespace {
#ifdef VERIFYD_KEYS_ON_M_BODY

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

#endif  // VERIFYD_KEYS_ON_M_BODY
}  // namespace
}  // namespace verifyd::kernels::cuda::detail
