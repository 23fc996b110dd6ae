// The one options struct of the engines: what the server (server/engine_factory.h) fills from
// its flags (opening a checkpoint directory as `source`) and hands to the CPU engine
// (tp/cpu/cpu_engine.h) or, through the CUDA engine module (server/cuda_engine_module.h), to
// the CUDA engine (tp/cuda/cuda_engine.h).
// Fields every backend reads come first; the knobs only one backend reads are grouped in
// `cpu` and `cuda`.
//
// ResolveEngineModel applies the model precedence for both engines.
//
// Thread-safety: a plain value type (a `source` it holds is read-only and thread-safe,
// tp/weight_source.h); ResolveEngineModel is reentrant.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/verify_attention/config.h"
#include "tp/engine.h"
#include "tp/model_config.h"
#include "tp/rank_group.h"
#include "tp/weight_source.h"
#include "tp/weights.h"

namespace verifyd::tp {

enum class KvDtype { kAuto, kFp8 };
// "auto" / "fp8" (the --kv_dtype spelling); ParseKvDtype: InvalidArgument naming the flag.
const char* KvDtypeName(KvDtype d);
absl::StatusOr<KvDtype> ParseKvDtype(const std::string& s);

struct EngineOptions {
  // The model, the first that is set wins:
  //   source   where to read the weights (config inside): a CheckpointWeightSource
  //            (tp/checkpoint_reader.h; server/engine_factory.cc opens --model DIR once and
  //            passes it here) or any other WeightSource. Each rank reads only its slices.
  //   weights  explicit host weights (config inside; validated), read through an
  //            InMemoryWeightSource. The CUDA engine uploads them as bf16.
  //   config   a model configuration whose weights are generated from `seed` (the values of
  //            GenerateRandomWeights(*config, seed)): test shapes that are not presets.
  //   model    a preset name (PresetNames(): "tiny", "small", "kimi-k2-attn", "tiny-moe", and
  //            "kimi-k2" / "deepseek-v3" at the published sizes, too large to generate on the
  //            host; with `seed` and `preset_layers`) or else a checkpoint directory
  //            (config.json + *.safetensors),
  //            opened as a CheckpointWeightSource by the engine's Create.
  // Generated weights: the CPU engine makes them on the host (whole, float32) and shards them
  // through an InMemoryWeightSource; the CUDA engine makes each rank's slices on the device.
  std::shared_ptr<const WeightSource> source;
  std::shared_ptr<const ModelWeights> weights;
  std::shared_ptr<const ModelConfig> config;
  std::string model = "tiny";
  uint64_t seed = 0;          // preset / generated weights' seed
  int64_t preset_layers = 0;  // > 0 overrides the preset's layer count

  int tp = 1;  // tensor-parallel ranks (threads or GPUs); must divide num_attention_heads
  // Latent KV pool size in slots (per rank, all layers), < 2^31. The CUDA engine also takes
  // 0: cuda.kv_memory_fraction of the device memory left after weights and buffers.
  int64_t kv_slots = 16384;
  // Per step: requests (max_batch >= 1), rows per request (max_tail_rows in
  // [1, kernels::kMaxTailRows]) and committed + tail rows per request (max_context; 0 = the
  // config's max_position_embeddings, never above it).
  EngineLimits limits;
  int comm_timeout_ms = 60000;  // collective / stream wait before a rank is declared hung
  // Storage of the latent KV cache: kAuto, the backend's own (float32 on the CPU, bf16 on the
  // GPU), or kFp8 (kernels/kv_fp8.h: e4m3 c_kv with a float32 scale per 128 columns, bf16
  // k_pe; 656 bytes a token for DeepSeek-V3 against 1,152). The CPU backend rounds every latent
  // row it writes through the format (the reference of its accuracy); the CUDA backend stores
  // the format's bytes (656 a token) and attends over them (verify_attention/api.h; needs
  // kv_lora_rank % 4 == 0, Unimplemented at Create otherwise).
  KvDtype kv_dtype = KvDtype::kAuto;
  RankFaultHook fault_hook;  // optional fault injection (tests)

  struct Cpu {
    // > 0: a Step whose ranks have not all finished after this long fails (Unavailable,
    // engine failed); catches a hang with tp = 1 where no collective times out. 0 = no limit.
    int64_t step_timeout_ms = 0;
  } cpu;

  struct Cuda {
    // CUDA device of each rank; empty = 0 .. tp-1. One device listed for every rank (e.g.
    // {0, 0, 0, 0}): the ranks share that GPU through the loopback communicator (testing TP
    // on one GPU); distinct devices: NCCL.
    std::vector<int> devices;
    double kv_memory_fraction = 0.5;  // used when kv_slots = 0; in (0, 1)
    bool use_verify_kernel = true;    // false: always the fallback attention
    bool profile = false;             // time the step's parts with CUDA events (rank 0)
    // Weights stored in FP8 (128 x 128 blocks: routed experts, shared experts, dense MLP
    // layers, attention projections but kv_b) stay FP8 on sm_90 when the rank's slices are
    // 128-aligned (tp/cuda/rank_context.h ExpertPath, ChooseFp8Mlps, ChooseFp8Attention);
    // false: dequantized to bf16 (kv_b always is).
    bool fp8_experts = true;
    // The FP8 linears other than the routed experts (one-group GEMMs) run through cuBLASLt's
    // block-scaled FP8 GEMM when it has one for the GPU (kernels/cuda/fp8/fp8_gemm.h),
    // except in batch-invariant steps; false: always the grouped kernel.
    bool fp8_cublaslt = true;
    // Requests of a step whose slot lists begin with the same context slots (forked
    // sessions, a common system prompt) read that prefix once per pack of requests in the
    // verify attention (kernels/cuda/verify_attention/api.h "Shared prefixes"; not in
    // batch-invariant steps); false: every request reads its own keys.
    bool shared_prefix_attention = true;
    // tp > 1 and n_routed_experts % tp == 0: each rank holds E / tp whole routed experts
    // (expert parallelism; the MoE output still meets in the layer's one all-reduce) instead
    // of a 1 / tp slice of every expert. Measured faster from 64 rows per step (docs/PERF.md).
    bool expert_parallel = true;
    // false: the routed experts always take the per-expert cuBLAS path (one host sync per MoE
    // layer), as on GPUs without the grouped kernels (tests, comparisons).
    bool grouped_experts = true;
    // Batch-invariant steps (the default): a row's logits do not depend on what else shares
    // its step, and a draft-tree node gets the bits plain decoding gives its token, so
    // speculative output equals plain decoding bit for bit (GEMMs on cuBLASLt algorithms
    // checked bit-equal to one reference per shape, positional verify-attention plans, the
    // router kernel at every row count, rank-order TP sums). false: the batch-adaptive
    // kernels (forced verify kernels, shared-prefix packing, staged FP8 keys), exact only up
    // to float near-ties; its speed difference is measured in docs/PERF.md.
    bool batch_invariant = true;
    // With batch_invariant: positional plans whose context splits are shared by a request's
    // nodes (VerifyPlanOptions::positional_shared_context): the same bits as per-node plans'
    // guarantees, and 1.1-3.5x faster attention with 8 or 16 heads per rank (docs/PERF.md).
    bool shared_context_attention = true;
    // With batch_invariant: the split rule of positional plans (verify_attention/api.h
    // PositionalSplitKeys): a node with n visible keys runs in
    // min(ceil(n / positional_chunk_keys), positional_max_splits) splits. One rule per engine:
    // a row's splits then depend on its own key count alone.
    int positional_chunk_keys = 1024;
    int positional_max_splits = 32;
    // With batch_invariant: partial rows of the verify attention's workspace (2,052 bytes
    // each: 524,288 = 1 GiB per rank). A step whose splits need more runs in passes (slower
    // for batches of trees: docs/PERF.md).
    int64_t positional_partial_rows = int64_t{1} << 19;
    // The verify attention kernel (kernels/cuda/verify_attention/api.h VerifyKernelConfig):
    // kAuto lets the planner choose per step; the others force one configuration for tests and
    // benchmarks (a step the forced kernel cannot run fails with the planner's error: e.g.
    // kS64 off sm_90, kKm16 with a bf16 cache). Batch-invariant steps keep their positional
    // configuration.
    // The configurations and their names: kernels/cuda/verify_attention/config.h.
    using VerifyKernel = kernels::cuda::VerifyKernelConfig;
    VerifyKernel verify_config = VerifyKernel::kAuto;
    // FP8 latent cache on sm_90: keys of one step that the verify attention may dequantize
    // into a bf16 staging area per layer (VerifyKernelConfig::kS64Staged, for steps with many
    // rows per request: 1,156 bytes of device memory a key, allocated at Create; 262,144 keys
    // = 303 MB). 0: no staging area (those steps run the seesaw FP8 variant).
    int64_t fp8_staging_keys = 262144;
    // >= 0: run rank slice_rank of TP `tp` alone on one GPU (devices[0], default 0): that
    // rank's heads, experts, vocabulary and MLP slices, its collectives replaced by a stand-in
    // that keeps the data flowing and records the bytes each would move
    // (tp/cuda/recording_communicator.h). For measuring one GPU of a large model on one GPU:
    // its outputs are NOT the model's (the other ranks' shares are missing). -1: every rank.
    int slice_rank = -1;
  } cuda;
};

// The model an EngineOptions names, by the precedence above: its config (validated) and the
// source of its weights; null when they are generated from config + seed. `source` and a
// checkpoint are checked against ModelTensorSpecs (shapes, dtypes: no data is read), `weights`
// with ValidateModelWeights; a checkpoint directory is opened once, here. An unknown `model`
// (neither a preset nor a directory) is InvalidArgument naming it.
struct EngineModel {
  ModelConfig config;
  std::shared_ptr<const WeightSource> source;
};
absl::StatusOr<EngineModel> ResolveEngineModel(const EngineOptions& options);

}  // namespace verifyd::tp
