// The backend-independent parts of one engine step, shared by the CPU engine
// (tp/cpu/cpu_engine.cc) and the CUDA engine (tp/cuda/cuda_engine.cc), so that the lossless
// contract is written once:
//   PlanHiddenCaptures   which residual rows of which layers a step copies out (hidden states)
//   SharedPrefixOrder    the order a step's requests are laid out in, so that the kernel
//                        planner can pack requests that share a context prefix
//   AssembleStepResults  each request's StepResult from the step's predictions and its tree
//                        acceptance outputs: a prefill chunk commits every row (bonus = the
//                        prediction after its last row), a verify tree its root and accepted
//                        path (kept / freed slots, bonus), hidden states of the committed rows.
// Each backend keeps its forward, its sampling and its logprobs.
//
// Thread-safety: pure functions on values.
#pragma once

#include <cstdint>
#include <vector>

#include "tp/batch_plan.h"
#include "tp/engine.h"
#include "tp/model_config.h"

namespace verifyd::tp {

// The order in which to lay out a step's requests (a permutation of [0, batch.size())):
// requests whose contexts start with the same KV slot — forks of one session, which share
// their prefix's slots — next to each other, so that the verify-attention planner can read a
// shared prefix once for all of them (kernels/cuda/verify_attention/api.h "Shared prefixes":
// it packs adjacent requests only); requests without context first; otherwise the given order
// (a stable sort by the first context slot). Results do not depend on the order.
std::vector<size_t> SharedPrefixOrder(const std::vector<StepRequest>& batch);

// After a decoder layer, plan rows [row0, row0 + rows) of the residual stream go to
// hidden + offset, `stride` floats from one row to the next.
struct HiddenCapture {
  int32_t row0 = 0, rows = 0;
  int64_t offset = 0;
  int64_t stride = 0;
};

// The step's hidden-state captures. Request b's rows are laid out from base[b] as
// [rows][its hidden_layers][hidden_size] (the StepResult::hidden layout).
struct HiddenCapturePlan {
  std::vector<std::vector<HiddenCapture>> by_layer;  // [num_hidden_layers], or empty: none
  std::vector<int64_t> base;                         // [batch] (0 without hidden layers)
  int64_t floats = 0;                                // size of the capture buffer
};

// Every row of each request with hidden_layers, after each of its layers (every row: a verify
// tree's committed rows are known only after acceptance).
HiddenCapturePlan PlanHiddenCaptures(const std::vector<StepRequest>& batch, const BatchPlan& plan,
                                     const ModelConfig& config);

// The outputs of kernels::TreeAcceptParams over the whole plan (batch = plan.batch,
// row_indptr = plan.q_indptr): request b's at accepted / kept / freed + q_indptr[b].
struct StepAcceptance {
  const int32_t* accepted = nullptr;      // [total_rows]
  const int32_t* kept = nullptr;          // [total_rows]
  const int32_t* freed = nullptr;         // [total_rows]
  const int32_t* num_accepted = nullptr;  // [batch]
  const int32_t* bonus = nullptr;         // [batch]
};

// The step's results, logprobs left empty (each backend adds its own): predictions
// [total_rows] (after sampling), the acceptance outputs (read only for requests with
// accept = true), and the captured hidden rows (`hidden` with the plan's layout; may be null
// when no request asked for hidden states).
std::vector<StepResult> AssembleStepResults(const std::vector<StepRequest>& batch,
                                            const BatchPlan& plan, const int32_t* predictions,
                                            const StepAcceptance& acceptance, const float* hidden,
                                            const std::vector<int64_t>& hidden_base,
                                            int64_t hidden_size);

}  // namespace verifyd::tp
