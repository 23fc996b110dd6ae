// The index lists of positional plans (api.h, "Positional plans"): one CTA per
// VerifyIndexTask writes the node's visible keys [begin, end) as slot ids into the workspace's
// index area. Internal CUDA header. Thread-safety: reentrant.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/verify_attention/api.h"

namespace verifyd::kernels::cuda::detail {

struct PositionalIndexArgs {
  const VerifyIndexTask* tasks;  // [num_tasks] (workspace)
  const int32_t* kv_indices;     // the batch's slot lists
  const uint64_t* tree_mask;     // [total_rows, mask_words]
  int mask_words;
  int32_t* out;  // the index area
};

// Enqueues the build of num_tasks lists on `stream` (nothing when num_tasks is 0).
absl::Status LaunchPositionalIndices(const PositionalIndexArgs& args, int num_tasks, void* stream);

}  // namespace verifyd::kernels::cuda::detail
