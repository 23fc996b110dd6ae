// GPU greedy tree acceptance and KV commit: the same rule and TreeAcceptParams as
// TreeAcceptReference (kernels/tree_accept.h), with device pointers, so a verify step needs no
// host round trip before its results are copied out.
//
// One thread per request walks its tree (<= kMaxTailRows rows). Launch on params.stream;
// graph-capturable (no sync, no allocation). Inputs are trusted to be well formed (the
// reference validates; the engine builds them): parents[r] of local row t >= 1 must be in
// [0, t), local row 0's parent -1, row_indptr monotone, <= kMaxTailRows rows per request.
// Thread-safety: reentrant.
#pragma once

#include "absl/status/status.h"
#include "kernels/tree_accept.h"

namespace verifyd::kernels::cuda {

absl::Status TreeAcceptCuda(const TreeAcceptParams& params);

}  // namespace verifyd::kernels::cuda
