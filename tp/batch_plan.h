// The batch of one engine step laid out as the kernels expect (BatchPlan), and its validation
// and construction from the engine's requests (BuildBatchPlan). Shared by the CPU and CUDA
// backends: both validate and plan a step once, on the caller's thread, before any rank
// writes KV.
//
// Thread-safety: BuildBatchPlan is a pure function; a BatchPlan is read-only once built and
// is shared by every rank.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/verify_attention.h"
#include "tp/engine.h"
#include "tp/model_config.h"

namespace verifyd::tp {

// 64-bit words of a tree-mask row (kernels::kMaxTailRows bits).
inline constexpr int kMaskWords = 2;
static_assert(kMaskWords * 64 >= kernels::kMaxTailRows, "tree mask too narrow");

// The batch laid out as the kernels expect, shared read-only by every rank.
struct BatchPlan {
  int batch = 0;
  int total_rows = 0;
  std::vector<int32_t> tokens;      // [total_rows]
  std::vector<int32_t> parents;     // [total_rows] local parent row, -1 for a root
  std::vector<int32_t> positions;   // [total_rows] committed_len + depth
  std::vector<int32_t> tail_slots;  // [total_rows] slot the row's latent KV goes to
  std::vector<int32_t> q_indptr;    // [batch + 1]
  std::vector<int32_t> kv_indptr;   // [batch + 1]
  std::vector<int32_t> kv_indices;  // context slots then tail slots of each request
  std::vector<uint64_t> tree_mask;  // [total_rows, kMaskWords]: ancestors + self
};

// Validates the batch (InvalidArgument naming the field, e.g. "batch[2].parents[5]") and
// builds its plan. Checks: batch size <= limits.max_batch; 1 <= rows <= limits.max_tail_rows;
// parents/tail_slots sizes; parents[0] = -1 and parents[t] in [0, t); tokens in [0, vocab);
// context and tail slots in [0, kv_slots); context + rows <= limits.max_context; tail
// slots distinct across the batch and not a context slot of any request; sampling params,
// top_logprobs and hidden_layers as engine.h states.
// with_kv_indices = false leaves plan.kv_indices empty (kv_indptr is still filled): the CUDA
// engine writes the slot lists straight into its pinned upload buffer instead (one copy of
// what can be 24 MB per step, into memory that is already mapped).
absl::StatusOr<BatchPlan> BuildBatchPlan(const std::vector<StepRequest>& batch,
                                         const ModelConfig& config, const EngineLimits& limits,
                                         int64_t kv_slots, bool with_kv_indices = true);

}  // namespace verifyd::tp
