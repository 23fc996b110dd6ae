// The CPU engine: the MLA decoder on plain C++ reference ops, with tensor parallelism over N
// rank threads and the in-process communicator.
//
// Each rank thread owns its weight shard (tp/cpu_forward.h) and a full copy of the latent KV
// pool ([layers][kv_capacity][kv_lora + rope] float; every rank keeps the full latent cache,
// see DESIGN.md). Step() validates the batch on the caller's thread (InvalidArgument naming
// the field, before any KV is written), hands the plan to the rank threads, waits, checks that
// every rank produced the same predictions, and computes acceptance once
// (kernels::TreeAcceptReference).
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
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tp/communicator.h"
#include "tp/cpu_forward.h"
#include "tp/engine.h"
#include "tp/weights.h"

namespace verifyd::tp {

// Called by every rank thread at the start of each step, before its forward:
// hook(rank, step_index) (step_index counts Step calls that reached the ranks, from 0).
// A non-OK status makes that rank fail; a hook that blocks makes that rank hang.
using RankFaultHook = std::function<absl::Status(int rank, int64_t step_index)>;

struct CpuEngineOptions {
  // The model, the first that is set wins:
  //   weights         explicit weights (config inside; validated).
  //   model           a preset name ("tiny", "small", "kimi-k2-attn", with `seed` and
  //                   `preset_layers`) or else a checkpoint directory (config.json +
  //                   *.safetensors).
  std::shared_ptr<const ModelWeights> weights;
  std::string model = "tiny";
  uint64_t seed = 0;          // preset weights' seed
  int64_t preset_layers = 0;  // > 0 overrides the preset's layer count

  int tp = 1;                    // ranks (threads); must divide num_attention_heads
  int64_t kv_capacity = 16384;   // latent KV slots (per rank, all layers), >= 1
  int max_batch = 64;            // requests per Step
  int max_tail_rows = 65;        // rows per request per Step, 1..kernels::kMaxTailRows
  int64_t max_context = 0;       // committed + tail rows per request; 0 = the config's
                                 // max_position_embeddings (never above it)
  int comm_timeout_ms = 60000;   // collective wait before a rank is declared hung
  int64_t step_timeout_ms = 0;   // > 0: a Step whose ranks have not all finished after this
                                 // long fails (Unavailable, engine failed); catches a hang
                                 // with tp = 1 where no collective times out. 0 = no limit.
  RankFaultHook fault_hook;      // optional fault injection (tests, issue 6)
};

// Fault injection for tests: make rank k fail or hang at its next step. Hook() gives the
// RankFaultHook to put in CpuEngineOptions (it shares state with this object; safe to
// outlive it). A hung rank blocks until Release() (or hang_limit_ms, default 30 s): call
// Release() before destroying the engine, whose destructor joins the rank threads.
class FaultInjector {
 public:
  FaultInjector();
  void FailRankOnNextStep(int rank);
  void HangRankOnNextStep(int rank, int hang_limit_ms = 30000);
  void Release();
  RankFaultHook Hook() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

class CpuEngine final : public Engine {
 public:
  static absl::StatusOr<std::unique_ptr<CpuEngine>> Create(const CpuEngineOptions& options);
  ~CpuEngine() override;

  const ModelConfig& config() const override { return config_; }
  std::string backend() const override { return "cpu"; }
  int tp_size() const override { return tp_; }
  int64_t kv_capacity() const override { return kv_capacity_; }
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
  struct Rank;
  CpuEngine() = default;
  absl::StatusOr<std::vector<StepResult>> RunStep(const std::vector<StepRequest>& batch,
                                                  std::vector<float>* logits,
                                                  StepTiming* timing);
  void RankLoop(int r);

  ModelConfig config_;
  int tp_ = 1;
  int64_t kv_capacity_ = 0;
  EngineLimits limits_;
  int comm_timeout_ms_ = 60000;
  int64_t step_timeout_ms_ = 0;
  RankFaultHook fault_hook_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::vector<std::thread> threads_;
  std::atomic<bool> failed_{false};

  std::mutex step_mu_;  // serializes Step calls

  // Job hand-off between Step and the rank threads.
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t job_id_ = 0;                       // guarded by mu_
  bool shutdown_ = false;                     // guarded by mu_
  std::shared_ptr<const BatchPlan> job_plan_;  // guarded by mu_
  bool job_logits_ = false;                   // guarded by mu_
  int64_t step_index_ = 0;                    // guarded by mu_
  int first_failed_rank_ = -1;                // of the current job; guarded by mu_
};

// The Engine-typed factory (the server's entry point).
absl::StatusOr<std::unique_ptr<Engine>> CreateCpuEngine(const CpuEngineOptions& options);

}  // namespace verifyd::tp
