// The one options struct of the engines: what the server (server/engine_factory.h) fills from
// its flags and hands, unchanged, to the CPU engine (tp/cpu/cpu_engine.h) or through the CUDA
// engine module (server/cuda_engine_module.h) to the CUDA engine (tp/cuda/cuda_engine.h).
// Fields every backend reads come first; the knobs only one backend reads are grouped in
// `cpu` and `cuda`.
//
// Thread-safety: a plain value type.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tp/engine.h"
#include "tp/model_config.h"
#include "tp/rank_group.h"
#include "tp/weights.h"

namespace verifyd::tp {

struct EngineOptions {
  // The model, the first that is set wins:
  //   weights  explicit host weights (config inside; validated). The CUDA engine uploads
  //            them as bf16.
  //   config   a model configuration whose weights are generated from `seed` (the values of
  //            GenerateRandomWeights(*config, seed)): test shapes that are not presets.
  //   model    a preset name ("tiny", "small", "kimi-k2-attn"; with `seed` and
  //            `preset_layers`) or else a checkpoint directory (config.json + *.safetensors).
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
  RankFaultHook fault_hook;     // optional fault injection (tests)

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
  } cuda;
};

}  // namespace verifyd::tp
