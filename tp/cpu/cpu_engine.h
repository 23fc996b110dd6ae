// The CPU engine: the MLA decoder on plain C++ reference ops, with tensor parallelism over N
// rank threads (tp/rank_group.h) and the in-process communicator.
//
// Each rank owns its weight shard (tp/cpu/cpu_forward.h) and a full copy of the latent KV
// pool ([layers][kv_slots][kv_lora + rope] float; every rank keeps the full latent cache,
// see DESIGN.md). Step() validates the batch on the caller's thread (tp/batch_plan.h:
// InvalidArgument naming the field, before any KV is written), runs the plan on the rank
// threads, waits, checks that every rank produced the same predictions, and computes
// acceptance once (kernels::TreeAcceptReference).
//
// Loading: the model comes through a WeightSource (EngineOptions' precedence,
// tp/engine_options.h): a checkpoint directory is mapped (tp/checkpoint_reader.h) and each
// rank's shard is read from it block by block (ShardWeights), the ranks one after another.
// Host memory while loading: the shards built so far (float32; what the engine keeps) plus one
// block of scratch; no whole-model copy, float32 or stored, is ever made (the mapping is page
// cache). Kept: every rank's shard, i.e. the sharded tensors once and the replicated ones
// (embeddings, q_a, kv_a, norms, routers) once per rank. Generated weights (presets, `config`)
// are made whole on the host first.
//
// Sampling, logprobs, hidden states (tp/engine.h): the rows that draw or give logprobs have
// their full-vocabulary logits all-gathered (every rank takes part; only those rows), and the
// draw (kernels/reference/sampling_ref.h) replaces the row's argmax before acceptance, so
// acceptance is coupled and a row's draw depends only on its logits, seed and position
// (batch-invariant). Hidden states are copied by rank 0 after each asked layer: the residual
// stream is replicated (it only changes by all-reduced sums), so nothing is gathered.
//
// Requests with accept = false (prefill chunks): accepted_rows empty, kept_slots = all
// tail_slots (every row is committed), freed_slots empty, bonus = predictions.back() (the
// target's token after the chunk: the pending token when it is the prompt's last chunk).
//
// Failure: a rank whose forward or fault hook fails aborts the communicator group; Step()
// answers Unavailable and the engine stays failed (failed() = true, every later Step is
// Unavailable). A rank that hangs makes the others' collectives time out after
// comm_timeout_ms (DeadlineExceeded → group aborted); Step() then waits at most
// comm_timeout_ms more for the hung rank and answers Unavailable.
//
// Thread-safety: Step/StepWithLogits from one thread at a time (serialized internally by a
// mutex); the accessors from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "tp/communicator.h"
#include "tp/cpu/cpu_forward.h"
#include "tp/engine.h"
#include "tp/engine_options.h"
#include "tp/rank_group.h"

namespace verifyd::tp {

class CpuEngine final : public Engine {
 public:
  // Reads every EngineOptions field but `cuda`; kv_slots must be >= 1.
  static absl::StatusOr<std::unique_ptr<CpuEngine>> Create(const EngineOptions& options);
  ~CpuEngine() override;

  const ModelConfig& config() const override { return config_; }
  std::string backend() const override { return "cpu"; }
  bool batch_invariant() const override { return true; }  // one fixed order per row
  std::string kv_cache_dtype() const override { return kv_fp8_ ? "fp8_e4m3" : "float32"; }
  int tp_size() const override { return tp_; }
  int64_t kv_slots() const override { return kv_slots_; }
  EngineLimits limits() const override { return limits_; }
  bool failed() const override { return failed_.load(); }

  absl::StatusOr<std::vector<StepResult>> Step(const std::vector<StepRequest>& batch,
                                               StepTiming* timing = nullptr) override;

  // Step, and the full logits of every row: logits [total_rows, vocab_size] row-major, rows
  // in batch order (gathered from all ranks' vocab shards). Debug / test API.
  absl::StatusOr<std::vector<StepResult>> StepWithLogits(const std::vector<StepRequest>& batch,
                                                         std::vector<float>* logits,
                                                         StepTiming* timing = nullptr);

  // Rank r's latent KV row of `slot` in `layer` ([kv_lora + rope] floats). Test API; call
  // between steps only.
  std::vector<float> LatentRow(int rank, int64_t layer, int32_t slot) const;

 private:
  CpuEngine() = default;
  absl::StatusOr<std::vector<StepResult>> RunStep(const std::vector<StepRequest>& batch,
                                                  std::vector<float>* logits, StepTiming* timing);
  void AbortComms();

  ModelConfig config_;
  int tp_ = 1;
  int64_t kv_slots_ = 0;
  bool kv_fp8_ = false;  // EngineOptions::kv_dtype == kFp8
  EngineLimits limits_;
  int comm_timeout_ms_ = 60000;
  int64_t step_timeout_ms_ = 0;
  RankFaultHook fault_hook_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<RankForward>> forwards_;  // forwards_[r] used by rank r only
  std::unique_ptr<RankGroup> group_;  // declared last: its threads stop before the rest dies
  std::atomic<bool> failed_{false};

  std::mutex step_mu_;  // serializes Step calls
  int64_t step_index_ ABSL_GUARDED_BY(step_mu_) = 0;
};

// The Engine-typed factory (the server's entry point).
absl::StatusOr<std::unique_ptr<Engine>> CreateCpuEngine(const EngineOptions& options);

}  // namespace verifyd::tp
