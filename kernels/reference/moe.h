// DeepSeek-V3 mixture-of-experts routing ("noaux_tc" top-k with sigmoid scores and expert
// groups) and the weighted combine of expert outputs, as Hugging Face transformers'
// DeepseekV3TopkRouter / DeepseekV3Experts compute them, plain C++.
//
// Routing of one row (router logits already computed, float32):
//   score[e]       = sigmoid(logit[e]) = 1 / (1 + exp(-logit[e]))         (float32)
//   choice[e]      = score[e] + bias[e]                  (e_score_correction_bias)
//   group_score[g] = top1 + top2 of choice within group g (n_group groups of E / n_group)
//   keep the topk_group groups with the largest group_score; the other groups' experts are
//   masked to -inf (transformers' current masked_fill value; older releases used 0.0, which
//   differs only when some kept choice is negative)
//   experts        = the top_k experts by masked choice
//   weight[k]      = score[expert k] (the un-biased score), divided by
//                    (sum_k score + 1e-20) when norm_topk_prob, times routed_scaling_factor
// Ties (groups and experts): the lowest index wins. torch.topk leaves tie order unspecified.
// Experts are reported in selection order (largest masked choice first); the normalising sum
// adds the weights in that order (transformers sums topk's unsorted output: a possible
// difference of one float rounding in the weights).
//
// Combine: transformers adds w_k * expert_k(x) into a zero tensor with index_add_ in
// ascending expert index (its loop over the hit experts), then adds the shared experts. The
// CPU backend does the same: AddScaled per expert in ascending expert index.
// Thread-safe: pure functions over caller-owned buffers; every row is computed alone
// (batch-invariant).
#pragma once

#include <cstdint>

namespace verifyd::kernels::ref {

struct MoeRouting {
  int64_t num_experts = 0;     // n_routed_experts
  int64_t top_k = 0;           // num_experts_per_tok
  int64_t n_group = 1;         // n_group (divides num_experts)
  int64_t topk_group = 1;      // topk_group (<= n_group)
  bool norm_topk_prob = true;  // norm_topk_prob
  float routed_scaling_factor = 1.0f;
};

// logits [m, num_experts] (row stride num_experts), bias [num_experts] ->
// experts [m, top_k] (selection order), weights [m, top_k].
void MoeRoute(const float* logits, int64_t m, const float* bias, const MoeRouting& p,
              int32_t* experts, float* weights);

// y[i] += x[i] * w for i < n (one float multiply, one float add: no FMA).
void AddScaled(float* y, const float* x, float w, int64_t n);

}  // namespace verifyd::kernels::ref
