// The CUDA engine: the MLA decoder on N GPUs of one host with NCCL tensor parallelism,
// behind tp::Engine (the server's backend for `--backend cuda`).
//
// One thread per rank owns its GPU, a stream, a cuBLAS handle, its NcclCommunicator (TP > 1)
// and its weight shard (bf16 on the device: generated on the GPU from the preset seed with
// the same bits as the CPU backend, or loaded from a checkpoint directory). Every rank keeps
// the full latent KV pool ([layers][kv_capacity][kv_lora + rope] bf16, see DESIGN.md).
//
// A Step: the batch is validated and planned once on the caller's thread (tp::BuildBatchPlan:
// InvalidArgument naming the field, before any KV write); each rank copies the plan (tokens,
// positions, slot lists, tree masks) to its device in one transfer, computes the RoPE table
// and the verify-attention split plan once, and runs every layer from them: cuBLAS GEMMs,
// fused RMSNorm / RoPE / latent-KV write / SwiGLU kernels, the verify attention kernel
// (kernels/cuda/verify_attention_cuda.h where it supports the shape, else a simple fallback),
// all-reduce after o_proj and the down-projection, then the vocab-parallel argmax
// (all-gather of (value, index) per row). Tree acceptance and the kept/freed slot lists are
// computed on rank 0's GPU; the results are copied out once per step.
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
#include "tp/cpu_engine.h"  // RankFaultHook
#include "tp/engine.h"
#include "tp/model_config.h"
#include "tp/weights.h"

namespace verifyd::tp {

// Number of visible CUDA devices (0 when there is no driver or no device).
int CudaDeviceCount();
// True when at least one CUDA device is visible: `--backend auto` picks "cuda" then.
bool CudaDevicesAvailable();

struct CudaEngineOptions {
  // The model, the first that is set wins:
  //   weights  explicit host weights (config inside; validated, uploaded as bf16).
  //   config   a model configuration whose weights are generated on the GPU from `seed`
  //            (the same values as GenerateRandomWeights(config, seed)): test shapes that
  //            are not presets.
  //   model    a preset name (with `seed`, `preset_layers`) or else a checkpoint directory.
  std::shared_ptr<const ModelWeights> weights;
  std::shared_ptr<const ModelConfig> config;
  std::string model = "tiny";
  uint64_t seed = 0;
  int64_t preset_layers = 0;

  int tp = 1;                   // ranks; must divide num_attention_heads
  std::vector<int> devices;     // CUDA device of each rank; empty = 0 .. tp-1
  // Latent KV pool size: kv_capacity slots when > 0, else kv_memory_fraction of the device
  // memory left free after weights and buffers (smallest over the ranks).
  int64_t kv_capacity = 0;
  double kv_memory_fraction = 0.5;
  int max_batch = 64;           // requests per Step
  int max_tail_rows = 65;       // rows per request per Step, 1..kernels::kMaxTailRows
  int64_t max_context = 0;      // 0 = the config's max_position_embeddings
  int comm_timeout_ms = 60000;  // collective / stream wait before a rank is declared hung
  bool use_verify_kernel = true;  // false: always the simple fallback attention
  bool profile = false;         // time the step's parts with CUDA events (rank 0)
  RankFaultHook fault_hook;     // optional fault injection (tests)
};

// Time split of the last step on rank 0 (milliseconds of GPU stream time), when
// CudaEngineOptions::profile is set.
struct CudaStepProfile {
  double attention_ms = 0;  // verify attention kernels (+ combine)
  double gemm_ms = 0;       // cuBLAS GEMMs incl. the absorbed per-head products, LM head
  double comm_ms = 0;       // all-reduce / all-gather
  double other_ms = 0;      // norms, rope, KV write, SwiGLU, argmax, acceptance, copies
  double total_ms = 0;      // first to last event
  bool verify_kernel = false;  // the optimised kernel ran (else the fallback)
};

class CudaEngine final : public Engine {
 public:
  static absl::StatusOr<std::unique_ptr<CudaEngine>> Create(const CudaEngineOptions& options);
  ~CudaEngine() override;

  const ModelConfig& config() const override;
  std::string backend() const override { return "cuda"; }
  int tp_size() const override;
  int64_t kv_capacity() const override;
  EngineLimits limits() const override;
  bool failed() const override;

  absl::StatusOr<std::vector<StepResult>> Step(const std::vector<StepRequest>& batch,
                                               StepTiming* timing = nullptr) override;
  // Step, and the full logits [total_rows, vocab_size] (fp32, gathered from every rank).
  absl::StatusOr<std::vector<StepResult>> StepWithLogits(const std::vector<StepRequest>& batch,
                                                         std::vector<float>* logits,
                                                         StepTiming* timing = nullptr);
  // Rank r's latent KV row of `slot` in `layer` (kv_lora + rope values). Test API.
  absl::StatusOr<std::vector<float>> LatentRow(int rank, int64_t layer, int32_t slot);
  // Fills every layer's whole latent KV pool with finite pseudo-random values from `seed`
  // (bf16, uniform [-1, 1)): a benchmark can then attend over long contexts without
  // prefilling them. Benchmark / test API.
  absl::Status FillLatentCacheRandom(uint64_t seed);
  // Turns the per-step time split on or off (CudaEngineOptions::profile) between steps.
  void set_profile(bool on);
  // The time split of the last step (profile option), else zeros.
  CudaStepProfile last_profile() const;

  struct Impl;

 private:
  explicit CudaEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The Engine-typed factory (the server's entry point for --backend cuda).
absl::StatusOr<std::unique_ptr<Engine>> CreateCudaEngine(const CudaEngineOptions& options);

}  // namespace verifyd::tp
