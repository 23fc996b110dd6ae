// The thread-per-rank machinery both engines share: N rank threads that run one job at a
// time on every rank, the wait for them with a deadline, and the failure / abort protocol.
//
// RankGroup::Run hands a job to every rank thread and waits until all finished, one failed,
// or the deadline passed. When not all finished it calls the caller's `abort` (which frees
// ranks blocked in a collective: Communicator::Abort on every rank) and waits `grace` more for
// the rest. The outcome names the rank that failed first (in time) with its status, then the
// ranks that did not finish (hung): e.g. "rank 1: INTERNAL: x; rank 0 did not finish (hung)".
// A rank that is still running after Run returned keeps its copy of the job (capture what it
// reads by value or shared_ptr), so it never touches freed state.
//
// Also here: RankFaultHook, the fault-injection hook the engines call at the start of each
// step on every rank, and FaultInjector, a RankFaultHook for tests.
//
// Thread-safety: Run and Stop from one thread at a time (the engine's step thread); the job
// runs on the rank threads concurrently, one call per rank. The members under mu_ are
// ABSL_GUARDED_BY it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"

namespace verifyd::tp {

// Called by every rank thread at the start of each step, before its forward:
// hook(rank, step_index) (step_index counts Step calls that reached the ranks, from 0).
// A non-OK status makes that rank fail; a hook that blocks makes that rank hang.
using RankFaultHook = std::function<absl::Status(int rank, int64_t step_index)>;

class RankGroup {
 public:
  using Clock = std::chrono::steady_clock;
  // One rank's part of a job (runs on that rank's thread).
  using Job = std::function<absl::Status(int rank)>;

  // on_thread_start(r) runs first on rank r's thread (e.g. cudaSetDevice), on_thread_exit(r)
  // last, after Stop (e.g. freeing the rank's device state on its own thread). Both optional.
  RankGroup(int ranks, std::function<void(int)> on_thread_start = nullptr,
            std::function<void(int)> on_thread_exit = nullptr);
  ~RankGroup();  // Stop()
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

  int size() const { return static_cast<int>(threads_.size()); }

  struct Outcome {
    // OK when every rank finished with OK; else the status of the rank that failed first, or
    // Unavailable (the `failure` text) when no rank failed but some did not finish.
    absl::Status status;
    std::string failure;          // "" when OK; else as described above
    std::vector<double> seconds;  // wall time of each rank's job (valid when OK)
  };

  // Runs job(r) on every rank r and waits for it (see the top of the file). deadline: none =
  // wait until every rank finished or one failed.
  Outcome Run(Job job, std::optional<Clock::time_point> deadline, std::chrono::milliseconds grace,
              const std::function<void()>& abort);

  // Called by a rank's job that failed and is about to abort the group's collectives itself
  // (before the job returns): makes that rank the one the outcome names, even if a rank that
  // then sees the aborted collective finishes first. Thread-safe.
  void ClaimFailure(int rank);

  // Tells the rank threads to exit after their current job and joins them (a rank blocked in
  // a job is waited for: abort its collectives first). Idempotent.
  void Stop();

 private:
  struct RankState {
    uint64_t done_job = 0;
    absl::Status status;
    double seconds = 0;
  };
  void Loop(int r);

  std::function<void(int)> on_thread_start_, on_thread_exit_;
  std::vector<std::thread> threads_;

  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t job_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  Job job_ ABSL_GUARDED_BY(mu_);
  std::vector<RankState> ranks_ ABSL_GUARDED_BY(mu_);
  int first_failed_rank_ ABSL_GUARDED_BY(mu_) = -1;  // of the current job
};

// Fault injection for tests: make rank k fail or hang at its next step. Hook() gives the
// RankFaultHook to put in EngineOptions::fault_hook (it shares state with this object; safe
// to outlive it). A hung rank blocks until Release() (or hang_limit_ms, default 30 s): call
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

}  // namespace verifyd::tp
