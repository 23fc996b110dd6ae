// Scheduler: a bounded FIFO queue of jobs and one engine thread doing continuous batching.
//
// Handlers submit a job (a prefill or a Verify call's items) and wait only for their own
// job's completion. The engine thread repeatedly forms one batch: every prefill still in
// progress (one chunk of <= prefill_chunk rows each; prefill chunks must run in order, so a
// long prompt takes several steps, interleaved with everyone else's verify rounds) plus
// queued jobs in FIFO order while the batch has room (max_batch requests), runs one
// Engine::Step for all of them, applies the results (KV slots, pending token, token history,
// stored results for request ids) and completes the finished jobs.
//
// Prefills yield to the queue: when the job at the head of the queue does not fit, prefills
// in progress that ran in the previous step sit this step out (their offsets stay on their
// jobs), the most recently started first and only as many as the head job needs, if that
// makes it fit; then FIFO admission goes on. Otherwise (too few such prefills) the head
// waits and nothing sits out for it. A prefill never sits out two steps in a row, so each
// one advances at least every other step; queued jobs are still admitted strictly in FIFO
// order, and a batch never exceeds max_batch requests.
//
// Slot ownership: the caller allocates every slot a job uses (the prompt's slots, each
// item's tail slots) and keeps ownership on failure: a failed job changes no session and
// frees nothing. On success the scheduler moves kept slots into the session's context and
// frees the rest. Sessions in a job must be busy (SessionManager::Acquire / Create), so no
// session is in two steps at once.
//
// Engine failure (Engine::failed() after a failed Step): every queued and later job fails
// with Unavailable and `on_engine_failure` runs once (on the engine thread).
//
// Thread-safety: Submit-and-wait methods are safe from any thread; Start/Stop from one.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/metrics.h"
#include "server/session_manager.h"
#include "server/slot_allocator.h"
#include "tp/engine.h"

namespace verifyd::server {

// One Verify item prepared by the handler: the session (busy), its rows and tail slots.
struct VerifyWork {
  std::shared_ptr<Session> session;
  std::vector<int32_t> draft_tokens;   // [N] draft node tokens
  std::vector<int32_t> draft_parents;  // [N] -1 or j < i
  std::vector<int32_t> tail_slots;     // [N + 1] caller-allocated: pending row, then nodes
  std::string request_id;              // non-empty: the result is stored on the session
  uint64_t fingerprint = 0;            // of the item (StoredResult::fingerprint)
  // Filled on success.
  std::vector<int32_t> accepted_nodes;   // tree indices, root side first
  std::vector<int32_t> accepted_tokens;  // their tokens
  int32_t bonus = -1;                    // the new pending token
  int64_t committed_len = 0;             // after the round
  // With the session's top_logprobs: one per emitted token (accepted tokens, then the bonus).
  std::vector<tp::RowLogprobs> logprobs;
  // With the session's hidden layers: [1 + accepted][layers][hidden] float32, the old pending
  // token's row first, then the accepted nodes' (the tokens this round committed).
  std::vector<float> hidden;
  SessionCounters stats;  // the session's counters after the round
};

// What a prefill returns besides the next token (with the session's config).
struct PrefillOutputs {
  std::vector<tp::RowLogprobs> logprobs;  // top_logprobs: [1], for the next token
  std::vector<float> hidden;              // include_prompt: [prompt][layers][hidden] float32
};

struct JobTiming {
  double queue_s = 0;   // submit -> first engine step that included the job
  double engine_s = 0;  // sum of the engine steps that ran it
};

struct SchedulerOptions {
  int max_batch = 64;      // requests per Engine::Step (<= the engine's limit)
  int max_queue = 1024;    // queued jobs; more is ResourceExhausted
  int prefill_chunk = 32;  // rows per prefill request (<= the engine's max_tail_rows)
};

class Scheduler {
 public:
  Scheduler(tp::Engine* engine, SessionManager* sessions, SlotAllocator* slots, Metrics* metrics,
            SchedulerOptions options, std::function<void()> on_engine_failure);
  ~Scheduler();  // Stop()s

  void Start();
  // Drains: rejects new jobs (Unavailable), finishes queued and running ones, joins.
  void Stop();

  // Prefills `prompt` into `prompt_slots` ([prompt.size()], caller-owned) on top of the
  // session's context_slots (empty, or a prefix shared with another session). On success
  // appends prompt_slots to session->context_slots and the prompt and the returned next token
  // to session->history, and sets session->pending to that token.
  // `cancelled` (optional): as for Verify, and a prefill already running also stops at its
  // next chunk (Cancelled; the session is unchanged and the caller still owns the slots).
  // The session's config (sampling, logprobs, hidden states with include_prompt) applies;
  // `outputs` (optional) receives the logprobs and hidden states it asks for.
  absl::StatusOr<int32_t> Prefill(const std::shared_ptr<Session>& session,
                                  const std::vector<int32_t>& prompt,
                                  const std::vector<int32_t>& prompt_slots, JobTiming* timing,
                                  std::function<bool()> cancelled = nullptr,
                                  PrefillOutputs* outputs = nullptr);
  // Runs every item in one engine step (items.size() <= max_batch; distinct busy sessions).
  // `cancelled` (optional; the caller's deadline passed or it went away) is polled while the
  // job waits (every ~20 ms) and when it leaves the queue: the job is then dropped at once
  // with Cancelled, changing nothing and giving up its queue place. Once its step has started
  // the round is applied even if the caller is gone.
  absl::Status Verify(std::vector<VerifyWork>* items, JobTiming* timing,
                      std::function<bool()> cancelled = nullptr);

  int queue_depth() const;
  bool engine_failed() const;
  // How long the engine step now running has been running (zero when idle): a watchdog
  // declares the engine stalled when this grows past its limit.
  absl::Duration current_step_age() const;

 private:
  struct Job;
  absl::Status SubmitAndWait(Job* job);
  void Loop();
  // One engine step over `batch`, in steps: FormStepRequests, OrderBySharedPrefix, the step,
  // then FailStep or ApplyStepResults.
  void RunBatch(std::vector<Job*>& batch);
  void FormStepRequests(const std::vector<Job*>& batch, absl::Time start,
                        std::vector<tp::StepRequest>* reqs,
                        std::vector<std::pair<Job*, int>>* origin);
  // Lays the requests (and their origins) out in tp::SharedPrefixOrder: the engine layer owns
  // the order its attention planner packs shared prefixes in.
  static void OrderBySharedPrefix(std::vector<tp::StepRequest>* reqs,
                                  std::vector<std::pair<Job*, int>>* origin);
  void FailStep(const absl::Status& error, size_t requests, const std::vector<Job*>& batch,
                std::vector<Job*>* finished, std::vector<Job*>* still_active);
  void ApplyStepResults(const std::vector<tp::StepRequest>& reqs,
                        const std::vector<std::pair<Job*, int>>& origin,
                        const std::vector<tp::StepResult>& results, const std::vector<Job*>& batch,
                        std::vector<Job*>* finished, std::vector<Job*>* still_active);
  // Checks an engine result against its request and applies it to the item's session.
  absl::Status ApplyVerify(const tp::StepRequest& req, const tp::StepResult& res, VerifyWork& item);

  tp::Engine* const engine_;
  SessionManager* const sessions_;
  SlotAllocator* const slots_;
  Metrics* const metrics_;
  const SchedulerOptions options_;
  const std::function<void()> on_engine_failure_;

  mutable absl::Mutex mu_;
  std::deque<Job*> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
  std::atomic<int64_t> step_start_ns_{0};  // absl::GetCurrentTimeNanos() at step start; 0 idle
  std::vector<Job*> active_;               // engine thread only: prefills with chunks left
};

}  // namespace verifyd::server
