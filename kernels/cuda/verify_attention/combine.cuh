// Launcher of the split combine kernel (combine.cu). Internal CUDA header.
// Thread-safety: reentrant.
#pragma once

#include <cuda_bf16.h>

#include "absl/status/status.h"
#include "kernels/cuda/verify_attention/api.h"

namespace verifyd::kernels::cuda::detail {

struct VerifyCombineArgs {
  const VerifyCombineItem* items;  // [num_items] (workspace)
  const float* part_o;             // [partial rows, 512] fp32
  const float* part_lse;           // [partial rows] log2
  __nv_bfloat16* out;              // [total_rows, heads, 512]
  float* lse;                      // [total_rows, heads] natural log, or null
  int rows_per_cta;                // partial stride between splits (the plan's rows per CTA)
  int cols_per_cta;                // 64 or 512 output columns per CTA (set by the launcher)
};

// Merges the splits of `num_items` row tiles on `stream`; one CTA per (item, row, column
// chunk): 64-column chunks when few rows are merged (relative to num_sms), else whole rows.
// dependent_launch: launch with programmatic stream serialization (sm_90+). fold (positional
// plans): the left fold of fold.cuh, continuing from VerifyCombineItem::folded_splits, so a
// row's merge depends only on its own splits; one CTA per (item, row).
absl::Status LaunchCombine(const VerifyCombineArgs& args, int num_items, int num_sms,
                           bool dependent_launch, void* stream, bool fold = false);

}  // namespace verifyd::kernels::cuda::detail
