// Geometry of the mma.sync verify attention kernel (mma.cuh): shared-memory layout and the
// work split of one CTA for BM folded rows, BN-key tiles and STAGES pipeline stages. Plain
// C++ (no CUDA headers), so the variant table (variants.h) and the planner read the same
// numbers the kernel uses. Thread-safety: constants only.
#pragma once

#include <cstddef>

#include "kernels/kv_fp8.h"

namespace verifyd::kernels::cuda::detail {

inline constexpr int kQkDim = 576;  // latent width (kv_lora_rank + rope)
inline constexpr int kVDim = 512;   // value width (the first 512 latent columns)

inline constexpr int kMmaSmemStride = kQkDim + 8;  // bf16 per smem row (+16 B: no ldmatrix
                                                   // bank conflicts)
inline constexpr int kChunksPerRow = kQkDim / 8;   // 16-byte chunks per latent row
inline constexpr int kMmaThreads = 256;
inline constexpr int kMmaWarps = kMmaThreads / 32;

// The FP8 latent row (kernels/kv_fp8.h with kv_lora 512, rope 64, a scale per 128 columns):
// 512 e4m3 codes, 4 float32 scales, 64 bf16 rope values.
inline constexpr int kFp8RowBytes =
    static_cast<int>(KvFp8RowBytes(kVDim, kQkDim - kVDim, kKvFp8Group));
inline constexpr int kFp8ScaleOffset = static_cast<int>(KvFp8ScaleOffset(kVDim));
inline constexpr int kFp8RopeOffset = static_cast<int>(KvFp8RopeOffset(kVDim, kKvFp8Group));
static_assert(kFp8RowBytes == 656 && kFp8ScaleOffset == 512 && kFp8RopeOffset == 528 &&
                  kFp8RowBytes % 16 == 0,
              "the FP8 row: 16-byte chunks, the scales and the rope part where the kernels expect");
inline constexpr int kFp8ChunksPerRow = kFp8RowBytes / 16;

// Shared memory (dynamic, 128-byte aligned), in this order:
//   Q       [BM][kMmaSmemStride] bf16
//   KV      [STAGES][BN][kMmaSmemStride] bf16 (V = the first 512 columns of a stage)
//   S       [kKSplit][BM][kSStride] fp32   partial Q K^T sums of the k-split warp groups
//   P       [BM][kPStride] bf16            probabilities of the current tile
//   m, l, alpha [BM] fp32 each              running max, running sum, rescale factor
// With an FP8 cache (KV_FP8) the gathers land in a ring of FP8 stages and the tile the MMAs
// read is one bf16 tile, dequantized from a stage by the CTA when its turn comes. Q in
// registers (Q_REGS): its tile aliases the bf16 tile (read into registers before the first
// dequantization); else it has its own:
//   KV      [BN][kMmaSmemStride] bf16 (Q [BM][kMmaSmemStride] at its start when Q_REGS)
//   STAGING [STAGES][BN][kFp8RowBytes] FP8 rows as stored
//   Q       [BM][kMmaSmemStride] bf16 (not Q_REGS)
//   S, P, m, l, alpha as above
template <int BM, int BN, int STAGES, bool KV_FP8 = false, bool Q_REGS = (BM == 16)>
struct MmaTraits {
  static constexpr int kMTiles = BM / 16;
  static constexpr int kNTiles = BN / 8;
  static constexpr int kSTiles = kMTiles * kNTiles;
  static constexpr int kKSplit = kSTiles >= kMmaWarps ? 1 : kMmaWarps / kSTiles;
  static constexpr int kTilesPerWarp = kSTiles >= kMmaWarps ? kSTiles / kMmaWarps : 1;
  static constexpr int kKSteps = kQkDim / 16 / kKSplit;  // k16 steps per warp in S
  // Q fragments stay in registers with 16 rows (register budget of one CTA per SM) unless
  // the variant asks otherwise (Q_REGS: two CTAs per SM leave 128 registers a thread).
  static constexpr bool kQInRegs = Q_REGS;
  static constexpr int kSStride = BN + 4;        // floats
  static constexpr int kPStride = BN + 8;        // bf16
  static constexpr int kTpr = kMmaThreads / BM;  // softmax threads per row
  static constexpr int kEpt = BN / kTpr;         // softmax elements per thread

  static constexpr size_t kQBytes = size_t(BM) * kMmaSmemStride * 2;
  static constexpr size_t kKvStageBytes = size_t(BN) * kMmaSmemStride * 2;
  static constexpr size_t kFp8StageBytes = size_t(BN) * kFp8RowBytes;
  static constexpr size_t kSBytes = size_t(kKSplit) * BM * kSStride * 4;
  static constexpr size_t kPBytes = size_t(BM) * kPStride * 2;
  static constexpr size_t kStatBytes = size_t(3) * BM * 4;
  // Offsets of the regions (bytes from the start of dynamic shared memory).
  static constexpr size_t kKvOffset = KV_FP8 ? 0 : kQBytes;
  static constexpr size_t kStagingOffset = KV_FP8 ? kKvStageBytes : 0;
  static constexpr size_t kQOffset =
      !KV_FP8 ? 0 : (kQInRegs ? 0 : kStagingOffset + STAGES * kFp8StageBytes);
  static constexpr size_t kSOffset =
      KV_FP8 ? kStagingOffset + STAGES * kFp8StageBytes + (kQInRegs ? 0 : kQBytes)
             : kKvOffset + STAGES * kKvStageBytes;
  static constexpr size_t kPOffset = kSOffset + kSBytes;
  static constexpr size_t kStatOffset = kPOffset + kPBytes;
  static constexpr size_t kSmemBytes = kStatOffset + kStatBytes;

  static_assert(BM % 16 == 0 && BN % 16 == 0, "tile shape");
  static_assert(kSTiles >= kMmaWarps ? (kSTiles % kMmaWarps == 0 && kNTiles % kTilesPerWarp == 0)
                                     : (kMmaWarps % kSTiles == 0),
                "S work split");
  static_assert(kTilesPerWarp <= 2, "S: at most two n-tiles per warp");
  static_assert((kQkDim / 16) % kKSplit == 0, "K split");
  static_assert(kTpr <= 32 && kEpt >= 1, "softmax mapping");
  static_assert(BN % kMmaWarps == 0, "loader: keys per warp");
  static_assert(STAGES >= 2, "pipeline");
  static_assert(!KV_FP8 || kQBytes <= kKvStageBytes, "FP8 cache: Q's tile fits the bf16 tile");
  static_assert(kFp8StageBytes % 16 == 0 && kSOffset % 16 == 0, "16-byte aligned regions");
};

}  // namespace verifyd::kernels::cuda::detail
