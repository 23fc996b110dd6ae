// MlaStep: what every kernel of one CUDA engine step reads besides the rank's buffers (the
// model, the step's sizes, its device plan and its attention), shared by the decoder's
// layers (tp/cuda/mla_layer.h, tp/cuda/moe_layer.h). Filled by the rank's step
// (tp/cuda/engine_step.cc).
// Thread-safety: a plain value, read on the rank's own thread.
#pragma once

#include <cstdint>

#include "kernels/cuda/verify_attention/api.h"
#include "kernels/verify_attention.h"
#include "tp/model_config.h"

namespace verifyd::tp {

// What every kernel of one step reads besides the rank's buffers.
struct MlaStep {
  const ModelConfig* config = nullptr;
  int tp = 1;
  int64_t kv_slots = 0;
  int64_t rows = 0;             // R: tail rows of the batch
  int64_t batch = 0;            // B: requests
  int sync_timeout_ms = 60000;  // deadline of a host wait inside the step (MoE layers)
  // The step plan on the device.
  const int32_t* tokens = nullptr;     // [R]
  const int32_t* positions = nullptr;  // [R]
  const int32_t* slots = nullptr;      // [R] tail slots
  // The attention of every layer (all but `kv`, set per layer), and the optimised kernel's
  // split plan; null: the fallback attention.
  kernels::VerifyAttentionParams attention;
  const kernels::cuda::VerifyAttentionPlan* verify_plan = nullptr;
};

}  // namespace verifyd::tp
