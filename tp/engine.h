// The engine: runs the target model's forward over a batch of tail rows on all tensor-
// parallel ranks, and decides greedy acceptance once for all of them.
//
// The engine owns the model weights and the latent KV pool memory (kv_slots() slots of
// latent_dim values per layer); it does NOT own slot allocation: the caller (server/
// sessions and the KV slot allocator) hands in the slots of every request's context and of
// its new tail rows. Protobuf types never reach here.
//
// Backends: CPU (tp/cpu/cpu_engine.h, plain C++ ranks as threads with an in-process
// communicator) and CUDA (tp/cuda/cuda_engine.h, one thread and one NCCL communicator per
// GPU). Both are built from tp::EngineOptions (tp/engine_options.h) and run their ranks on a
// tp::RankGroup (tp/rank_group.h).
//
// Per request, besides the greedy predictions (all optional; a request that asks for none of
// them costs nothing extra):
//   sampling      temperature / top-k / top-p / seed (kernels/sampling.h has the definition):
//                 a sampled row's prediction is the draw for position positions[t] + 1, so
//                 acceptance ("a node is accepted iff its token equals the prediction after its
//                 parent") becomes coupled sampled verification. Greedy (temperature 0) rows
//                 are the argmax, bit for bit as without sampling.
//   top_logprobs  >= 0: the logprob of each row's prediction and the best top_logprobs tokens
//                 (log-softmax of logits / temperature, before top-k / top-p).
//   hidden_layers the residual stream after each listed decoder layer (0-based; transformers'
//                 hidden_states[l + 1]) for every row, float32.
// For a prefill chunk (accept = false) only the last row is sampled and gets logprobs (its
// prediction is the pending token when the chunk is the prompt's last); the other rows'
// predictions stay greedy, and hidden states cover every row. For a verify tree (accept =
// true) every row is sampled and gets logprobs, and hidden states cover the rows it commits
// only (the root, then the accepted rows in path order: what the caller returns), which keeps
// a large tree's step from moving every row's states to the host.
//
// Thread-safety: Step() may be called from one thread at a time (the scheduler's engine
// loop); the accessors are safe from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/sampling.h"
#include "tp/model_config.h"

namespace verifyd::tp {

// One request in a step: a tree of tail rows on top of a committed context.
//   rows:      tokens[t], t = 0..n-1; row 0 is the root (the pending token, or the first
//              token of a prefill chunk).
//   parents:   parents[0] = -1; parents[t] in [0, t) for t >= 1. A prefill chunk is a chain
//              (parents[t] = t - 1); a verify tree is the pending token plus the draft nodes
//              (draft node i is row i + 1; a node whose parent is -1 hangs off row 0).
//   positions: committed_len + depth(t), depth(0) = 0.
//   visible:   the whole context + the row's ancestors + itself.
struct StepRequest {
  std::vector<int32_t> context_slots;  // committed_len slots, positions 0.. in order
  std::vector<int32_t> tokens;         // [n] (1 <= n <= max_tail_rows)
  std::vector<int32_t> parents;        // [n]
  std::vector<int32_t> tail_slots;     // [n] fresh slots; the engine writes each row's KV
  bool accept = true;                  // false for prefill chunks: predictions only
  // Optional outputs (see the top of the file). Validated with the batch: top_logprobs in
  // [-1, kernels::kMaxTopLogprobs], hidden layers distinct and in [0, num_hidden_layers),
  // temperature finite and >= 0, top_p in (0, 1], top_k >= 0.
  kernels::SamplingParams sampling;    // default: greedy
  int top_logprobs = -1;               // -1: no logprobs
  std::vector<int32_t> hidden_layers;  // empty: no hidden states
};

// The logprobs of one row's prediction (StepRequest::top_logprobs).
struct RowLogprobs {
  int32_t token = -1;  // the row's prediction
  float logprob = 0;
  std::vector<int32_t> top_tokens;  // best first, lower id on ties
  std::vector<float> top_logprobs;
};

struct StepResult {
  std::vector<int32_t> predictions;    // [n] target token after each row (greedy or drawn)
  std::vector<int32_t> accepted_rows;  // accepted local rows >= 1, root side first
  int32_t bonus = -1;                  // target token after the last accepted row
  std::vector<int32_t> kept_slots;     // root slot then accepted rows' slots (path order)
  std::vector<int32_t> freed_slots;    // the other tail slots
  // top_logprobs >= 0: [n] one per row (accept = true), or [1] the last row's (prefill chunk).
  std::vector<RowLogprobs> logprobs;
  // hidden_layers non-empty: [rows][hidden_layers.size()][hidden_size], layers in the order
  // asked; rows = every row in request order (accept = false), or the committed rows: the
  // root then accepted_rows (accept = true).
  std::vector<float> hidden;
};

// Optional timing of the last step, for metrics (seconds).
struct StepTiming {
  double total_s = 0;
  std::vector<double> per_rank_s;  // forward time of each rank
};

struct EngineLimits {
  int max_tail_rows = 65;   // rows per request per step (64 draft nodes + pending)
  int max_batch = 64;       // requests per step
  int64_t max_context = 0;  // committed + tail positions per request (config's limit)
};

// One GPU's memory as the engine laid it out (GetInfoResponse.memory): the planned parts
// (tp/memory_plan.h) beside what the device reported. The CUDA engine fills it for its first
// rank; engines without device memory leave it zero (device_bytes == 0).
struct EngineMemory {
  int64_t device_bytes = 0;             // the device's total memory (cudaMemGetInfo)
  int64_t weight_bytes = 0;             // the rank's weight shard, planned
  int64_t workspace_bytes = 0;          // activations and workspaces, planned
  int64_t kv_cache_bytes = 0;           // the latent KV pool as allocated (all layers)
  int64_t kv_bytes_per_token = 0;       // every layer's latent row of one token
  int64_t kv_tokens = 0;                // slots in the pool (= kv_slots())
  int64_t used_before_kv_bytes = 0;     // measured: device memory in use once weights and
                                        // buffers were allocated, before the KV pool
  int64_t planned_before_kv_bytes = 0;  // weight_bytes + workspace_bytes (no reserve)
};

class Engine {
 public:
  virtual ~Engine() = default;

  virtual const ModelConfig& config() const = 0;
  virtual std::string backend() const = 0;  // "cpu" or "cuda"
  virtual int tp_size() const = 0;
  virtual int64_t kv_slots() const = 0;  // slots in the latent KV pool
  virtual EngineLimits limits() const = 0;
  // True when a row's results do not depend on what else shares its step, so that a draft-tree
  // node gets exactly what plain decoding gives (the CPU backend always; the CUDA backend with
  // EngineOptions::cuda.batch_invariant).
  virtual bool batch_invariant() const = 0;
  // How the latent KV cache stores a token (GetInfoResponse.kv_cache_dtype): "float32",
  // "bfloat16" or "fp8_e4m3" (EngineOptions::kv_dtype).
  virtual std::string kv_cache_dtype() const = 0;

  // Runs the forward on every rank: writes the tail rows' latent KV into their tail slots,
  // computes the greedy prediction after every row and, for requests with accept = true,
  // the acceptance and the kept/freed split of the tail slots. Invalid input (slot out of
  // range, bad parents, too many rows) is InvalidArgument and leaves the pool unchanged for
  // every context slot. A failed rank makes this and every later call Unavailable.
  virtual absl::StatusOr<std::vector<StepResult>> Step(const std::vector<StepRequest>& batch,
                                                       StepTiming* timing = nullptr) = 0;

  // True once a rank failed (the server reports NOT_SERVING and exits non-zero).
  virtual bool failed() const = 0;

  // The device memory of the first rank (EngineMemory); zeros for engines without a GPU.
  virtual EngineMemory memory() const { return {}; }
};

}  // namespace verifyd::tp
