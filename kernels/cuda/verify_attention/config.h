// The verify attention's public kernel configurations, named once: the planner
// (api.h PlanVerifyAttention), the engine options (tp/engine_options.h), the benchmarks and
// the command lines read this table. Plain C++ (no CUDA): CPU-only builds include it too.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace verifyd::kernels::cuda {

// Kernel configurations (chosen by the planner; callers may force one for benchmarks).
// Values 2..4 belonged to retired variants and are not reused.
enum class VerifyKernelConfig : int {
  kAuto = 0,
  kM16 = 1,  // 16 folded rows per CTA, Q fragments in registers: the memory-bound path
  // 64 rows, 64-key tiles, wgmma "seesaw" schedule with a cp.async producer warpgroup
  // (sm_90a only): kAuto's many-rows choice on sm_90. docs/KERNEL_NOTES.md.
  kS64 = 5,
  // FP8 latent cache only: 16 rows, 64-key tiles, keys on the wgmma M side (the stored codes
  // become f16 operands in registers; sm_90a only): kAuto's FP8 choice on sm_90 but for many
  // rows per request (there kS64's FP8 variant).
  kKm16 = 8,
  // FP8 latent cache only: the batch's keys dequantized once into bf16 rows of the workspace
  // (bf16(e4m3 x scale), one rounding; VerifyAttentionWorkspace::max_staged_keys), then the
  // bf16 kS64 kernel over them (sm_90a). kAuto's FP8 choice when a request has many rows
  // (IsStagedFp8Batch: the dequantization, once per key, costs less than the seesaw FP8
  // variant converting every tile again for each 64-row tile) and the keys fit the staging
  // area; never in positional plans.
  kS64Staged = 9,
  // Values 6 and 7 belonged to the in-kernel positional variants (now a plan property:
  // VerifyPlanOptions::positional) and are not reused.
};

// One row a public configuration: its value, the name benchmarks, command lines and the
// engine's reports use, and a line for flag help.
struct VerifyKernelConfigEntry {
  VerifyKernelConfig config;
  const char* name;
  const char* summary;
};

inline constexpr VerifyKernelConfigEntry kVerifyKernelConfigs[] = {
    {VerifyKernelConfig::kAuto, "auto", "the planner's choice per batch, the default"},
    {VerifyKernelConfig::kM16, "m16", "16 rows a CTA, mma.sync, every device"},
    {VerifyKernelConfig::kS64, "s64", "64 rows, wgmma seesaw, sm_90a"},
    {VerifyKernelConfig::kKm16, "km16", "keys-on-M wgmma, FP8 latent cache, sm_90a"},
    {VerifyKernelConfig::kS64Staged, "s64staged", "FP8 keys staged as bf16 rows, then s64, sm_90a"},
};

// The table's name of a configuration ("unknown" for a value not in it).
constexpr const char* VerifyKernelConfigName(VerifyKernelConfig config) {
  for (const VerifyKernelConfigEntry& e : kVerifyKernelConfigs) {
    if (e.config == config) return e.name;
  }
  return "unknown";
}

// "auto, m16, s64, km16 or s64staged": the choices, for flag help and errors.
inline std::string VerifyKernelConfigChoices() {
  std::string out;
  constexpr size_t n = sizeof(kVerifyKernelConfigs) / sizeof(kVerifyKernelConfigs[0]);
  for (size_t i = 0; i < n; ++i) {
    absl::StrAppend(&out, i == 0 ? "" : (i + 1 == n ? " or " : ", "), kVerifyKernelConfigs[i].name);
  }
  return out;
}

// "auto: the planner's choice ...; m16: 16 rows a CTA ...; ...": the choices with their
// summaries, for flag help.
inline std::string VerifyKernelConfigHelp() {
  std::string out;
  for (const VerifyKernelConfigEntry& e : kVerifyKernelConfigs) {
    absl::StrAppend(&out, out.empty() ? "" : "; ", e.name, ": ", e.summary);
  }
  return out;
}

// The configuration called `name`; INVALID_ARGUMENT naming `field` and the choices otherwise.
inline absl::StatusOr<VerifyKernelConfig> ParseVerifyKernelConfig(absl::string_view name,
                                                                  absl::string_view field) {
  for (const VerifyKernelConfigEntry& e : kVerifyKernelConfigs) {
    if (name == e.name) return e.config;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": '", name, "' is not ", VerifyKernelConfigChoices()));
}

}  // namespace verifyd::kernels::cuda
