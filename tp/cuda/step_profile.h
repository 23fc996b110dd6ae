// The CUDA engine's per-step time split on rank 0 (EngineOptions::cuda.profile): filled by
// the rank's step (tp/cuda/rank_context.h holds the last one), read through
// CudaEngine::last_step (tp/cuda/cuda_engine.h).
// Thread-safety: a plain value.
#pragma once

#include <cstdint>

namespace verifyd::tp {

// Time split of the last step on rank 0 (milliseconds of GPU stream time), when
// EngineOptions::cuda.profile is set.
struct CudaStepProfile {
  double attention_ms = 0;  // verify attention kernels (+ combine)
  // Dense GEMMs: projections incl. the absorbed per-head products, dense MLPs, shared
  // experts, LM head.
  double gemm_ms = 0;
  double router_ms = 0;    // MoE router logits + top-k
  double dispatch_ms = 0;  // MoE permutation, gathers, weighted combine
  double experts_ms = 0;   // routed experts' GEMMs, SwiGLU and FP8 quantization
  double sampling_ms = 0;  // argmax, sampling, acceptance, copy out
  double comm_ms = 0;      // all-reduce / all-gather
  double other_ms = 0;     // norms, rope, KV write, SwiGLU of dense MLPs, plan upload
  double total_ms = 0;     // first to last event
  // MoE models: the rank's routed experts that at least one row reached, summed over the MoE
  // layers (the expert weights the step had to read).
  int64_t experts_touched = 0;
};

}  // namespace verifyd::tp
