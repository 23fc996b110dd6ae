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

template <class V>
__global__ void __launch_bounds__(kMmaThreads, V::kCtasPerSm)
    VerifyAttentionMmaKernel(const VerifyKernelArgs args) {
  if constexpr (!MmaBodyOnThisArch<V>()) {
    return;
  } else {
    constexpr int BM = V::kRows;
    constexpr int BN = V::kKeys;
    constexpr int STAGES = V::kStages;
    constexpr bool kFp8 = V::kKvFp8;
    using Tr = MmaTraits<BM, BN, STAGES, kFp8, V::kQInRegs>;
    extern __shared__ __align__(128) unsigned char smem[];
    __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smem + Tr::kQOffset);
    __nv_bfloat16* sKV = reinterpret_cast<__nv_bfloat16*>(smem + Tr::kKvOffset);
    unsigned char* sStaging = smem + Tr::kStagingOffset;  // FP8 cache only
    float* sS = reinterpret_cast<float*>(smem + Tr::kSOffset);
    __nv_bfloat16* sP = reinterpret_cast<__nv_bfloat16*>(smem + Tr::kPOffset);
    float* sM = reinterpret_cast<float*>(smem + Tr::kStatOffset);
    float* sL = sM + BM;
    float* sAlpha = sL + BM;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Let the combine kernel (launched with programmatic stream serialization) get resident
    // early; it waits in GridDepWait() until this grid has finished.
    GridDepLaunchDependents();
#endif
    const int tid = threadIdx.x;
    const int warp = tid >> 5;
    const int lane = tid & 31;

    const VerifyWorkItem wi = args.work[blockIdx.x];
    const int H = args.num_heads;
    const int M = wi.num_nodes * H;  // folded rows of the request
    const int rows_here = min(BM, M - wi.fold_begin);
    const int ctx_len = wi.kv_len - wi.num_nodes;  // P_b: keys before the tail
    const int num_keys = wi.kv_end - wi.kv_begin;
    const int num_tiles = (num_keys + BN - 1) / BN;
    const int32_t* idx_base = WorkItemKeys(args, wi);

    if (tid < BM) {
      sM[tid] = -INFINITY;
      sL[tid] = 0.f;
    }

    // Q tile: BM folded rows x 576, rows past the request zero-filled.
    {
      const __nv_bfloat16* q_base =
          args.q + (static_cast<int64_t>(wi.q_row0) * H + wi.fold_begin) * kQkDim;
      for (int c = tid; c < BM * kChunksPerRow; c += kMmaThreads) {
        const int r = c / kChunksPerRow;
        const int ch = c - r * kChunksPerRow;
        const bool valid = r < rows_here;
        const __nv_bfloat16* src =
            valid ? q_base + static_cast<int64_t>(r) * kQkDim + ch * 8 : args.q;
        CpAsync16(SmemAddr(sQ + r * kMmaSmemStride + ch * 8), src, valid);
      }
    }

    // KV loader: warp w gathers keys w, w+8, ... of a tile; lanes stream the row's 16-byte
    // chunks. Slot ids of the next tile are fetched one iteration ahead.
    constexpr int kKeysPerWarp = BN / kMmaWarps;
    auto load_slots = [&](int tile, int32_t* slots) {
#pragma unroll
      for (int j = 0; j < kKeysPerWarp; ++j) {
        const int key = wi.kv_begin + tile * BN + warp + j * kMmaWarps;
        slots[j] = key < wi.kv_end ? __ldg(idx_base + key) : -1;
      }
    };
    auto load_tile = [&](int stage, const int32_t* slots) {
#pragma unroll
      for (int j = 0; j < kKeysPerWarp; ++j) {
        const int k = warp + j * kMmaWarps;
        const bool valid = slots[j] >= 0;
        if constexpr (kFp8) {
          // The FP8 row as stored (656 bytes: 41 chunks) into the stage.
          const unsigned char* src_row =
              reinterpret_cast<const unsigned char*>(args.kv) +
              (valid ? static_cast<int64_t>(slots[j]) * kFp8RowBytes : 0);
          const uint32_t dst_row =
              SmemAddr(sStaging + stage * Tr::kFp8StageBytes + k * kFp8RowBytes);
#pragma unroll
          for (int ch = lane; ch < kFp8ChunksPerRow; ch += 32) {
            CpAsync16(dst_row + ch * 16, src_row + ch * 16, valid);
          }
        } else {
          const __nv_bfloat16* src_row =
              args.kv + (valid ? static_cast<int64_t>(slots[j]) * kQkDim : 0);
          const uint32_t dst_row = SmemAddr(sKV + stage * BN * kMmaSmemStride + k * kMmaSmemStride);
#pragma unroll
          for (int ch = lane; ch < kChunksPerRow; ch += 32) {
            CpAsync16(dst_row + ch * 16, src_row + ch * 8, valid);
          }
        }
      }
    };
    // FP8 cache: dequantizes stage `stage` into the bf16 tile. Codes: thread t takes 8 codes
    // (8 bytes) of key t / 64 + 4 i, columns 8 (t % 64) on, i < BN / 4; each value becomes
    // bf16(float(code) * scale) (one rounding of the exact product). Rope: 16 bytes a thread.
    auto dequantize_stage = [&](int stage) {
      const unsigned char* st = sStaging + stage * Tr::kFp8StageBytes;
      const int part = tid & 63;  // 8-code chunk within the row
#pragma unroll
      for (int i = 0; i < BN * 64 / kMmaThreads; ++i) {
        const int key = (tid >> 6) + i * (kMmaThreads / 64);
        const unsigned char* row = st + key * kFp8RowBytes;
        const uint2 codes = *reinterpret_cast<const uint2*>(row + part * 8);
        const float scale =
            *reinterpret_cast<const float*>(row + kFp8ScaleOffset + (part >> 4) * 4);
        uint4 out;
        out.x = DequantE4m3x2(static_cast<uint16_t>(codes.x & 0xffffu), scale);
        out.y = DequantE4m3x2(static_cast<uint16_t>(codes.x >> 16), scale);
        out.z = DequantE4m3x2(static_cast<uint16_t>(codes.y & 0xffffu), scale);
        out.w = DequantE4m3x2(static_cast<uint16_t>(codes.y >> 16), scale);
        *reinterpret_cast<uint4*>(sKV + key * kMmaSmemStride + part * 8) = out;
      }
      static_assert(BN * 8 == kMmaThreads, "rope copy: one 16-byte chunk per thread");
      {
        const int key = tid >> 3;
        const int ch = tid & 7;
        *reinterpret_cast<uint4*>(sKV + key * kMmaSmemStride + kVDim + ch * 8) =
            *reinterpret_cast<const uint4*>(st + key * kFp8RowBytes + kFp8RopeOffset + ch * 16);
      }
    };

    int32_t next_slots[kKeysPerWarp];
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < num_tiles) {
        load_slots(s, next_slots);
        load_tile(s, next_slots);
      }
      CpAsyncCommit();  // group s (group 0 also holds Q)
    }
    if (STAGES - 1 < num_tiles) load_slots(STAGES - 1, next_slots);

    // S work assignment.
    const int s_tile0 = Tr::kKSplit > 1 ? (warp % Tr::kSTiles) : warp * Tr::kTilesPerWarp;
    const int s_ks = Tr::kKSplit > 1 ? (warp / Tr::kSTiles) : 0;
    const int s_mt = s_tile0 / Tr::kNTiles;
    const int s_nt = s_tile0 % Tr::kNTiles;
    const int s_k0 = s_ks * Tr::kKSteps;  // first k16 step

    uint32_t qfrag[Tr::kQInRegs ? Tr::kKSteps : 1][4];

    // O accumulators: rows of m-tile mt, columns warp*64 + nt*8.
    float acc[Tr::kMTiles][8][4];
#pragma unroll
    for (int mt = 0; mt < Tr::kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;

    const int g = lane >> 2;  // mma fragment row
    const int tq = lane & 3;  // mma fragment column pair

    for (int tile = 0; tile < num_tiles; ++tile) {
      CpAsyncWait<STAGES - 2>();
      __syncthreads();

      if constexpr (Tr::kQInRegs) {
        if (tile == 0) {
#pragma unroll
          for (int k = 0; k < Tr::kKSteps; ++k) {
            const int row = (lane & 7) + ((lane >> 3) & 1) * 8;
            const int col = (s_k0 + k) * 16 + (lane >> 4) * 8;
            LdMatrixX4(SmemAddr(sQ + row * kMmaSmemStride + col), qfrag[k][0], qfrag[k][1],
                       qfrag[k][2], qfrag[k][3]);
          }
          // FP8 cache: Q's tile is the bf16 KV tile the dequantization overwrites next.
          if constexpr (kFp8) __syncthreads();
        }
      }

      // Issue the tile STAGES-1 ahead into the stage freed by the previous iteration.
      {
        const int ahead = tile + STAGES - 1;
        if (ahead < num_tiles) {
          load_tile(ahead % STAGES, next_slots);
          if (ahead + 1 < num_tiles) load_slots(ahead + 1, next_slots);
        }
        CpAsyncCommit();
      }

      const __nv_bfloat16* sK = sKV;
      if constexpr (kFp8) {
        // The previous tile's P V is done (the barrier at the top), so the bf16 tile is free.
        dequantize_stage(tile % STAGES);
        __syncthreads();
      } else {
        sK = sKV + (tile % STAGES) * BN * kMmaSmemStride;
      }

      // ---- S = Q K^T (partial over this warp's k range) ----
      {
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
            for (int e = 0; e < 4; ++e) a[e] = qfrag[k][e];
          } else {
            const int row = s_mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
            const int col = (s_k0 + k) * 16 + (lane >> 4) * 8;
            LdMatrixX4(SmemAddr(sQ + row * kMmaSmemStride + col), a[0], a[1], a[2], a[3]);
          }
          const int dcol = (s_k0 + k) * 16 + ((lane >> 3) & 1) * 8;
          if constexpr (Tr::kTilesPerWarp == 2) {
            const int key = s_nt * 8 + (lane & 7) + (lane >> 4) * 8;
            uint32_t b0, b1, b2, b3;
            LdMatrixX4(SmemAddr(sK + key * kMmaSmemStride + dcol), b0, b1, b2, b3);
            Mma16816(sacc[k & 1][0], a, b0, b1);
            Mma16816(sacc[k & 1][Tr::kTilesPerWarp - 1], a, b2, b3);
          } else {
            const int key = s_nt * 8 + (lane & 7);
            uint32_t b0, b1;
            LdMatrixX2(SmemAddr(sK + key * kMmaSmemStride + dcol), b0, b1);
            Mma16816(sacc[k & 1][0], a, b0, b1);
          }
        }
#pragma unroll
        for (int t = 0; t < Tr::kTilesPerWarp; ++t)
#pragma unroll
          for (int e = 0; e < 4; ++e) sacc[0][t][e] += sacc[1][t][e];
        float* sSk = sS + s_ks * BM * Tr::kSStride;
#pragma unroll
        for (int t = 0; t < Tr::kTilesPerWarp; ++t) {
          const int col = (s_nt + t) * 8 + tq * 2;
          const int row = s_mt * 16 + g;
          *reinterpret_cast<float2*>(sSk + row * Tr::kSStride + col) =
              make_float2(sacc[0][t][0], sacc[0][t][1]);
          *reinterpret_cast<float2*>(sSk + (row + 8) * Tr::kSStride + col) =
              make_float2(sacc[0][t][2], sacc[0][t][3]);
        }
      }
      __syncthreads();

      // ---- online softmax (log2 domain) ----
      {
        const int row = tid / Tr::kTpr;
        const int sub = tid % Tr::kTpr;
        const int c0 = sub * Tr::kEpt;
        const int key0 = wi.kv_begin + tile * BN;  // request-local key of column 0
        const bool masked = (key0 + BN > ctx_len) || (key0 + BN > wi.kv_end);
        float s[Tr::kEpt];
#pragma unroll
        for (int e = 0; e < Tr::kEpt; ++e) {
          float v = 0.f;
#pragma unroll
          for (int ks = 0; ks < Tr::kKSplit; ++ks) v += sS[(ks * BM + row) * Tr::kSStride + c0 + e];
          s[e] = v * args.scale_log2;
        }
        if (masked) {
          const int f = wi.fold_begin + row;
          const uint64_t* mrow =
              f < M ? args.tree_mask + static_cast<int64_t>(wi.q_row0 + f / H) * args.mask_words
                    : nullptr;
#pragma unroll
          for (int e = 0; e < Tr::kEpt; ++e) {
            const int key = key0 + c0 + e;
            bool vis = key < wi.kv_end;
            if (vis && key >= ctx_len && mrow != nullptr) {
              const int t = key - ctx_len;
              vis = (__ldg(mrow + (t >> 6)) >> (t & 63)) & 1ull;
            }
            if (!vis) s[e] = -INFINITY;
          }
        }
        float mx = s[0];
#pragma unroll
        for (int e = 1; e < Tr::kEpt; ++e) mx = fmaxf(mx, s[e]);
#pragma unroll
        for (int off = Tr::kTpr / 2; off > 0; off >>= 1)
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        const float m_old = sM[row];
        const float m_new = fmaxf(m_old, mx);
        const bool none = (m_new == -INFINITY);
        const float alpha = none ? 1.f : exp2f(m_old - m_new);
        float sum = 0.f;
        __nv_bfloat16* prow = sP + row * Tr::kPStride + c0;
#pragma unroll
        for (int e = 0; e < Tr::kEpt; ++e) {
          const float p = none ? 0.f : exp2f(s[e] - m_new);
          sum += p;
          prow[e] = __float2bfloat16_rn(p);
        }
#pragma unroll
        for (int off = Tr::kTpr / 2; off > 0; off >>= 1)
          sum += __shfl_xor_sync(0xffffffffu, sum, off);
        if (sub == 0) {
          sM[row] = m_new;
          sL[row] = sL[row] * alpha + sum;
          sAlpha[row] = alpha;
        }
      }
      __syncthreads();

      // ---- O = O * alpha + P V ----
      {
#pragma unroll
        for (int mt = 0; mt < Tr::kMTiles; ++mt) {
          const float a_lo = sAlpha[mt * 16 + g];
          const float a_hi = sAlpha[mt * 16 + g + 8];
#pragma unroll
          for (int nt = 0; nt < 8; ++nt) {
            acc[mt][nt][0] *= a_lo;
            acc[mt][nt][1] *= a_lo;
            acc[mt][nt][2] *= a_hi;
            acc[mt][nt][3] *= a_hi;
          }
        }
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
          uint32_t pa[Tr::kMTiles][4];
#pragma unroll
          for (int mt = 0; mt < Tr::kMTiles; ++mt) {
            const int row = mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
            const int col = kk * 16 + (lane >> 4) * 8;
            LdMatrixX4(SmemAddr(sP + row * Tr::kPStride + col), pa[mt][0], pa[mt][1], pa[mt][2],
                       pa[mt][3]);
          }
#pragma unroll
          for (int np = 0; np < 4; ++np) {
            const int key = kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
            const int col = warp * 64 + np * 16 + (lane >> 4) * 8;
            uint32_t b0, b1, b2, b3;
            LdMatrixX4Trans(SmemAddr(sK + key * kMmaSmemStride + col), b0, b1, b2, b3);
#pragma unroll
            for (int mt = 0; mt < Tr::kMTiles; ++mt) {
              Mma16816(acc[mt][2 * np], pa[mt], b0, b1);
              Mma16816(acc[mt][2 * np + 1], pa[mt], b2, b3);
            }
          }
        }
      }
    }
    CpAsyncWait<0>();
    __syncthreads();  // sM / sL final (also covers num_tiles == 0)

    // ---- epilogue ----
    const bool direct = wi.partial_row < 0;
    const int64_t out_row0 = static_cast<int64_t>(wi.q_row0) * H + wi.fold_begin;
#pragma unroll
    for (int mt = 0; mt < Tr::kMTiles; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = mt * 16 + g + half * 8;
        if (r >= rows_here) continue;
        const float l = sL[r];
        const float inv = l > 0.f ? 1.f / l : 0.f;
        if (direct) {
          __nv_bfloat16* orow = args.out + (out_row0 + r) * kVDim + warp * 64 + tq * 2;
#pragma unroll
          for (int nt = 0; nt < 8; ++nt) {
            *reinterpret_cast<__nv_bfloat162*>(orow + nt * 8) =
                __floats2bfloat162_rn(acc[mt][nt][half * 2] * inv, acc[mt][nt][half * 2 + 1] * inv);
          }
        } else {
          float* prow =
              args.part_o + static_cast<int64_t>(wi.partial_row + r) * kVDim + warp * 64 + tq * 2;
#pragma unroll
          for (int nt = 0; nt < 8; ++nt) {
            *reinterpret_cast<float2*>(prow + nt * 8) =
                make_float2(acc[mt][nt][half * 2] * inv, acc[mt][nt][half * 2 + 1] * inv);
          }
        }
      }
    }
    if (tid < rows_here) {
      const float l = sL[tid];
      const float lse2 = l > 0.f ? sM[tid] + log2f(l) : -INFINITY;
      if (direct) {
        if (args.lse != nullptr) args.lse[out_row0 + tid] = lse2 * 0.69314718055994531f;
      } else {
        args.part_lse[wi.partial_row + tid] = lse2;
      }
    }
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
