// Shared-memory layout and constants of the seesaw verify attention kernel (seesaw.cu).
// Plain C++ (no CUDA headers): the variant table (variants.h) and the planner read the same
// sizes the kernel uses. Thread-safety: types and constants only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/verify_attention/mma_traits.h"  // kQkDim, kVDim

namespace verifyd::kernels::cuda::detail {

struct SeesawTraits {
  static constexpr int kRows = 64;            // folded rows per CTA
  static constexpr int kKeys = 64;            // keys per tile
  static constexpr int kStages = 2;           // KV buffers (tiles come in pairs, one each)
  static constexpr int kThreads = 384;        // 2 math warpgroups + 1 producer warpgroup
  static constexpr int kMathThreads = 256;    // the two math warpgroups
  static constexpr int kAtom = 64 * 128;      // one 64-column 128B-swizzle atom of 64 rows
  static constexpr int kAtoms = kQkDim / 64;  // 9 per 576-column tile
  // P (64 x 64 bf16 = one atom) is exchanged through the rope atom (8) of the KV buffer it
  // belongs to: that atom is read only by Q K^T, which has finished when P is written, and
  // the producer refills the buffer only after both warpgroups released it.
  static constexpr int kPAtom = 8;
  static constexpr int kProducerRegs = 24;
  static constexpr int kMathRegs = 240;  // 24 + 2 * 240 = 504 = 168 * 3: what the launch gets
};

// Column groups of a KV tile, each with its own "full" barrier so Q K^T can start on the
// first one while the rest is in flight: A = atoms 0-3 (columns 0..255), B = atoms 4-7,
// C = atom 8 (the rope columns).
enum SeesawColumnGroup : int { kGroupA = 0, kGroupB = 1, kGroupC = 2, kNumGroups = 3 };

// The dynamic shared memory of one CTA. The kernel aligns the base up to 1024 bytes (the
// 128-byte swizzle period), so every tile below starts on a 1024-byte boundary. Operand tiles
// are arrays of 128-byte-swizzled atoms (64 rows x 64 bf16 columns).
struct SeesawSmem {
  uint8_t q[SeesawTraits::kAtoms][SeesawTraits::kAtom];  // Q [64 rows x 576]      72 KB
  // KV ring [buffer][atom]: tile t lives in buffer t & 1. Atom kPAtom doubles as P of that
  // tile once its Q K^T is done; after the loop the ring stages the output rows.
  uint8_t kv[SeesawTraits::kStages][SeesawTraits::kAtoms][SeesawTraits::kAtom];  // 144 KB
  // Row statistics handed between the math warpgroups (log2 domain), [64] each.
  float m0[SeesawTraits::kRows];      // WG0: running max after tile t0 of the pair
  float scale0[SeesawTraits::kRows];  // WG0: 2^(m_prev - m0)
  float m1[SeesawTraits::kRows];      // WG1: running max after tile t1
  float scale1[SeesawTraits::kRows];  // WG1: 2^(m0 - m1)
  float l[2][SeesawTraits::kRows];    // per warpgroup: row-sum partials (epilogue)
  // mbarriers (who arrives on which: SeesawInitBarriers, seesaw_roles.cuh):
  uint64_t full[kNumGroups][SeesawTraits::kStages];  // producer -> math: group landed
  uint64_t empty_a[SeesawTraits::kStages];           // math -> producer: atoms 0-3 free
  uint64_t empty_bc[SeesawTraits::kStages];          // math -> producer: atoms 4-8 free
  uint64_t q_full;                                   // producer -> math: Q landed
  uint64_t pad[5];                                   // barrier block: 128 bytes
};

// Dynamic shared memory to request: the struct plus the worst-case alignment slack.
inline constexpr size_t kSeesawSmemBytes = 1024 + sizeof(SeesawSmem);

// The FP8-cache variant (SeesawFp8S64): the same schedule on f16 tiles that its math
// warpgroups convert from the stored rows (seesaw_fp8.cuh, ConvertTileFp8). Q's 512 latent columns
// are f16 times a power of two per row (2^eq, so the row's largest value lands in [2^14, 2^15)),
// its rope columns stay bf16 times the same power; the KV tiles' latent columns are f16(code x
// scale), the rope columns the stored bf16. Same register split as the bf16 kernel.
struct SeesawFp8Smem {
  SeesawSmem base;
  // Per row: softmax_scale * log2(e) * 2^-eq (the factor that turns the f16-Q scores into
  // log2-domain logits).
  float q_row_factor[SeesawTraits::kRows];
  // Per KV buffer: the landed rows' four scales.
  float scale_land[SeesawTraits::kStages][SeesawTraits::kRows][4];
};
inline constexpr size_t kSeesawFp8SmemBytes = 1024 + sizeof(SeesawFp8Smem);
static_assert(kSeesawFp8SmemBytes == 226176, "seesaw FP8: 226,176 bytes of shared memory");
static_assert(offsetof(SeesawFp8Smem, base) == 0, "seesaw FP8: the bf16 layout first");
static_assert(kSeesawFp8SmemBytes <= 227 * 1024,
              "seesaw FP8: over the sm_90 opt-in shared memory per block (227 KB)");

static_assert(offsetof(SeesawSmem, q) == 0 && offsetof(SeesawSmem, kv) % 1024 == 0,
              "seesaw: operand tiles must start on the 1024-byte swizzle period");
static_assert(offsetof(SeesawSmem, kv) == 73728 && offsetof(SeesawSmem, m0) == 221184 &&
                  offsetof(SeesawSmem, full) == 222720,
              "seesaw: layout changed (the kernel's SASS was checked against these offsets)");
static_assert(kSeesawSmemBytes == 223872, "seesaw: 223,872 bytes of shared memory");
static_assert(kSeesawSmemBytes <= 227 * 1024,
              "seesaw: over the sm_90 opt-in shared memory per block (227 KB)");

}  // namespace verifyd::kernels::cuda::detail
