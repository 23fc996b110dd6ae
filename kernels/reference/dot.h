// Internal to kernels/reference: the one dot-product summation order every reference op uses.
//
// Order ("blocked-8"), for a dot product of length k:
//   1. Eight float lanes, lane l (0..7) starts at +0.0f and adds a[i] * b[i] for
//      i = 8*blk + l, blk = 0, 1, ..., in ascending blk, over the first k8 = k - k % 8
//      elements (products rounded to float, then added: no fused multiply-add; the library
//      is built with -ffp-contract=off).
//   2. The lanes are folded as ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
//   3. The k % 8 remaining products are added one by one in ascending index order.
// The order depends only on k, never on the number of rows in a batch or on which code path
// (vectorised Linear tiles or this scalar form) computed it, so results are bit-identical.
// Not a public header: include only from kernels/reference/*.cc and their tests.
// Thread-safe: pure functions.
#pragma once

#include <cstdint>

#include "kernels/common.h"

namespace verifyd::kernels::ref::internal {

inline constexpr int64_t kDotLanes = 8;

// Loads element i of a float or bf16 array as float.
inline float LoadAsFloat(const float* p, int64_t i) { return p[i]; }
inline float LoadAsFloat(const bf16_bits* p, int64_t i) { return Bf16ToFloat(p[i]); }

// Step 2 of the order: folds the eight lanes.
inline float FoldLanes(const float l[kDotLanes]) {
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

// dot(a[0:k], b[0:k]) in the blocked-8 order; b may be float or bf16 (widened exactly).
template <typename T>
inline float BlockedDot(const float* a, const T* b, int64_t k) {
  float lanes[kDotLanes] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  const int64_t k8 = k - k % kDotLanes;
  for (int64_t i = 0; i < k8; i += kDotLanes) {
    for (int64_t l = 0; l < kDotLanes; ++l) lanes[l] += a[i + l] * LoadAsFloat(b, i + l);
  }
  float s = FoldLanes(lanes);
  for (int64_t i = k8; i < k; ++i) s += a[i] * LoadAsFloat(b, i);
  return s;
}

}  // namespace verifyd::kernels::ref::internal
