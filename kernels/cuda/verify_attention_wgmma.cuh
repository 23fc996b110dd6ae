// The verify attention kernel, wgmma path (sm_90a: H100 / H200), 64 folded rows per CTA.
//
// Same work item, pipeline and semantics as the mma.sync kernel (verify_attention_kernel.cuh);
// the math runs on warpgroup MMA:
//   smem      Q [64 x 576] and each KV stage [BN x 576] in 128-byte-swizzled atoms of
//             64 columns (atom a holds columns 64a..64a+63 of every row, 128 B per row, the
//             16-byte chunks of row r XOR-permuted by r % 8), written by 16-byte cp.async.
//   S         warpgroup g computes the partial S[64 x BN] over latent columns
//             [288g, 288g+288): wgmma m64nBNk16, A = Q and B = K both from smem (K-major).
//             The two partials meet in smem; both warpgroups add them in the same order
//             (S0 + S1), so both hold identical scores and run the same online softmax.
//   softmax   in registers (a row lives in the 4 threads of a quad), log2 domain; only tail
//             tiles are masked.
//   O += P V  warpgroup g owns output columns [256g, 256g+256): two wgmma m64n128k16 per 16
//             keys, A = P from registers (the S accumulator layout is the A fragment layout),
//             B = V read from the same smem tile as an MN-major operand (transposed).
// Internal header: included by verify_attention_wgmma.cu only.
#pragma once

#include <atomic>

#include "kernels/cuda/verify_attention_kernel.cuh"
#include "kernels/cuda/wgmma_ops.cuh"

namespace verifyd::kernels::cuda::detail {

template <int BN, int STAGES>
struct WgmmaTraits {
  static constexpr int kRows = 64;
  static constexpr int kAtomQ = kRows * 128;   // bytes of one 64-column atom of Q
  static constexpr int kAtomKV = BN * 128;     // bytes of one 64-column atom of a KV stage
  static constexpr int kAtoms = kQkDim / 64;   // 9
  static constexpr int kQBytes = kAtoms * kAtomQ;
  static constexpr int kStageBytes = kAtoms * kAtomKV;
  static constexpr int kSRegs = BN / 2;        // S accumulator floats per thread
  static constexpr int kSBytes = 2 * kSRegs * 128 * 4;
  static constexpr size_t kSmemBytes =
      1024 + kQBytes + static_cast<size_t>(STAGES) * kStageBytes + kSBytes;
  static_assert(BN == 32 || BN == 64, "S wgmma shapes: n32 or n64");
  static_assert(BN % kWarps == 0, "loader");
};

__device__ __forceinline__ uint32_t SwizzledOffset(int row, int chunk, int atom_bytes) {
  const int atom = chunk >> 3;
  const int j = chunk & 7;
  return static_cast<uint32_t>(atom * atom_bytes + row * 128 + ((j ^ (row & 7)) << 4));
}

template <int BN, int STAGES>
__global__ void __launch_bounds__(kThreads, 1)
    VerifyAttentionWgmmaKernel(const VerifyKernelArgs args) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tr = WgmmaTraits<BN, STAGES>;
  extern __shared__ unsigned char smem_raw[];
  // 128-byte swizzle atoms repeat every 1024 B: align the tiles to that.
  const uint32_t raw_addr = SmemAddr(smem_raw);
  const uint32_t base_addr = (raw_addr + 1023u) & ~1023u;
  unsigned char* smem = smem_raw + (base_addr - raw_addr);
  const uint32_t sQ = base_addr;
  const uint32_t sKV = base_addr + Tr::kQBytes;
  float* sS = reinterpret_cast<float*>(smem + Tr::kQBytes + STAGES * Tr::kStageBytes);

  asm volatile("griddepcontrol.launch_dependents;\n");
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int wg = warp >> 2;        // warpgroup
  const int wl = warp & 3;         // warp within the warpgroup: rows 16*wl ..
  const int t128 = tid & 127;
  const int g = lane >> 2;
  const int q4 = lane & 3;

  const VerifyWorkItem wi = args.work[blockIdx.x];
  const int H = args.num_heads;
  const int M = wi.num_nodes * H;
  const int rows_here = min(Tr::kRows, M - wi.fold_begin);
  const int ctx_len = wi.kv_len - wi.num_nodes;
  const int num_keys = wi.kv_end - wi.kv_begin;
  const int num_tiles = (num_keys + BN - 1) / BN;
  const int32_t* idx_base = args.kv_indices + wi.kv_off;

  // This thread's two rows (g and g + 8 of its warp's 16) and their tree-mask words.
  int row_of[2];
  uint64_t mask_of[2][2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_of[h] = wl * 16 + g + 8 * h;
    const int f = wi.fold_begin + row_of[h];
    mask_of[h][0] = mask_of[h][1] = ~0ull;  // rows past the request: unmasked, not written
    if (f < M) {
      const uint64_t* mrow =
          args.tree_mask + static_cast<int64_t>(wi.q_row0 + f / H) * args.mask_words;
      mask_of[h][0] = __ldg(mrow);
      mask_of[h][1] = args.mask_words > 1 ? __ldg(mrow + 1) : 0ull;
    }
  }

  // Q tile (rows past the request zero-filled), swizzled.
  {
    const __nv_bfloat16* q_base =
        args.q + (static_cast<int64_t>(wi.q_row0) * H + wi.fold_begin) * kQkDim;
    for (int c = tid; c < Tr::kRows * kChunksPerRow; c += kThreads) {
      const int r = c / kChunksPerRow;
      const int ch = c - r * kChunksPerRow;
      const bool valid = r < rows_here;
      const __nv_bfloat16* src =
          valid ? q_base + static_cast<int64_t>(r) * kQkDim + ch * 8 : args.q;
      CpAsync16(sQ + SwizzledOffset(r, ch, Tr::kAtomQ), src, valid);
    }
  }

  constexpr int kKeysPerWarp = BN / kWarps;
  auto load_slots = [&](int tile, int32_t* slots) {
#pragma unroll
    for (int j = 0; j < kKeysPerWarp; ++j) {
      const int key = wi.kv_begin + tile * BN + warp + j * kWarps;
      slots[j] = key < wi.kv_end ? __ldg(idx_base + key) : -1;
    }
  };
  // Loader offsets are the same for every tile: key k = warp + 8 j has k % 8 == warp, so the
  // swizzled destination of chunk `lane + 32 c` is dst_off[c] + j * 1024.
  uint32_t dst_off[3];
#pragma unroll
  for (int c = 0; c < 3; ++c) dst_off[c] = SwizzledOffset(warp, lane + 32 * c, Tr::kAtomKV);
  const bool third_chunk = lane + 64 < kChunksPerRow;
  auto load_tile = [&](int stage, const int32_t* slots) {
    const uint32_t dst_stage = sKV + stage * Tr::kStageBytes;
#pragma unroll
    for (int j = 0; j < kKeysPerWarp; ++j) {
      const bool valid = slots[j] >= 0;
      const __nv_bfloat16* src_row =
          args.kv + (valid ? static_cast<int64_t>(slots[j]) * kQkDim : 0) + lane * 8;
      const uint32_t dst = dst_stage + j * kWarps * 128;
      CpAsync16(dst + dst_off[0], src_row, valid);
      CpAsync16(dst + dst_off[1], src_row + 256, valid);
      if (third_chunk) CpAsync16(dst + dst_off[2], src_row + 512, valid);
    }
  };

  int32_t next_slots[kKeysPerWarp];
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < num_tiles) {
      load_slots(s, next_slots);
      load_tile(s, next_slots);
    }
    CpAsyncCommit();
  }
  if (STAGES - 1 < num_tiles) load_slots(STAGES - 1, next_slots);

  float o[2][64];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
#pragma unroll
    for (int i = 0; i < 64; ++i) o[hf][i] = 0.f;
  float m_r[2] = {-INFINITY, -INFINITY};
  float l_r[2] = {0.f, 0.f};  // this thread's partial row sums (quad-reduced at the end)

  for (int tile = 0; tile < num_tiles; ++tile) {
    CpAsyncWait<STAGES - 2>();
    FenceProxyAsyncShared();
    __syncthreads();
    // Every thread has waited for PV(tile - 1): its stage takes the tile STAGES-1 ahead.
    {
      const int ahead = tile + STAGES - 1;
      if (ahead < num_tiles) {
        load_tile(ahead % STAGES, next_slots);
        if (ahead + 1 < num_tiles) load_slots(ahead + 1, next_slots);
      }
      CpAsyncCommit();
    }
    const uint32_t sK = sKV + (tile % STAGES) * Tr::kStageBytes;

    // ---- partial S over this warpgroup's 288 latent columns ----
    // Two accumulator chains (even / odd k steps): small-N wgmmas into one accumulator are
    // latency-bound; the chains overlap. Each is written first by a scale-d-0 wgmma.
    float s[Tr::kSRegs];
    float s2[Tr::kSRegs];
    // Descriptors: the address field is (addr >> 4) in the low 14 bits and shared memory is
    // < 256 KB, so adding (offset >> 4) to a base descriptor never carries out of it.
    const uint64_t da0 = WgmmaDesc(sQ, 16, 1024);
    const uint64_t db0 = WgmmaDesc(sK, 16, 1024);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < 18; ++kk) {
      const int k = wg * 18 + kk;  // k16 step over the 576 columns
      const uint64_t da = da0 + (((k >> 2) * Tr::kAtomQ + (k & 3) * 32) >> 4);
      const uint64_t db = db0 + (((k >> 2) * Tr::kAtomKV + (k & 3) * 32) >> 4);
      float* acc = (kk & 1) ? s2 : s;
      if constexpr (BN == 32) {
        if (kk < 2) {
          WgmmaM64N32SmemAFirst(acc, da, db);
        } else {
          WgmmaM64N32SmemA(acc, da, db, 1);
        }
      } else {
        if (kk < 2) {
          WgmmaM64N64SmemAFirst(acc, da, db);
        } else {
          WgmmaM64N64SmemA(acc, da, db, 1);
        }
      }
    }
    WgmmaCommit();
    WgmmaWait<0>();
#pragma unroll
    for (int i = 0; i < Tr::kSRegs; ++i) s[i] += s2[i];
#pragma unroll
    for (int i = 0; i < Tr::kSRegs; ++i) sS[(wg * Tr::kSRegs + i) * 128 + t128] = s[i];
    __syncthreads();
#pragma unroll
    for (int i = 0; i < Tr::kSRegs; ++i) {
      const float other = sS[((1 - wg) * Tr::kSRegs + i) * 128 + t128];
      s[i] = wg == 0 ? s[i] + other : other + s[i];  // S0 + S1 in both warpgroups
    }

    // ---- online softmax in registers ----
    const int key0 = wi.kv_begin + tile * BN;
    const bool masked = (key0 + BN > ctx_len) || (key0 + BN > wi.kv_end);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < Tr::kSRegs; ++i) {
      const int h = (i & 3) >> 1;
      float v = s[i] * args.scale_log2;
      if (masked) {
        const int key = key0 + (i >> 2) * 8 + q4 * 2 + (i & 1);
        bool vis = key < wi.kv_end;
        if (vis && key >= ctx_len) {
          const int t = key - ctx_len;
          vis = (((t >> 6) ? mask_of[h][1] : mask_of[h][0]) >> (t & 63)) & 1ull;
        }
        if (!vis) v = -INFINITY;
      }
      s[i] = v;
      mx[h] = fmaxf(mx[h], v);
    }
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      const float m_new = fmaxf(m_r[h], mx[h]);
      alpha[h] = m_new == -INFINITY ? 1.f : exp2f(m_r[h] - m_new);
      m_r[h] = m_new;
      l_r[h] *= alpha[h];
    }
#pragma unroll
    for (int i = 0; i < Tr::kSRegs; ++i) {
      const int h = (i & 3) >> 1;
      const float p = m_r[h] == -INFINITY ? 0.f : exp2f(s[i] - m_r[h]);
      l_r[h] += p;
      s[i] = p;
    }
    // Once the running max settles, most tiles leave it unchanged: skip the 128-register
    // rescale when no row of this warp moved.
    if (!__all_sync(0xffffffffu, alpha[0] == 1.f && alpha[1] == 1.f)) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
#pragma unroll
        for (int i = 0; i < 64; ++i) o[hf][i] *= alpha[(i & 3) >> 1];
    }
    uint32_t pa[BN / 16][4];
#pragma unroll
    for (int j = 0; j < BN / 16; ++j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        __nv_bfloat162 v = __floats2bfloat162_rn(s[8 * j + 2 * r], s[8 * j + 2 * r + 1]);
        pa[j][r] = *reinterpret_cast<uint32_t*>(&v);
      }
    }

    // ---- O[:, 256 wg + 128 hf ...] += P V ----
    const uint64_t dv0 = WgmmaDesc(sK + wg * 4 * Tr::kAtomKV, Tr::kAtomKV, 1024);
    WgmmaFence();
#pragma unroll
    for (int j = 0; j < BN / 16; ++j) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        // 128 columns from atom 4 wg + 2 hf; keys 16 j .. 16 j + 15.
        const uint64_t dv = dv0 + ((hf * 2 * Tr::kAtomKV + j * 2048) >> 4);
        WgmmaM64N128RegA(o[hf], pa[j], dv, 1);
      }
    }
    WgmmaCommit();
    // Waiting here (not at the next S) keeps ptxas from serialising the S wgmmas (C7515).
    WgmmaWait<0>();
  }
  CpAsyncWait<0>();

  // ---- epilogue ----
  float l_tot[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_r[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    l_tot[h] = l;
  }
  const bool direct = wi.partial_row < 0;
  const int64_t out_row0 = static_cast<int64_t>(wi.q_row0) * H + wi.fold_begin;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row_of[h];
    if (r >= rows_here) continue;
    const float inv = l_tot[h] > 0.f ? 1.f / l_tot[h] : 0.f;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int col0 = wg * 256 + hf * 128 + q4 * 2;
      if (direct) {
        __nv_bfloat16* orow = args.out + (out_row0 + r) * kVDim + col0;
#pragma unroll
        for (int nb = 0; nb < 16; ++nb) {
          *reinterpret_cast<__nv_bfloat162*>(orow + nb * 8) = __floats2bfloat162_rn(
              o[hf][nb * 4 + 2 * h] * inv, o[hf][nb * 4 + 2 * h + 1] * inv);
        }
      } else {
        float* prow = args.part_o + static_cast<int64_t>(wi.partial_row + r) * kVDim + col0;
#pragma unroll
        for (int nb = 0; nb < 16; ++nb) {
          *reinterpret_cast<float2*>(prow + nb * 8) =
              make_float2(o[hf][nb * 4 + 2 * h] * inv, o[hf][nb * 4 + 2 * h + 1] * inv);
        }
      }
    }
    if (wg == 0 && q4 == 0) {
      const float lse2 = l_tot[h] > 0.f ? m_r[h] + log2f(l_tot[h]) : -INFINITY;
      if (direct) {
        if (args.lse != nullptr) args.lse[out_row0 + r] = lse2 * 0.69314718055994531f;
      } else {
        args.part_lse[wi.partial_row + r] = lse2;
      }
    }
  }
#endif
}

template <int BN, int STAGES>
cudaError_t LaunchVerifyAttentionWgmma(const VerifyKernelArgs& args, int grid,
                                       cudaStream_t stream) {
  using Tr = WgmmaTraits<BN, STAGES>;
  auto* kernel = &VerifyAttentionWgmmaKernel<BN, STAGES>;
  // The opt-in shared-memory size is set once per device (a host call per launch would add
  // latency to every layer).
  static std::atomic<uint64_t> configured_devices{0};
  const cudaError_t err = ConfigureOncePerDevice(configured_devices, [&] {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(Tr::kSmemBytes));
  });
  if (err != cudaSuccess) return err;
  kernel<<<grid, kThreads, Tr::kSmemBytes, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace verifyd::kernels::cuda::detail
