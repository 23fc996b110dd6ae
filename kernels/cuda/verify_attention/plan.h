// Internal planner pieces of the CUDA verify attention shared by plan.cc (the planner),
// plan_positional.cc (its positional plans), the
// CUDA launcher (launch.cu) and the host-only tests: variant resolution against a device and
// the workspace layout. Plain C++. Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/cuda/verify_attention/api.h"
#include "kernels/cuda/verify_attention/variants.h"

namespace verifyd::kernels::cuda::detail {

// The variant that runs `config` (not kAuto) on `device` for the cache format (`kv_fp8`:
// VerifyAttentionParams::kv_fp8): the first one in the table with that configuration and
// format that runs on the device's architecture. UNIMPLEMENTED naming the configuration when
// none does or when its shared memory exceeds the device's limit.
absl::StatusOr<VariantInfo> ResolveVariant(VerifyKernelConfig config,
                                           const VerifyAttentionDeviceInfo& device,
                                           bool kv_fp8 = false);

// kAuto: the first variant of the format in table order that runs on the device, fits its
// shared memory and whose AutoUse rule holds for a batch with this many folded rows in its
// largest request and keys in all (a staged variant also needs total_keys <= max_staged_keys).
absl::StatusOr<VariantInfo> AutoVariant(const VerifyAttentionDeviceInfo& device,
                                        int64_t max_folded_rows_per_request, int64_t total_keys,
                                        bool kv_fp8 = false, int64_t max_staged_keys = 0);

// Byte offsets of the workspace parts (256-byte aligned): work items, combine items, partial
// log2-LSE [max_partial_rows] fp32, partial outputs [max_partial_rows][512] fp32, positional
// index tasks [max_index_tasks], index lists [max_index_entries] int32, staged bf16 rows
// [max_staged_keys][576] and their identity slot ids [max_staged_keys] int32.
struct WorkspaceLayout {
  size_t work = 0, combine = 0, lse = 0, part_o = 0, tasks = 0, pos = 0, staged_rows = 0,
         staged_ids = 0, total = 0;
};
WorkspaceLayout LayoutWorkspace(int max_work_items, int max_combine_items, int64_t max_partial_rows,
                                int max_index_tasks = 0, int64_t max_index_entries = 0,
                                int64_t max_staged_keys = 0);

// Whether every part of `plan` fits the workspace's capacities (work / combine items, partial
// rows, index tasks and entries, staged keys).
bool PlanFitsWorkspace(const VerifyAttentionPlan& plan, const VerifyAttentionWorkspace& ws);

// A plan's header for `variant` over the batch of `params` (configuration, cache format, tile
// shape, heads, requests, rows); its passes and work lists are the planner's to fill.
VerifyAttentionPlan PlanHeader(const VerifyAttentionParams& params, const VariantInfo& variant);

// Upper bound on splits of one request (the combine kernel's shared weight array).
inline constexpr int kMaxCombineSplits = 1024;

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The positional (batch-invariant) plan of a batch for `variant` (plan_positional.cc; what
// PlanVerifyAttention returns for VerifyPlanOptions::positional).
absl::StatusOr<VerifyAttentionPlan> PlanPositional(const VerifyAttentionParams& params,
                                                   const int32_t* hq, const int32_t* hkv,
                                                   const VariantInfo& variant,
                                                   const VerifyAttentionDeviceInfo& device,
                                                   const VerifyAttentionWorkspace& ws,
                                                   const VerifyPlanOptions& options);

}  // namespace verifyd::kernels::cuda::detail
