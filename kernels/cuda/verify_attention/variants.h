// The verify attention kernel variants, each declared once: configuration, tile geometry,
// pipeline stages, shared memory, the architectures it runs on, when kAuto may pick it, and
// its launch function. The planner (ResolveVariant, the kAuto rule in plan.cc) and the
// dispatcher (launch.cu: DispatchVariant) read this table; nothing else names a variant.
//
// Adding a variant: a struct like the ones below (its Launch defined in the .cu file that
// instantiates its kernel), one entry in VerifyVariants, and a test case forcing it.
// The order of VerifyVariants is kAuto's preference order. A variant reads one cache format
// (kKvFp8); the planner and the dispatcher only consider the variants of the params' format.
//
// Plain C++ (no CUDA headers): the plan library includes it. Launch functions are only
// declared here; only the CUDA library references them. Thread-safety: constants only.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/verify_attention/api.h"
#include "kernels/cuda/verify_attention/keys_on_m_layout.h"
#include "kernels/cuda/verify_attention/mma_traits.h"
#include "kernels/cuda/verify_attention/seesaw_layout.h"

namespace verifyd::kernels::cuda::detail {

struct VerifyKernelArgs;  // kernel_args.cuh: the device-side arguments of every variant

// When kAuto may pick a variant (the first variant in table order that runs on the device,
// fits its shared memory and whose rule holds for the batch).
enum class AutoUse {
  kNotTinyDecode,  // every batch but a tiny decode batch (IsTinyDecodeBatch)
  kManyRows,       // batches with many rows per request and many keys (IsManyRowsBatch)
  kStagedFp8,      // IsStagedFp8Batch, and the batch's keys fit the workspace's staging area
  kAlways,
};

// Tiny decode batch: <= 16 folded rows per request and <= 16k keys in all. There the 16-row
// mma.sync kernel's shorter prologue won by ~1 us on the H200 (1 x 8 heads x 1 node at 1k /
// 4k keys: 0.0083 / 0.0095 ms against 0.0095 / 0.0109 ms for the seesaw kernel).
constexpr bool IsTinyDecodeBatch(int64_t max_folded_rows_per_request, int64_t total_keys) {
  return max_folded_rows_per_request <= 16 && total_keys <= 16384;
}

// Many rows per request over many keys: >= 64 folded rows (one seesaw tile) in some request
// and rows x keys (that request's rows times the batch's keys) >= 2^22. There the seesaw FP8
// variant (64 rows a CTA) beat the keys-on-M kernel (16 rows a CTA) on the H200 on every shape
// measured (0.60-0.91x its time, e.g. 64 rows over 65k keys 0.90x), and below it lost or tied
// (1.01-1.11x; decode rows, 8-16 a request, ran 1.8-2.3x slower at any key count)
// (docs/PERF.md, "The seesaw FP8 variant against km16" and its crossover table).
constexpr bool IsManyRowsBatch(int64_t max_folded_rows_per_request, int64_t total_keys) {
  return max_folded_rows_per_request >= 64 &&
         max_folded_rows_per_request * total_keys >= (int64_t{1} << 22);
}

// FP8 cache, keys staged once as bf16 rows (kS64Staged) for requests of >= 256 folded rows
// (four 64-row tiles: the seesaw FP8 variant converts each tile once per row tile, staging
// once per key, at 1,808 bytes of extra traffic a key) over rows x keys >= 2^20. On the H200
// it took 0.60-0.90x the seesaw FP8 variant's time on every such shape measured (256 rows over
// 4k keys: 0.85x, and 0.89x km16's), and lost at 128 rows (1.12-1.20x at 65k / 185k keys,
// 1.14x for 64 x 128 heads over 4k) (docs/PERF.md, "Staged FP8 keys").
constexpr bool IsStagedFp8Batch(int64_t max_folded_rows_per_request, int64_t total_keys) {
  return max_folded_rows_per_request >= 256 &&
         max_folded_rows_per_request * total_keys >= (int64_t{1} << 20);
}

// ---- the variants ------------------------------------------------------------------------

// What a variant does not restate: one CTA per SM, its own format's keys (not staged), one
// split per work item, picked by kAuto wherever it runs.
struct VariantDefaults {
  static constexpr int kCtasPerSm = 1;
  static constexpr bool kStaged = false;       // reads the keys staged as bf16 rows (kS64Staged)
  static constexpr bool kSplitGroups = false;  // takes VerifyWorkItem::split_keys > 0
  static constexpr AutoUse kAuto = AutoUse::kAlways;
};

// Where a variant runs (kArch: the words of the UNIMPLEMENTED message elsewhere).
struct OnSm90 {
  static constexpr const char* kArch = "an sm_90 device";
  static constexpr bool RunsOn(int cc_major) { return cc_major == 9; }
};
struct OnSm90a : OnSm90 {  // the wgmma kernels: bodies only in the sm_90a build
  static constexpr const char* kArch = "an sm_90 device (sm_90a build)";
};
struct OnSm80Portable {
  static constexpr const char* kArch = "sm_80 or newer";
  static constexpr bool RunsOn(int cc_major) { return cc_major >= 8 && cc_major != 9; }
};

// The warp-specialised wgmma families (a producer warpgroup, two math warpgroups; sm_90a):
// tile geometry from the family's traits, shared memory from its layout.
template <class Traits, size_t SmemBytes, bool KvFp8>
struct WarpSpecializedVariant : VariantDefaults, OnSm90a {
  static constexpr int kRows = Traits::kRows;
  static constexpr int kKeys = Traits::kKeys;
  static constexpr int kStages = Traits::kStages;
  static constexpr size_t kSmemBytes = SmemBytes;
  static constexpr bool kKvFp8 = KvFp8;
};

// The mma.sync 16-row family: 16 rows, 32-key tiles; stages, cache format and where Q lives
// (registers or shared memory) per variant; shared memory from MmaTraits.
template <int Stages, bool KvFp8, bool QInRegs = true>
struct MmaM16Variant : VariantDefaults {
  static constexpr int kRows = 16;
  static constexpr int kKeys = 32;
  static constexpr int kStages = Stages;
  static constexpr bool kQInRegs = QInRegs;
  static constexpr bool kKvFp8 = KvFp8;
  static constexpr size_t kSmemBytes = MmaTraits<16, 32, Stages, KvFp8, QInRegs>::kSmemBytes;
};

// 64 rows, 64-key tiles, warp-specialised wgmma "seesaw" schedule (seesaw.cu).
struct SeesawS64 : WarpSpecializedVariant<SeesawTraits, kSeesawSmemBytes, false> {
  static constexpr VerifyKernelConfig kConfig = VerifyKernelConfig::kS64;
  static constexpr const char* kName = "seesaw wgmma (s64)";
  static constexpr AutoUse kAuto = AutoUse::kNotTinyDecode;
  static constexpr bool kSplitGroups = true;  // VerifyWorkItem::split_keys
  static absl::Status Launch(const VerifyKernelArgs& args, int grid, void* stream);
};

// FP8 latent cache through the bf16 seesaw kernel (SeesawS64: its geometry, architectures and
// Launch) over the batch's keys staged as bf16 rows in the workspace first (launch.cu runs
// staging.cu; api.h kS64Staged). sm_90a.
struct SeesawStagedFp8S64 : SeesawS64 {
  static constexpr VerifyKernelConfig kConfig = VerifyKernelConfig::kS64Staged;
  static constexpr const char* kName = "seesaw wgmma over staged bf16 rows, FP8 cache (s64staged)";
  static constexpr bool kKvFp8 = true;
  static constexpr bool kStaged = true;
  static constexpr AutoUse kAuto = AutoUse::kStagedFp8;
};

// FP8 latent cache, the seesaw schedule on f16 tiles its math warpgroups convert from the
// stored rows (seesaw_fp8.cuh, ConvertTileFp8): 64 rows, 64-key tiles (226,176 bytes).
// sm_90a. kAuto's FP8 choice for many-row batches (IsManyRowsBatch); forced as kS64 with an
// FP8 cache.
struct SeesawFp8S64 : WarpSpecializedVariant<SeesawTraits, kSeesawFp8SmemBytes, true> {
  static constexpr VerifyKernelConfig kConfig = VerifyKernelConfig::kS64;
  static constexpr const char* kName = "seesaw wgmma, FP8 cache, f16 tiles (s64)";
  static constexpr AutoUse kAuto = AutoUse::kManyRows;
  static absl::Status Launch(const VerifyKernelArgs& args, int grid, void* stream);
};

// 16 rows, 32-key tiles, mma.sync, 5 stages (four tiles in flight; ~207 KB): sm_90.
struct MmaM16Sm90 : MmaM16Variant<5, false>, OnSm90 {
  static constexpr VerifyKernelConfig kConfig = VerifyKernelConfig::kM16;
  static constexpr const char* kName = "mma.sync 16-row, 5 stages (m16)";
  static absl::Status Launch(const VerifyKernelArgs& args, int grid, void* stream);
};

// 16 rows, 32-key tiles, mma.sync, 2 stages within 99 KB of shared memory: sm_80, sm_120.
struct MmaM16Portable : MmaM16Variant<2, false>, OnSm80Portable {
  static constexpr VerifyKernelConfig kConfig = VerifyKernelConfig::kM16;
  static constexpr const char* kName = "mma.sync 16-row, 2 stages (m16)";
  static absl::Status Launch(const VerifyKernelArgs& args, int grid, void* stream);
};
static_assert(MmaM16Portable::kSmemBytes <= 99 * 1024, "m16 portable: within 99 KB (sm_120)");

// FP8 latent cache, keys on the wgmma M side (keys_on_m.cu): 16 rows, 64-key tiles, the
// stored codes converted to f16 MMA operands in registers (no dequantized tile), a producer
// warpgroup and two math warpgroups with their own tiles (209,120 bytes). sm_90a.
struct KeysOnMFp8Sm90 : WarpSpecializedVariant<KeysOnMTraits, kKeysOnMSmemBytes, true> {
  static constexpr VerifyKernelConfig kConfig = VerifyKernelConfig::kKm16;
  static constexpr const char* kName = "keys-on-M wgmma, FP8 cache (km16)";
  static absl::Status Launch(const VerifyKernelArgs& args, int grid, void* stream);
};

// FP8 latent cache (VerifyAttentionParams::kv_fp8): the 16-row kernel gathering FP8 rows
// (656 bytes a key) into 2 FP8 stages and dequantizing each into one bf16 tile before its
// MMAs, Q read from shared memory (~102 KB, <= 128 registers): two CTAs per SM, whose
// barrier-bound tile loops interleave. sm_90.
struct MmaM16Fp8Sm90 : MmaM16Variant<2, true, /*QInRegs=*/false>, OnSm90 {
  static constexpr VerifyKernelConfig kConfig = VerifyKernelConfig::kM16;
  static constexpr const char* kName = "mma.sync 16-row, FP8 cache, 2 CTAs per SM (m16)";
  static constexpr int kCtasPerSm = 2;
  static absl::Status Launch(const VerifyKernelArgs& args, int grid, void* stream);
};

// FP8 cache, 2 FP8 stages within 99 KB of shared memory (~83 KB), the CTA's 8 warps
// dequantizing each stage into one bf16 tile before its MMAs: sm_80, sm_120.
struct MmaM16Fp8Portable : MmaM16Variant<2, true>, OnSm80Portable {
  static constexpr VerifyKernelConfig kConfig = VerifyKernelConfig::kM16;
  static constexpr const char* kName = "mma.sync 16-row, FP8 cache, 2 stages (m16)";
  static absl::Status Launch(const VerifyKernelArgs& args, int grid, void* stream);
};
static_assert(MmaM16Fp8Portable::kSmemBytes <= 99 * 1024, "m16 FP8 portable: within 99 KB");
static_assert(2 * (MmaM16Fp8Sm90::kSmemBytes + 1024) <= 233472, "m16 FP8 sm_90: two CTAs per SM");

template <class... V>
struct VariantList {};
// kAuto's preference order (among the variants of the cache's format).
using VerifyVariants = VariantList<SeesawS64, MmaM16Sm90, MmaM16Portable, SeesawStagedFp8S64,
                                   SeesawFp8S64, KeysOnMFp8Sm90, MmaM16Fp8Sm90, MmaM16Fp8Portable>;

// ---- run-time view of the table (the planner) -------------------------------------------

struct VariantInfo {
  int index = -1;  // position in VerifyVariants (DispatchVariant's argument)
  VerifyKernelConfig config = VerifyKernelConfig::kAuto;
  const char* name = "";
  const char* arch = "";
  int rows = 0;
  int keys = 0;
  int stages = 0;
  size_t smem_bytes = 0;
  AutoUse auto_use = AutoUse::kAlways;
  bool (*runs_on)(int cc_major) = nullptr;
  bool kv_fp8 = false;  // reads the FP8 latent cache (VerifyAttentionParams::kv_fp8)
  int ctas_per_sm = 1;  // CTAs resident per SM (shared memory and registers allow)
  bool staged = false;  // reads the keys staged as bf16 rows (kS64Staged)
  // Takes work items holding several splits (VerifyWorkItem::split_keys > 0).
  bool split_groups = false;
};

template <class V>
constexpr VariantInfo InfoOf(int index) {
  return {index,     V::kConfig,    V::kName,      V::kArch,       V::kRows,
          V::kKeys,  V::kStages,    V::kSmemBytes, V::kAuto,       &V::RunsOn,
          V::kKvFp8, V::kCtasPerSm, V::kStaged,    V::kSplitGroups};
}
template <class... V>
constexpr std::array<VariantInfo, sizeof...(V)> MakeVariantTable(VariantList<V...>) {
  int i = 0;
  return {{InfoOf<V>(i++)...}};
}
inline constexpr auto kVariantTable = MakeVariantTable(VerifyVariants{});

// ---- compile-time dispatch (the CUDA launcher) ------------------------------------------

// Calls f(V{}) for the variant at `index` and returns its status.
template <class F, class... V>
absl::Status DispatchVariantIn(int index, F&& f, VariantList<V...>) {
  absl::Status status = absl::InternalError("verify attention: no kernel variant at this index");
  int i = 0;
  static_cast<void>(((i++ == index ? (static_cast<void>(status = f(V{})), true) : false) || ...));
  return status;
}
template <class F>
absl::Status DispatchVariant(int index, F&& f) {
  return DispatchVariantIn(index, static_cast<F&&>(f), VerifyVariants{});
}

}  // namespace verifyd::kernels::cuda::detail
