// ToyEngine: a deterministic stand-in for tp::Engine, for fast server tests and for running
// verifyd without a model (`--backend toy`). Its "model": the state of a row is a hash of
// (state of the row it follows, its token, its position), so the prediction after a row
// depends exactly on the visible token path (the context plus the row's tree ancestors), like
// a real causal decoder. The state of each row is its "KV", stored in the slot the caller
// hands in; freed tail slots are poisoned.
//
// It checks what a server must get right and fails the step (InvalidArgument, pool untouched)
// otherwise: slots in range and distinct, every context slot written for exactly that
// position and chained to the previous context slot (so stale, freed or misordered slots are
// caught), parents topological, tokens < vocab, row and batch limits.
//
// Test hooks: pause/resume, a per-step delay, a one-shot injected step error, a permanent failure
// (then failed() is true and Step is Unavailable), the largest batch seen and the last batch's
// order.
//
// Thread-safety: Step() from one thread at a time (the Engine contract); hooks and accessors
// from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tp/engine.h"

namespace verifyd::server::testing {

struct ToyEngineOptions {
  int64_t vocab_size = 512;
  int64_t kv_slots = 4096;
  int max_batch = 64;
  int max_tail_rows = 65;
  int64_t max_context = 2048;
  int tp_size = 1;  // only reported (per-rank timings); there is one "rank"
  uint64_t seed = 1;
  // Only reported (Engine::batch_invariant): a row's toy state is a function of its own
  // path either way.
  bool batch_invariant = true;
};

class ToyEngine : public tp::Engine {
 public:
  explicit ToyEngine(ToyEngineOptions options);

  const tp::ModelConfig& config() const override { return config_; }
  std::string backend() const override { return "toy"; }
  bool batch_invariant() const override { return options_.batch_invariant; }
  std::string kv_cache_dtype() const override { return "none"; }
  int tp_size() const override { return options_.tp_size; }
  int64_t kv_slots() const override { return options_.kv_slots; }
  tp::EngineLimits limits() const override;
  absl::StatusOr<std::vector<tp::StepResult>> Step(const std::vector<tp::StepRequest>& batch,
                                                   tp::StepTiming* timing) override;
  bool failed() const override { return failed_.load(); }

  // Plain greedy decoding of the toy model (no engine state): the `n` tokens after `prompt`.
  static std::vector<int32_t> Greedy(const ToyEngineOptions& options,
                                     const std::vector<int32_t>& prompt, int n);

  void set_step_delay(absl::Duration d);
  void FailNextStep(absl::Status st);  // the next Step returns `st` (pool unchanged)
  void FailPermanently();              // the next Step fails and failed() becomes true
  // Pause(): later Steps block at their start until Resume() (deterministic queueing tests).
  void Pause();
  void Resume();
  int64_t steps_entered() const { return steps_entered_.load(); }
  int max_batch_seen() const { return max_batch_seen_.load(); }
  // The first context slot of each request of the last successful step, in batch order (-1:
  // no context), e.g. to check that requests sharing a prefix were batched side by side.
  std::vector<int32_t> last_first_context_slots() const;
  int64_t steps() const { return steps_.load(); }

 private:
  static uint64_t Mix(uint64_t state, int32_t token, int64_t position);
  int32_t Predict(uint64_t state) const;

  struct SlotState {
    bool written = false;
    int64_t position = -1;
    uint64_t prev = 0;  // state this row followed
    int32_t token = -1;
    uint64_t state = 0;  // Mix(prev, token, position)
  };

  const ToyEngineOptions options_;
  tp::ModelConfig config_;
  std::vector<SlotState> slots_;  // [kv_slots]; Step thread only
  std::atomic<bool> failed_{false};
  std::atomic<int> max_batch_seen_{0};
  std::atomic<int64_t> steps_{0};
  std::atomic<int64_t> steps_entered_{0};
  mutable absl::Mutex mu_;
  absl::Duration delay_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  std::optional<absl::Status> fail_next_ ABSL_GUARDED_BY(mu_);
  bool fail_permanently_ ABSL_GUARDED_BY(mu_) = false;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<int32_t> last_first_slots_ ABSL_GUARDED_BY(mu_);
};

}  // namespace verifyd::server::testing
