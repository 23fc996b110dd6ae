// The CUDA engine: the MLA decoder on N GPUs of one host with NCCL tensor parallelism,
// behind tp::Engine (the server's backend for `--backend cuda`).
//
// One thread per rank (tp/rank_group.h) owns its GPU, a stream, a cuBLAS handle, its
// NcclCommunicator (TP > 1) and its weight shard (bf16 on the device: generated on the GPU from the
// preset seed with the same bits as the CPU backend, or loaded from a checkpoint directory). Every
// rank keeps the full latent KV pool ([layers][kv_slots][kv_lora + rope] bf16, see DESIGN.md).
//
// A Step: the batch is validated and planned once on the caller's thread (tp::BuildBatchPlan:
// InvalidArgument naming the field, before any KV write); each rank copies the plan (tokens,
// positions, slot lists, tree masks) and the step's verify-attention split plan (made once a
// step on the caller's thread) to its device, computes the RoPE table once, and runs every
// layer from them
// (tp/cuda/mla_layer.h): cuBLAS GEMMs, fused RMSNorm / RoPE / latent-KV write / SwiGLU
// kernels, the verify attention kernel (kernels/cuda/verify_attention/api.h where it
// supports the shape, else kernels/cuda/dense/fallback_attention.h),
// all-reduce after o_proj and the down-projection, then the vocab-parallel argmax
// (all-gather of (value, index) per row). Tree acceptance and the kept/freed slot lists are
// computed on rank 0's GPU; the results are copied out once per step. Per-rank device state:
// tp/cuda/rank_context.h.
//
// Sampling and logprobs (tp/engine.h): when a step has sampled or logprob rows, the logits
// are all-gathered to every rank (TP > 1) and rank 0 runs kernels/cuda/sampling/sampling.h (one
// block per row) before acceptance, overwriting the drawn rows' predictions; the logprobs
// come back with the step's other results. Hidden states: rank 0 copies the asked rows of the
// residual stream (replicated on every rank after each all-reduce) after each asked layer
// into one device buffer, copied to the host once per step. Greedy steps without these do
// none of it.
//
// Failure: a rank error, an NCCL async error or a collective / stream wait longer than
// comm_timeout_ms aborts the NCCL group; Step answers Unavailable, failed() turns true and
// stays true (the server reports NOT_SERVING and exits non-zero).
//
// Thread-safety: Step / StepWithLogits from one thread at a time (serialised by a mutex);
// the accessors from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tp/comm_model.h"
#include "tp/cuda/step_profile.h"
#include "tp/engine.h"
#include "tp/engine_options.h"
#include "tp/model_config.h"

namespace verifyd::tp {

// Number of visible CUDA devices (0 when there is no driver or no device).
int CudaDeviceCount();
// True when at least one CUDA device is visible: `--backend auto` picks "cuda" then.
bool CudaDevicesAvailable();

// What rank 0 of a CudaEngine chose at load (CudaEngine::load_report; tests and benchmarks).
struct CudaLoadReport {
  // How the routed experts run (kernels/cuda/moe/moe_mlp.h ExpertPath: "fp8 block-scaled
  // grouped GEMMs", "bf16 grouped GEMMs" or "bf16 per-expert cuBLAS GEMMs"); "" without MoE.
  std::string expert_mode;
  // Which other SwiGLU MLPs are kept in FP8 (moe_mlp.h RunFp8Mlp): "dense", "shared experts",
  // "dense, shared experts" or "" (bf16).
  std::string fp8_mlps;
  // Whether the attention projections (q_a, kv_a, q_b / q_proj, o_proj) are kept in FP8
  // (moe_mlp.h RunFp8Linear; rank_context.h fp8_attention).
  bool fp8_attention = false;
  // How those FP8 linears (not the routed experts) run: "cublaslt" (fp8_gemm.h), "grouped"
  // (the one-group grouped kernel: batch-invariant steps, or no cuBLASLt algorithm) or ""
  // (none in FP8).
  std::string fp8_gemm;
  // Routed experts held: n_routed_experts (a slice of each: tensor-parallel experts) or
  // n_routed_experts / tp (expert parallelism); 0 without MoE.
  int64_t local_experts = 0;
};

// What rank 0 of a CudaEngine ran in its last step (CudaEngine::last_step; tests and
// benchmarks).
struct CudaStepReport {
  CudaStepProfile profile;  // the time split (EngineOptions::cuda.profile), else zeros
  // Packs of requests that read a shared prefix once in the verify-attention plan
  // (kernels/cuda/verify_attention/api.h "Shared prefixes").
  int shared_prefix_packs = 0;
  // The verify attention configuration ("m16", "s64", "km16", "s64staged":
  // kernels/cuda/verify_attention/config.h) or "fallback" (kernels/cuda/dense/
  // fallback_attention.h: shapes the optimised kernels do not take).
  std::string verify_kernel;
  // A slice's (EngineOptions::cuda.slice_rank) collectives, recorded in call order instead of
  // run (tp/cuda/recording_communicator.h); empty otherwise.
  std::vector<CollectiveCall> collectives;
};

class CudaEngine final : public Engine {
 public:
  // Reads every EngineOptions field but `cpu`.
  static absl::StatusOr<std::unique_ptr<CudaEngine>> Create(const EngineOptions& options);
  ~CudaEngine() override;

  const ModelConfig& config() const override;
  std::string backend() const override { return "cuda"; }
  int tp_size() const override;
  int64_t kv_slots() const override;
  EngineLimits limits() const override;
  // EngineOptions::cuda.batch_invariant; false for a slice (cuda.slice_rank: its answers are
  // not the model's, so GetInfo never calls them exact).
  bool batch_invariant() const override;
  // "bfloat16", or "fp8_e4m3" (EngineOptions::kv_dtype fp8: kernels/kv_fp8.h).
  std::string kv_cache_dtype() const override;
  bool failed() const override;
  // The first rank's device memory: the plan's weights and workspaces (tp/memory_plan.h), the
  // KV pool, and the memory in use once weights and buffers were allocated (cudaMemGetInfo).
  EngineMemory memory() const override;

  absl::StatusOr<std::vector<StepResult>> Step(const std::vector<StepRequest>& batch,
                                               StepTiming* timing = nullptr) override;
  // Step, and the full logits [total_rows, vocab_size] (fp32, gathered from every rank).
  absl::StatusOr<std::vector<StepResult>> StepWithLogits(const std::vector<StepRequest>& batch,
                                                         std::vector<float>* logits,
                                                         StepTiming* timing = nullptr);
  // Rank r's latent KV row of `slot` in `layer` (kv_lora + rope values; an FP8 cache's row
  // dequantized). Test API.
  absl::StatusOr<std::vector<float>> LatentRow(int rank, int64_t layer, int32_t slot);
  // Fills every layer's whole latent KV pool with finite pseudo-random values from `seed`
  // (bf16, uniform [-1, 1); an FP8 cache stores those rows in its format): a benchmark can
  // then attend over long contexts without prefilling them. Benchmark / test API.
  absl::Status FillLatentCacheRandom(uint64_t seed);
  // Turns the per-step time split on or off (EngineOptions::cuda.profile) between steps.
  void set_profile(bool on);
  // Test and benchmark introspection: what rank 0 chose at load, and what its last step ran.
  CudaLoadReport load_report() const;
  CudaStepReport last_step() const;

  struct Impl;

 private:
  explicit CudaEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The Engine-typed factory (the server's entry point for --backend cuda).
absl::StatusOr<std::unique_ptr<Engine>> CreateCudaEngine(const EngineOptions& options);

}  // namespace verifyd::tp
