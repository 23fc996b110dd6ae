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
// The roles above are functions the kernel below calls (all inlined): SeesawProducer,
// SeesawMathWg0 / SeesawMathWg1 (one tile pair each), SeesawEpilogue and their phases in
// seesaw_roles.cuh; SeesawFp8Producer and ConvertTileFp8 in seesaw_fp8.cuh; the tile-level
// steps (Q K^T, softmax, P V) and the shared-memory addressing in seesaw_tiles.cuh.
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/verify_attention/kernel_args.cuh"
#include "kernels/cuda/verify_attention/ptx.cuh"
#include "kernels/cuda/verify_attention/seesaw_layout.h"
#include "kernels/cuda/verify_attention/seesaw_roles.cuh"
#include "kernels/cuda/verify_attention/variants.h"

namespace verifyd::kernels::cuda::detail {

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
  const SeesawCta cta{base, smem_raw + (base - raw_addr), SeesawBarriers{base + Tr::kBarOff}};

  GridDepLaunchDependents();
  const int tid = threadIdx.x;
  // Warp-uniform by construction; the shuffle lets the compiler know (wgmma in a branch the
  // compiler thinks divergent gets serialised).
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
  const int t128 = tid & 127;
  const int lane = tid & 31;

  if (tid == 0) SeesawInitBarriers(cta.bars);
  __syncthreads();

  if (wg == 2) {
    SetMaxRegsDec<Tr::kProducerRegs>();
    if constexpr (kFp8) {
      SeesawFp8Producer(args, cta);
    } else {
      SeesawProducer(args, cta, t128, lane);
    }
    return;
  }

  SetMaxRegsInc<Tr::kMathRegs>();
  SeesawMathThread th = SeesawMathThreadOf<kFp8>(args, tid, wg, t128, lane);
  SeesawMathState st;
  InitSeesawMathState(st);
  SeesawWaitQ<kFp8>(cta, th);
  for (int p = 0; p < th.num_pairs; ++p) {
    if (wg == 0) {
      SeesawMathWg0<kFp8>(args, cta, th, st, p);
    } else {
      SeesawMathWg1<kFp8>(args, cta, th, st, p);
    }
    if constexpr (!kFp8) SeesawEndOfPair(args, cta, th, st, p);
  }
  SeesawEpilogue<kFp8>(args, cta, th, st);
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
