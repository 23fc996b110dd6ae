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
// Files: the barriers, operand helpers and CTA view in keys_on_m_tiles.cuh; the math
// warpgroups' phases in keys_on_m_math.cuh; the producer, the epilogue and the kernel here.
#include "kernels/cuda/verify_attention/keys_on_m_math.cuh"
#include "kernels/cuda/verify_attention/variants.h"

namespace verifyd::kernels::cuda::detail {
namespace {
#ifdef VERIFYD_KEYS_ON_M_BODY

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
