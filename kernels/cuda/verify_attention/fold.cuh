// The left fold that merges the splits of a positional plan's rows (internal CUDA header).
//
// A split's result is its normalised fp32 output row and its log2 sum of exponentials (the
// partial layout of every kernel variant). Positional plans merge a row's splits 0, 1, ...,
// S - 1 strictly left to right with FoldWeightsOf / FoldValue: fold(...fold(fold(p0, p1),
// p2)..., p_{S-1}). The seesaw kernel folds the splits of a split group that starts at the
// row's first key as it finishes them (VerifyCombineItem::folded_splits), the fold combine
// kernel continues from there: both call these functions on the same values in the same
// order, so a row's bits do not depend on which CTA folded which split, i.e. on the batch.
// Every operation is an explicitly rounded intrinsic (no contraction differences between the
// two kernels).
#pragma once

#include <cuda_runtime.h>

#include <cmath>

namespace verifyd::kernels::cuda::detail {

struct FoldWeights {
  float wa;   // weight of the fold so far
  float wb;   // weight of the next split
  float lse;  // log2 sum of exponentials of the two together
};

// a: the fold's log2 LSE so far, b: the next split's (-inf: no key).
__device__ __forceinline__ FoldWeights FoldWeightsOf(float a, float b) {
  if (b == -INFINITY) return {1.f, 0.f, a};
  if (a == -INFINITY) return {0.f, 1.f, b};
  const float m = fmaxf(a, b);
  const float ea = exp2f(__fsub_rn(a, m));
  const float eb = exp2f(__fsub_rn(b, m));
  const float s = __fadd_rn(ea, eb);
  const float inv = __frcp_rn(s);
  return {__fmul_rn(ea, inv), __fmul_rn(eb, inv), __fadd_rn(m, log2f(s))};
}

// One output column: the fold's value oa, the next split's ob.
__device__ __forceinline__ float FoldValue(const FoldWeights& w, float oa, float ob) {
  return __fmaf_rn(w.wb, ob, __fmul_rn(w.wa, oa));
}

// A split's log2 LSE from its running max (log2 domain) and its row sum: what a kernel writes
// to the partial LSE and what the seesaw kernel folds with.
__device__ __forceinline__ float SplitLse(float m, float l_tot) {
  return l_tot > 0.f ? __fadd_rn(m, log2f(l_tot)) : -INFINITY;
}

}  // namespace verifyd::kernels::cuda::detail
