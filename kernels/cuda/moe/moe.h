// DeepSeek-V3 mixture-of-experts kernels on the GPU: the router's top-k, the permutation of
// rows to experts, the gather of expert inputs and the fixed-order combine of expert outputs.
// The expert MLPs themselves run in moe_mlp.h (grouped GEMMs, or per-expert cuBLAS GEMMs of
// dense/gemm.h).
//
// Routing reproduces kernels::ref::MoeRoute (kernels/reference/moe.h) step by step: sigmoid
// scores, + e_score_correction_bias for the choice, group score = top-2 sum per group, keep
// topk_group groups (others -inf), top-k by masked choice (ties: the lowest index; a number
// beats NaN), weights = un-biased scores normalised by (sum + 1e-20) in selection order when
// norm_topk_prob, times routed_scaling_factor. Only the sigmoid's expf may differ from the
// host's std::exp by an ulp.
//
// Permutation: the (row, slot k) pairs grouped by expert in ascending expert index, rows
// ascending within an expert (a row picks an expert at most once), so expert e's inputs are
// the contiguous rows [offsets[e], offsets[e + 1]) of the permuted buffer. Three launches over
// chunks of pairs (count, scan, place), deterministic.
//
// Combine: per row, sum over its experts in ascending expert index of weight * expert_out
// (one float multiply and one float add each, from 0), then + shared[row]; the order does not
// depend on the batch. This is kernels::ref::AddScaled's order (the CPU backend's).
// Host header (no CUDA code). Thread-safety: launchers are reentrant.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/common.h"

namespace verifyd::kernels::cuda {

// Largest num_experts_per_tok the routing and combine kernels take.
inline constexpr int kMoeMaxTopK = 32;
// Largest n_routed_experts (shared memory of the routing and permute kernels).
inline constexpr int kMoeMaxExperts = 2048;

// The router's logits in fp32: y[r, e] = sum_k x[r, k] * w[e, k] (transformers computes the
// DeepSeek-V3 gate in float32), for few rows: one warp per expert splits k over its lanes, so
// the weight streams at full bandwidth (the pedantic-fp32 cuBLAS GEMM took 0.34 ms for one
// row at Kimi-K2's 384 x 7168 on an H200, this kernel 0.02 ms). Each logit is one fixed
// sequence of fmaf (lane-strided partial sums, a fixed xor tree), whatever the row count.
// Beyond kMoeRouterKernelMaxRows rows a tiled kernel (rows staged in shared memory, 4 experts
// per warp) computes every logit with the same arithmetic, so a row's logits are the same bits
// at any row count; batch-adaptive MoE layers use cuBLAS there (GemmF32) instead.
inline constexpr int kMoeRouterKernelMaxRows = 64;
struct MoeRouterLogitsParams {
  int rows = 0;
  int num_experts = 0;
  int64_t hidden = 0;
  const float* x = nullptr;  // [rows, ldx] fp32, device
  int64_t ldx = 0;
  const float* w = nullptr;  // [E, ldw] fp32 (mlp.gate.weight), device
  int64_t ldw = 0;
  float* y = nullptr;  // [rows, ldy] fp32 logits, device
  int64_t ldy = 0;
  void* stream = nullptr;
};
absl::Status MoeRouterLogitsCuda(const MoeRouterLogitsParams& p);

struct MoeRouteParams {
  int rows = 0;
  int num_experts = 0;                // E (n_routed_experts), <= kMoeMaxExperts
  int top_k = 0;                      // K (num_experts_per_tok), <= kMoeMaxTopK, <= E
  int n_group = 1;                    // divides E
  int topk_group = 1;                 // <= n_group; top_k <= topk_group * (E / n_group)
  bool norm_topk_prob = true;         // norm_topk_prob
  float routed_scaling_factor = 1.f;  // routed_scaling_factor
  const float* logits = nullptr;      // [rows, E] fp32 router logits, device
  const float* bias = nullptr;        // [E] fp32 e_score_correction_bias, device
  int32_t* experts = nullptr;         // [rows, K] out: experts in selection order, device
  float* weights = nullptr;           // [rows, K] out: their combine weights, device
  void* stream = nullptr;
};
absl::Status MoeRouteCuda(const MoeRouteParams& p);

struct MoePermuteParams {
  int rows = 0;
  int num_experts = 0;               // E
  int top_k = 0;                     // K
  const int32_t* experts = nullptr;  // [rows, K] (MoeRouteCuda), device
  int32_t* offsets = nullptr;        // [E + 1] out: expert e's pairs are [offsets[e], offsets[e+1])
  int32_t* perm_rows = nullptr;      // [rows * K] out: the row of each permuted pair
  int32_t* pair_pos = nullptr;       // [rows * K] out: pair (r, k)'s index in the permutation
  int32_t* workspace = nullptr;      // [MoePermuteWorkspaceInts(rows * K, E)] scratch, device
  void* stream = nullptr;
};
absl::Status MoePermuteCuda(const MoePermuteParams& p);
// int32 elements of MoePermuteParams::workspace for `pairs` = rows * K pairs.
int64_t MoePermuteWorkspaceInts(int64_t pairs, int num_experts);

// *count += the number of experts e in [begin, begin + n) with offsets[e + 1] > offsets[e]
// (experts of this GPU that at least one routed pair reached; a profile counter).
struct MoeCountTouchedParams {
  const int32_t* offsets = nullptr;  // [E + 1] (MoePermuteCuda), device
  int begin = 0;
  int n = 0;
  int32_t* count = nullptr;  // device, accumulated with atomicAdd
  void* stream = nullptr;
};
absl::Status MoeCountTouchedCuda(const MoeCountTouchedParams& p);

// out[i, :] = x[perm_rows[i], :] for i < n (bf16 rows).
struct MoeGatherParams {
  int64_t n = 0;                 // permuted rows (rows * K)
  int64_t cols = 0;              // hidden
  const bf16_bits* x = nullptr;  // [rows, ldx] bf16, device
  int64_t ldx = 0;
  const int32_t* perm_rows = nullptr;  // [n] (MoePermuteCuda)
  bf16_bits* out = nullptr;            // [n, cols] bf16, device
  // Optional device ints: only out rows [*row_begin, *row_end) are written (expert
  // parallelism: the pairs of this GPU's experts, &offsets[first] and &offsets[last + 1]).
  const int32_t* row_begin = nullptr;
  const int32_t* row_end = nullptr;
  void* stream = nullptr;
};
absl::Status MoeGatherCuda(const MoeGatherParams& p);

// FP8 activations for the block-scaled expert GEMMs (grouped_gemm.h), quantized per row and
// 128-column group as DeepSeek-V3's inference code does (act_quant):
//   s[i, g] = max(amax(v[i, 128 g : 128 g + 128]), 1e-10) / 448
//   q[i, j] = e4m3(v[i, j] / s[i, j / 128])   (IEEE division, round to nearest even, saturated)
// cols must be a multiple of 128. One warp per (row, group); the result of a row does not
// depend on the other rows.
//
// MoeGatherQuantFp8Cuda: v[i, :] = x[perm_rows[i], :] (bf16 rows; perm_rows null = identity).
struct MoeGatherQuantFp8Params {
  int64_t n = 0;     // rows out (the permuted pairs, rows * K)
  int64_t cols = 0;  // hidden, % 128 == 0
  const bf16_bits* x = nullptr;
  int64_t ldx = 0;
  const int32_t* perm_rows = nullptr;  // [n] or null
  uint8_t* out = nullptr;              // [n, cols] e4m3
  float* out_scale = nullptr;          // [n, cols / 128] (or by column group, below)
  // > 0: the scales stored by column group, out_scale[g * scale_ld_rows + i] (cuBLASLt's VEC128
  // layout, fp8/fp8_gemm.h; scale_ld_rows >= n); 0: out_scale[i * cols / 128 + g].
  int64_t scale_ld_rows = 0;
  const int32_t* row_begin = nullptr;  // optional, as MoeGatherParams
  const int32_t* row_end = nullptr;
  void* stream = nullptr;
};
absl::Status MoeGatherQuantFp8Cuda(const MoeGatherQuantFp8Params& p);

// SwiGluQuantFp8Cuda: v[i, j] = silu(gate_up[i, j]) * gate_up[i, up_offset + j] in fp32 (the
// same silu as SwiGluCuda), then quantized; j < cols.
struct SwiGluQuantFp8Params {
  int64_t rows = 0;
  int64_t cols = 0;  // intermediate, % 128 == 0
  const float* gate_up = nullptr;
  int64_t ld_in = 0;
  int64_t up_offset = 0;
  uint8_t* out = nullptr;              // [rows, cols] e4m3
  float* out_scale = nullptr;          // [rows, cols / 128] (or by column group)
  int64_t scale_ld_rows = 0;           // as MoeGatherQuantFp8Params
  const int32_t* row_begin = nullptr;  // optional, as MoeGatherParams
  const int32_t* row_end = nullptr;
  void* stream = nullptr;
};
absl::Status SwiGluQuantFp8Cuda(const SwiGluQuantFp8Params& p);

// offsets = {0, rows}: the device offsets of a one-group GEMM (grouped_gemm.h) over `rows`
// rows (an FP8 dense layer: moe_mlp.h RunFp8Mlp), written by a kernel on the stream.
absl::Status SingleGroupOffsetsCuda(int32_t* offsets, int64_t rows, void* stream);

// v[r, j] = sum over k in ascending experts[r, k] of weights[r, k] * y[pair_pos[r, k], j]
//           (+ shared[r, j] when shared is set);
// out[r, j] = accumulate ? out[r, j] + v[r, j] : v[r, j].
struct MoeCombineParams {
  int rows = 0;
  int top_k = 0;
  int64_t cols = 0;                   // hidden
  const int32_t* experts = nullptr;   // [rows, K] (MoeRouteCuda)
  const float* weights = nullptr;     // [rows, K]
  const int32_t* pair_pos = nullptr;  // [rows, K] (MoePermuteCuda)
  const float* y = nullptr;           // [rows * K, cols] fp32 expert outputs (permuted), or
                                      // null: no routed part on this rank (sum 0)
  const float* shared = nullptr;      // [rows, cols] fp32 shared experts' output, or null
  float* out = nullptr;               // [rows, ld_out] fp32
  int64_t ld_out = 0;
  bool accumulate = false;
  // Only experts [expert_begin, expert_end) contribute (expert parallelism: this GPU's);
  // expert_end < 0: every expert.
  int expert_begin = 0, expert_end = -1;
  void* stream = nullptr;
};
absl::Status MoeCombineCuda(const MoeCombineParams& p);

// out[i] = float(in[i]) for i < n (bf16 -> fp32 widening, exact).
absl::Status Bf16ToFloatCuda(const bf16_bits* in, float* out, int64_t n, void* stream);

// out[i] = bf16(in[i]) for i < n, rounded to nearest even (as cuBLAS rounds a bf16 output):
// the FP8 GEMMs' fp32 results where the next kernels read bf16 (the attention's queries).
absl::Status FloatToBf16Cuda(const float* in, bf16_bits* out, int64_t n, void* stream);

}  // namespace verifyd::kernels::cuda
