// The per-GPU memory plan of the CUDA engine: what one tensor-parallel rank holds (its weight
// shard by part, activation buffers and workspaces) and how many latent KV tokens fit in the
// device memory left, computed from the config and the engine limits alone (nothing is loaded
// or allocated: it runs on any machine, for `verifyd --print_memory_plan` and before a load).
//
// It mirrors tp/cuda/rank_context.cc InitRankContext and AllocateKvPool:
//   - the shards: heads H / tp, vocabulary rows VocabShard (the embedding too at TP > 1), the
//     dense MLP and shared-expert columns IntermediateShard, the routed experts E / tp whole
//     experts under expert parallelism (when tp divides E) or a column slice of every expert;
//   - FP8 weights (an FP8 checkpoint with 128 x 128 blocks and fp8_weights, i.e. the engine's
//     fp8_experts on sm_90) stay e4m3 with fp32 block scales where the rank's slices are
//     128-aligned: routed experts, shared experts, dense MLPs, the attention projections but
//     kv_b (always bf16; q_a and kv_a fused with kv_a's rows padded to a whole block); every
//     other weight is bf16, the router fp32;
//   - activations for R = max_batch x max_tail_rows rows, the MoE and FP8 scratch, the cuBLAS
//     workspace, the verify attention's workspace (VerifyAttentionWorkspace::BytesFor at the
//     engine's capacities), NCCL's rank-order reduce buffer (batch-invariant, TP > 1) and the
//     all-gathered logits that sampling / logprobs allocate on first use (TP > 1);
//   - KV: num_hidden_layers rows a token, each (kv_lora + rope) x 2 bytes in bf16 or the FP8
//     format's row (kernels/kv_fp8.h: 656 bytes for 512 + 64).
// Estimates (the parts the plan cannot see; `reserve_fraction` of the device covers them): the
// CUDA context, NCCL's own channels, cuBLAS(Lt) and grouped-GEMM internals, the step-plan
// arena and sampling buffers (grown on demand, small), cudaMalloc rounding; the FP8 block-scale
// rows are counted at the batch-invariant layout (cuBLASLt's padded rows are a few KB more).
// Bytes are exact for the parts listed (tests/tp_memory_plan_test.cc checks them by hand).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tp/engine_options.h"
#include "tp/model_config.h"

namespace verifyd::tp {

struct MemoryPlanOptions {
  int tp = 1;    // tensor-parallel ranks (must divide num_attention_heads)
  int rank = 0;  // the rank planned, in [0, tp) (uneven vocab / intermediate slices differ)
  bool expert_parallel = true;  // EngineOptions::cuda.expert_parallel
  bool fp8_weights = true;      // FP8-stored weights stay FP8 (cuda.fp8_experts, sm_90)
  bool kv_fp8 = false;          // EngineOptions::kv_dtype == kFp8
  int max_batch = 64;           // EngineLimits
  int max_tail_rows = 65;
  int64_t max_context = 0;         // 0: max_position_embeddings (reported; the pool is per slot)
  bool batch_invariant = true;     // EngineOptions::cuda.batch_invariant
  int positional_max_splits = 32;  // cuda.positional_max_splits
  int64_t positional_partial_rows = int64_t{1} << 19;  // cuda.positional_partial_rows
  int64_t fp8_staging_keys = 262144;  // cuda.fp8_staging_keys (kv_fp8, not batch-invariant)
  bool sampling = true;  // count the all-gathered logits of sampling / logprobs (TP > 1)
  int64_t kv_slots = 0;  // requested KV tokens (slots) per rank; 0: as many as fit
  // An H200 as cudaMemGetInfo reports it (143,771 MiB by nvidia-smi; sold as 141 GB).
  int64_t device_memory_bytes = int64_t{150110} * 1000 * 1000;
  double reserve_fraction = 0.02;  // of the device, kept for what the plan cannot see
};

// One line of the plan.
struct MemoryPart {
  std::string name;    // "embedding", "attention", ..., "verify_attention_workspace"
  int64_t bytes = 0;   // on this rank
  std::string detail;  // how it is made up ("61 layers x 45.3 MB", "48 experts x 61 layers")
};

struct MemoryPlan {
  ModelConfig config;
  MemoryPlanOptions options;
  // What the engine would choose for this rank.
  int64_t local_heads = 0, local_experts = 0, vocab_rows = 0;
  bool fp8_attention = false, fp8_dense = false, fp8_shared = false, fp8_experts = false;
  std::vector<MemoryPart> weights;  // embedding, attention, dense_mlp, routed_experts,
                                    // shared_experts, router, norms, lm_head
  std::vector<MemoryPart> buffers;  // activations, moe_buffers, fp8_buffers, cublas_workspace,
                                    // verify_attention_workspace, rank_order_reduce,
                                    // logits_gather
  int64_t weight_bytes = 0;
  int64_t buffer_bytes = 0;
  int64_t reserve_bytes = 0;       // reserve_fraction x device
  int64_t kv_bytes_per_token = 0;  // all layers, this rank (every rank holds the whole latent)
  int64_t kv_capacity_tokens = 0;  // tokens in device - weights - buffers - reserve (>= 0)
  int64_t kv_tokens = 0;           // kv_slots, or kv_capacity_tokens when kv_slots = 0
  int64_t max_context = 0;         // the per-request limit the engine would use
  // OK, or ResourceExhausted: "weights X GB + workspaces Y GB + requested KV Z GB exceed the
  // device's W GB" (also when nothing is left for the KV pool at kv_slots = 0).
  absl::Status fit;

  int64_t WeightBytes(const std::string& part) const;  // 0 when absent
  int64_t BufferBytes(const std::string& part) const;
};

// The plan of options.rank. InvalidArgument naming the field for bad options (tp, rank,
// limits, device memory, reserve) or an invalid config; a plan that does not fit is returned
// with `fit` set, not as an error.
absl::StatusOr<MemoryPlan> PlanRankMemory(const ModelConfig& config,
                                          const MemoryPlanOptions& options);

// The plan options of an engine's options (tp, expert_parallel, fp8_experts, kv_dtype, limits,
// kv_slots, the cuda.positional_* / fp8_staging_keys / batch_invariant knobs) on a device of
// device_memory_bytes; rank 0.
MemoryPlanOptions MemoryPlanOptionsOf(const EngineOptions& options, int64_t device_memory_bytes);

// The config of `model` without reading any weights: a preset (preset_layers > 0 overrides its
// layer count) or a checkpoint directory's config.json (name = the directory's base name).
// InvalidArgument naming the model when it is neither; the parser's error for a bad file.
absl::StatusOr<ModelConfig> ModelConfigOf(const std::string& model, int64_t preset_layers = 0);

// The plan as a text table (one part a line, GB = 10^9 bytes), ending with the KV lines and
// the fit status.
std::string FormatMemoryPlan(const MemoryPlan& plan);

}  // namespace verifyd::tp
