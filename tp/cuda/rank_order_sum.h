// The rank-order sum of the CUDA engine's tensor-parallel reductions: out[i] = sum over ranks
// r = 0 .. world-1 of src[r][i], accumulated in float32 in rank order, one element per
// thread. Each element's sum is the same sequence of additions whatever the message size or
// the launch shape, so a reduction built on it (the loopback communicator, and NCCL in the
// batch-invariant mode: all-gather, then this sum) gives a row the same bits whatever else
// shares the step, and loopback TP N gives the bits NCCL TP N gives.
// Thread-safety: reentrant (enqueues one kernel on `stream`).
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "kernels/common.h"

namespace verifyd::tp {

inline constexpr int kMaxRankOrderSources = 8;

// src: `world` (1..kMaxRankOrderSources) device pointers of `count` elements of `dtype`
// (kFloat32 or kBFloat16); out: device memory of the same size (it may be one of the sources:
// each thread reads its element of every source before writing it). Enqueued on `stream`
// (cudaStream_t); InvalidArgument for a bad world or dtype.
absl::Status SumInRankOrderCuda(const void* const* src, int world, size_t count,
                                kernels::DType dtype, void* out, void* stream);

}  // namespace verifyd::tp
