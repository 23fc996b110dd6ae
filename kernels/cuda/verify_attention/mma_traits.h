// Geometry of the mma.sync verify attention kernel (mma.cuh): shared-memory layout and the
// work split of one CTA for BM folded rows, BN-key tiles and STAGES pipeline stages. Plain
// C++ (no CUDA headers), so the variant table (variants.h) and the planner read the same
// numbers the kernel uses. Thread-safety: constants only.
#pragma once

#include <cstddef>

namespace verifyd::kernels::cuda::detail {

inline constexpr int kQkDim = 576;  // latent width (kv_lora_rank + rope)
inline constexpr int kVDim = 512;   // value width (the first 512 latent columns)

inline constexpr int kMmaSmemStride = kQkDim + 8;  // bf16 per smem row (+16 B: no ldmatrix
                                                   // bank conflicts)
inline constexpr int kChunksPerRow = kQkDim / 8;   // 16-byte chunks per latent row
inline constexpr int kMmaThreads = 256;
inline constexpr int kMmaWarps = kMmaThreads / 32;

// Shared memory (dynamic, 128-byte aligned), in this order:
//   Q       [BM][kMmaSmemStride] bf16
//   KV      [STAGES][BN][kMmaSmemStride] bf16 (V = the first 512 columns of a stage)
//   S       [kKSplit][BM][kSStride] fp32   partial Q K^T sums of the k-split warp groups
//   P       [BM][kPStride] bf16            probabilities of the current tile
//   m, l, alpha [BM] fp32 each              running max, running sum, rescale factor
template <int BM, int BN, int STAGES>
struct MmaTraits {
  static constexpr int kMTiles = BM / 16;
  static constexpr int kNTiles = BN / 8;
  static constexpr int kSTiles = kMTiles * kNTiles;
  static constexpr int kKSplit = kSTiles >= kMmaWarps ? 1 : kMmaWarps / kSTiles;
  static constexpr int kTilesPerWarp = kSTiles >= kMmaWarps ? kSTiles / kMmaWarps : 1;
  static constexpr int kKSteps = kQkDim / 16 / kKSplit;  // k16 steps per warp in S
  // Q fragments stay in registers with 16 rows (register budget of one CTA per SM).
  static constexpr bool kQInRegs = (BM == 16);
  static constexpr int kSStride = BN + 4;        // floats
  static constexpr int kPStride = BN + 8;        // bf16
  static constexpr int kTpr = kMmaThreads / BM;  // softmax threads per row
  static constexpr int kEpt = BN / kTpr;         // softmax elements per thread

  static constexpr size_t kQBytes = size_t(BM) * kMmaSmemStride * 2;
  static constexpr size_t kKvStageBytes = size_t(BN) * kMmaSmemStride * 2;
  static constexpr size_t kSBytes = size_t(kKSplit) * BM * kSStride * 4;
  static constexpr size_t kPBytes = size_t(BM) * kPStride * 2;
  static constexpr size_t kStatBytes = size_t(3) * BM * 4;
  static constexpr size_t kSmemBytes =
      kQBytes + STAGES * kKvStageBytes + kSBytes + kPBytes + kStatBytes;

  static_assert(BM % 16 == 0 && BN % 16 == 0, "tile shape");
  static_assert(kSTiles >= kMmaWarps ? (kSTiles % kMmaWarps == 0 && kNTiles % kTilesPerWarp == 0)
                                     : (kMmaWarps % kSTiles == 0),
                "S work split");
  static_assert(kTilesPerWarp <= 2, "S: at most two n-tiles per warp");
  static_assert((kQkDim / 16) % kKSplit == 0, "K split");
  static_assert(kTpr <= 32 && kEpt >= 1, "softmax mapping");
  static_assert(BN % kMmaWarps == 0, "loader: keys per warp");
  static_assert(STAGES >= 2, "pipeline");
};

}  // namespace verifyd::kernels::cuda::detail
