// Shared-memory layout and constants of the keys-on-M FP8 verify attention kernel
// (keys_on_m.cu). Plain C++ (no CUDA headers): the variant table (variants.h) and the planner
// read the same sizes the kernel uses. Thread-safety: types and constants only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/verify_attention/mma_traits.h"  // kQkDim, kVDim, kFp8RowBytes

namespace verifyd::kernels::cuda::detail {

struct KeysOnMTraits {
  static constexpr int kRows = 16;      // folded rows per CTA (the wgmma N side)
  static constexpr int kKeys = 64;      // keys per tile (the wgmma M side)
  static constexpr int kStages = 4;     // FP8 tiles in flight (tile t in stage t % 4)
  static constexpr int kThreads = 384;  // 2 math warpgroups + 1 producer warpgroup
  static constexpr int kMathThreads = 256;
  // Stage row stride: the 656-byte stored row plus one 16-byte pad chunk. 672 = 32 mod 128,
  // so the four consecutive keys a V^T load instruction touches, and the four a Q K^T load
  // touches, fall in different banks (keys_on_m.cu, "Operand permutations").
  static constexpr int kRowStride = kFp8RowBytes + 16;
  static constexpr int kStageBytes = kKeys * kRowStride;
  // Q: 9 atoms of 64 columns x 16 rows, 128-byte swizzle (2 KB each): 8 f16 atoms (the latent
  // columns, scaled by a power of two per row) and 1 bf16 atom (rope).
  static constexpr int kQAtom = kRows * 128;
  static constexpr int kQAtoms = kQkDim / 64;
  // P: per math warpgroup, one [16 rows x 64 keys] f16 atom per scale group (P times the
  // group's per-key scale): the B operand of O^T += V^T P^T.
  static constexpr int kGroups = kVDim / 128;
  static constexpr int kProducerRegs = 40;
  static constexpr int kMathRegs = 232;  // 40 + 2 * 232 = 504 = 168 * 3
};

struct KeysOnMSmem {
  uint8_t q[KeysOnMTraits::kQAtoms][KeysOnMTraits::kQAtom];           // 18 KB
  uint8_t stage[KeysOnMTraits::kStages][KeysOnMTraits::kStageBytes];  // 168 KB
  uint8_t p[2][KeysOnMTraits::kGroups][KeysOnMTraits::kQAtom];        // 16 KB
  float red[2][4][KeysOnMTraits::kRows + 1];  // per WG, per warp: row maxima, scale max
  float q_inv[KeysOnMTraits::kRows];          // 2^-e of each row's latent Q scaling
  float l[2][4][KeysOnMTraits::kRows];        // epilogue: row sums per warpgroup and warp
  float m1[KeysOnMTraits::kRows];             // epilogue: WG1's running max
  uint64_t full[KeysOnMTraits::kStages];      // producer -> math: stage landed
  uint64_t empty[KeysOnMTraits::kStages];     // math -> producer: stage free (4 warp arrivals)
};

inline constexpr size_t kKeysOnMSmemBytes = 1024 + sizeof(KeysOnMSmem);

static_assert(offsetof(KeysOnMSmem, stage) % 1024 == 0 && offsetof(KeysOnMSmem, p) % 1024 == 0,
              "keys-on-M: operand tiles on the 1024-byte swizzle period");
static_assert(KeysOnMTraits::kStageBytes % 16 == 0, "16-byte cp.async destinations");
static_assert(kKeysOnMSmemBytes == 209120, "keys-on-M: layout changed (update variants.h)");
static_assert(kKeysOnMSmemBytes <= 227 * 1024, "keys-on-M: over the sm_90 opt-in (227 KB)");
// The epilogue stages WG1's O^T (16 rows x 512 fp32) in the stage ring.
static_assert(KeysOnMTraits::kStages * KeysOnMTraits::kStageBytes >= 16 * kVDim * 4,
              "keys-on-M: the stage ring holds one 16 x 512 fp32 tile");

}  // namespace verifyd::kernels::cuda::detail
