// The verify attention kernel, "seesaw" wgmma schedule (sm_90a: H100 / H200), 64 folded rows
// per CTA, 64-key tiles. An additional variant next to verify_attention_wgmma.cuh (kW64),
// kAuto's many-rows choice on sm_90 (VerifyKernelConfig::kS64; see
// verify_attention_cuda.h); same work items, partial-output and LSE contract, so the planner,
// the combine kernel and the tests are shared. Design and predicted numbers:
// docs/KERNEL_NOTES.md.
//
// CTA = 3 warpgroups (384 threads):
//   WG2 (producer, setmaxnreg 24)  16-byte cp.async gathers of Q [64 x 576] and of the KV
//        tiles [64 keys x 576] (page size 1: one row address per key, no TMA) into a
//        2-buffer ring, in three column groups per tile (A: atoms 0-3 = columns 0..255,
//        B: atoms 4-7, C: atom 8 = rope), each signalled with cp.async.mbarrier.arrive
//        ("full" barriers). A group is refilled once its readers released it ("empty"
//        barriers): group A of buffer 0 is read only by WG0 (S0, P0 V0_L) and is released
//        in the middle of the pair, groups B/C of buffer 0 after WG1's P0 V0_R.
//   WG0 / WG1 (math, setmaxnreg 240)  the 64 x 512 fp32 output is split by columns:
//        WG0 owns O_L = columns [0, 256), WG1 owns O_R = [256, 512) (128 fp32 each/thread).
//        Tiles come in pairs (t0 = 2p in buffer 0, t1 = 2p + 1 in buffer 1):
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
//        Each warpgroup keeps its own row-sum partial (relative to the same running max);
//        they are added in the epilogue.
// smem (223,872 B of the 232,448 opt-in): Q (72 KB), 2 KV buffers (2 x 72 KB), row stats,
// mbarriers; P0 / P1 (bf16, 8 KB each) go into the rope atom of their KV buffer once Q K^T
// of that tile is done. All operand tiles are 128-byte-swizzled atoms of 64 columns (as
// kW64).
// Masking: only tiles that reach the request's tail keys or the end of the key range;
// tree-mask words are read from global memory only there.
// Internal header: included by verify_attention_seesaw.cu and the dispatcher.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/verify_attention_kernel.cuh"

namespace verifyd::kernels::cuda::detail {

struct SeesawTraits {
  static constexpr int kRows = 64;                 // folded rows per CTA
  static constexpr int kKeys = 64;                 // keys per tile
  static constexpr int kThreads = 384;             // 2 math warpgroups + 1 producer
  static constexpr int kAtom = 64 * 128;           // one 64-column swizzle atom of 64 rows
  static constexpr int kAtoms = kQkDim / 64;       // 9 per 576-column tile
  static constexpr int kQOff = 0;
  static constexpr int kKvOff = kQOff + kAtoms * kAtom;               // 73,728
  static constexpr int kStageBytes = kAtoms * kAtom;                  // 73,728
  static constexpr int kStages = 2;
  // P (64 x 64 bf16 = one atom) is exchanged through the rope atom (8) of the KV buffer it
  // belongs to: that atom is read only by Q K^T, which has finished when P is written, and
  // the producer refills the buffer only after both warpgroups released it.
  static constexpr int kPAtom = 8;
  static constexpr int kStatOff = kKvOff + kStages * kStageBytes;     // 221,184
  static constexpr int kStatFloats = 6 * kRows;  // m0, scale0, m1, scale1, l[2] per row
  static constexpr int kBarOff = kStatOff + kStatFloats * 4;          // 222,720
  static constexpr int kBarBytes = 128;          // 11 mbarriers (8 B each), see the kernel
  // + 1024: the dynamic smem base is aligned up to the 1024-byte swizzle period.
  static constexpr size_t kSmemBytes = 1024 + kBarOff + kBarBytes;    // 223,872
  static constexpr int kProducerRegs = 24;
  static constexpr int kMathRegs = 240;  // 24 + 2 * 240 = 504 = 168 * 3: what the launch allocated
};
static_assert(SeesawTraits::kSmemBytes <= 232448, "seesaw: over the sm_90 opt-in smem");

// Launches VerifyAttentionSeesawKernel (grid CTAs of 384 threads, kSmemBytes). sm_90a only:
// the kernel body is empty in other builds (the planner never selects it there).
cudaError_t LaunchVerifyAttentionSeesaw(const VerifyKernelArgs& args, int grid,
                                        cudaStream_t stream);

}  // namespace verifyd::kernels::cuda::detail
