// Engine-internal CUDA kernels of the CUDA engine (tp/cuda_engine.cc):
//   - FallbackVerifyAttentionCuda: a simple, correct verify attention for the shapes the
//     optimised kernel (kernels/cuda/verify_attention_cuda.h) does not support (it needs
//     qk_dim 576 / v_dim 512, e.g. the `tiny` preset has 80 / 64) or when it is not built.
//     One CTA per (row, head), warps stride over the keys with an online softmax, fp32 math.
//     Same semantics and parameters as kernels/verify_attention.h (lse not written).
//   - TreeAcceptCuda: greedy tree acceptance + KV commit lists on the device, the rule of
//     kernels/tree_accept.h (one thread per request; trees are at most 128 rows).
// Host header (no CUDA code). Thread-safety: launchers are reentrant.
#pragma once

#include "absl/status/status.h"
#include "kernels/tree_accept.h"
#include "kernels/verify_attention.h"

namespace verifyd::tp::cuda {

// Device pointers; p.dtype must be kBFloat16; qk_dim <= 1024, v_dim <= 512.
absl::Status FallbackVerifyAttentionCuda(const kernels::VerifyAttentionParams& p);

// Device pointers; inputs are trusted (validated on the host by BuildBatchPlan).
absl::Status TreeAcceptCuda(const kernels::TreeAcceptParams& p);

}  // namespace verifyd::tp::cuda
