#include "server/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "tp/step.h"

namespace verifyd::server {

struct Scheduler::Job {
  enum class Kind { kPrefill, kVerify };
  Kind kind = Kind::kVerify;
  // Prefill.
  std::shared_ptr<Session> session;
  const std::vector<int32_t>* prompt = nullptr;
  const std::vector<int32_t>* prompt_slots = nullptr;
  int64_t offset = 0;       // rows of the prompt already prefilled
  int32_t next_token = -1;  // prediction after the last prompt row
  bool sat_out = false;     // left out of the previous step (so it runs in this one)
  PrefillOutputs outputs;   // logprobs of the last chunk, hidden states of every chunk
  // Verify.
  std::vector<VerifyWork>* items = nullptr;
  std::function<bool()> cancelled;  // optional: the caller went away

  int requests() const { return kind == Kind::kVerify ? static_cast<int>(items->size()) : 1; }

  absl::Time enqueued;
  bool started = false;
  JobTiming timing;
  absl::Status status;
  absl::Notification done;
};

Scheduler::Scheduler(tp::Engine* engine, SessionManager* sessions, SlotAllocator* slots,
                     Metrics* metrics, SchedulerOptions options,
                     std::function<void()> on_engine_failure)
    : engine_(engine),
      sessions_(sessions),
      slots_(slots),
      metrics_(metrics),
      options_(options),
      on_engine_failure_(std::move(on_engine_failure)) {}

Scheduler::~Scheduler() { Stop(); }

void Scheduler::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void Scheduler::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

int Scheduler::queue_depth() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(queue_.size());
}

bool Scheduler::engine_failed() const {
  absl::MutexLock lock(&mu_);
  return failed_;
}

absl::Duration Scheduler::current_step_age() const {
  const int64_t start = step_start_ns_.load();
  if (start == 0) return absl::ZeroDuration();
  return absl::Nanoseconds(absl::GetCurrentTimeNanos() - start);
}

absl::StatusOr<int32_t> Scheduler::Prefill(const std::shared_ptr<Session>& session,
                                           const std::vector<int32_t>& prompt,
                                           const std::vector<int32_t>& prompt_slots,
                                           JobTiming* timing, std::function<bool()> cancelled,
                                           PrefillOutputs* outputs) {
  Job job;
  job.kind = Job::Kind::kPrefill;
  job.cancelled = std::move(cancelled);
  job.session = session;
  job.prompt = &prompt;
  job.prompt_slots = &prompt_slots;
  absl::Status st = SubmitAndWait(&job);
  if (timing) *timing = job.timing;
  if (!st.ok()) return st;
  if (outputs) *outputs = std::move(job.outputs);
  return job.next_token;
}

absl::Status Scheduler::Verify(std::vector<VerifyWork>* items, JobTiming* timing,
                               std::function<bool()> cancelled) {
  if (items->empty() || static_cast<int>(items->size()) > options_.max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("items: between 1 and ", options_.max_batch, " per call"));
  }
  Job job;
  job.kind = Job::Kind::kVerify;
  job.items = items;
  job.cancelled = std::move(cancelled);
  absl::Status st = SubmitAndWait(&job);
  if (timing) *timing = job.timing;
  return st;
}

absl::Status Scheduler::SubmitAndWait(Job* job) {
  {
    absl::MutexLock lock(&mu_);
    if (failed_) return absl::UnavailableError("engine failed");
    if (stopping_) return absl::UnavailableError("server is shutting down");
    if (static_cast<int>(queue_.size()) >= options_.max_queue) {
      return absl::ResourceExhaustedError(
          absl::StrCat("request queue full (", options_.max_queue, " waiting)"));
    }
    job->enqueued = absl::Now();
    queue_.push_back(job);
    metrics_->SetQueueDepth(static_cast<int64_t>(queue_.size()));
  }
  if (!job->cancelled) {
    job->done.WaitForNotification();
    return job->status;
  }
  // While the job waits in the queue, a caller that is gone (deadline, cancel, disconnect)
  // takes it out at once: nothing was done for it, and it holds no queue place meanwhile.
  while (!job->done.WaitForNotificationWithTimeout(absl::Milliseconds(20))) {
    if (!job->cancelled()) continue;
    absl::MutexLock lock(&mu_);
    auto it = std::find(queue_.begin(), queue_.end(), job);
    if (it != queue_.end()) {
      queue_.erase(it);
      metrics_->SetQueueDepth(static_cast<int64_t>(queue_.size()));
      return absl::CancelledError("the call was cancelled before it ran");
    }
    // Taken by the engine thread: its result (or a prefill's stop) comes soon.
  }
  return job->status;
}

void Scheduler::Loop() {
  for (;;) {
    std::vector<Job*> batch(active_.begin(), active_.end());
    int requests = static_cast<int>(active_.size());
    {
      absl::MutexLock lock(&mu_);
      if (active_.empty()) {
        auto ready = [this]()
                         ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !queue_.empty() || stopping_; };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty() && stopping_) return;
      }
      // FIFO admission while the batch has room; a job never splits across steps. When the
      // head does not fit, prefills that ran in the previous step sit this one out (the newest
      // first, only as many as the head needs) if that makes it fit; otherwise it waits.
      while (!queue_.empty()) {
        const int need = requests + queue_.front()->requests() - options_.max_batch;
        if (need > 0) {
          std::vector<Job*> pausable;
          for (auto it = batch.rbegin(); it != batch.rend(); ++it) {
            if ((*it)->kind == Job::Kind::kPrefill && (*it)->started && !(*it)->sat_out) {
              pausable.push_back(*it);
            }
          }
          if (static_cast<int>(pausable.size()) < need) break;
          for (int i = 0; i < need; ++i) {
            batch.erase(std::find(batch.begin(), batch.end(), pausable[i]));
          }
          requests -= need;
        }
        requests += queue_.front()->requests();
        batch.push_back(queue_.front());
        queue_.pop_front();
      }
      metrics_->SetQueueDepth(static_cast<int64_t>(queue_.size()));
    }
    for (Job* job : active_) {
      job->sat_out = std::find(batch.begin(), batch.end(), job) == batch.end();
    }
    // Drop jobs whose caller went away while they waited: nothing has changed for them yet.
    // A prefill in progress stops too (its session only takes the slots when it completes).
    std::vector<Job*> runnable;
    for (Job* job : batch) {
      const bool droppable = !job->started || job->kind == Job::Kind::kPrefill;
      if (droppable && job->cancelled && job->cancelled()) {
        active_.erase(std::remove(active_.begin(), active_.end(), job), active_.end());
        job->status = absl::CancelledError("the call was cancelled before it finished");
        job->done.Notify();
      } else {
        runnable.push_back(job);
      }
    }
    if (runnable.empty()) continue;
    RunBatch(runnable);
  }
}

// Requests that begin with the same context slot (forked sessions, a shared system prompt)
// side by side: the CUDA verify attention reads a prefix once for adjacent requests that share
// it (kernels/cuda/verify_attention/api.h "Shared prefixes"). A stable order by the first
// context slot; `origin` is permuted alike.
void Scheduler::OrderBySharedPrefix(std::vector<tp::StepRequest>* reqs_io,
                                    std::vector<std::pair<Job*, int>>* origin_io) {
  std::vector<tp::StepRequest>& reqs = *reqs_io;
  std::vector<std::pair<Job*, int>>& origin = *origin_io;
  std::vector<tp::StepRequest> sorted_reqs;
  std::vector<std::pair<Job*, int>> sorted_origin;
  sorted_reqs.reserve(reqs.size());
  sorted_origin.reserve(origin.size());
  for (size_t k : tp::SharedPrefixOrder(reqs)) {
    sorted_reqs.push_back(std::move(reqs[k]));
    sorted_origin.push_back(origin[k]);
  }
  reqs = std::move(sorted_reqs);
  origin = std::move(sorted_origin);
}

// One StepRequest per prefill chunk / verify item of `batch`, and where each came from (job,
// item index or -1 for a prefill). Verify items' context slots are moved into the requests
// (contexts reach 200k slots) and moved back right after the step (RunBatch).
void Scheduler::FormStepRequests(const std::vector<Job*>& batch, absl::Time start,
                                 std::vector<tp::StepRequest>* reqs_out,
                                 std::vector<std::pair<Job*, int>>* origin_out) {
  std::vector<tp::StepRequest>& reqs = *reqs_out;
  std::vector<std::pair<Job*, int>>& origin = *origin_out;
  for (Job* job : batch) {
    if (!job->started) {
      job->started = true;
      job->timing.queue_s = absl::ToDoubleSeconds(start - job->enqueued);
    }
    if (job->kind == Job::Kind::kPrefill) {
      const int64_t n = static_cast<int64_t>(job->prompt->size());
      const int64_t end = std::min<int64_t>(n, job->offset + options_.prefill_chunk);
      tp::StepRequest r;
      // Context: the session's prefix (shared slots of another session, or none), then the
      // prompt rows already prefilled.
      r.context_slots = job->session->context_slots;
      r.context_slots.insert(r.context_slots.end(), job->prompt_slots->begin(),
                             job->prompt_slots->begin() + job->offset);
      r.tokens.assign(job->prompt->begin() + job->offset, job->prompt->begin() + end);
      r.tail_slots.assign(job->prompt_slots->begin() + job->offset,
                          job->prompt_slots->begin() + end);
      for (int64_t t = 0; t < end - job->offset; ++t) r.parents.push_back(t - 1);
      r.accept = false;
      const SessionConfig& cfg = job->session->config;
      r.sampling = cfg.sampling;
      r.top_logprobs = cfg.top_logprobs;
      if (cfg.include_prompt) r.hidden_layers = cfg.hidden_layers;
      reqs.push_back(std::move(r));
      origin.emplace_back(job, -1);
    } else {
      for (size_t i = 0; i < job->items->size(); ++i) {
        VerifyWork& w = (*job->items)[i];
        tp::StepRequest r;
        // Moved, not copied (contexts reach 200k slots); moved back right after the step.
        r.context_slots = std::move(w.session->context_slots);
        // Rows: [pending, node 0 .. node N-1]; node i is row i + 1.
        r.tokens.push_back(w.session->pending);
        r.tokens.insert(r.tokens.end(), w.draft_tokens.begin(), w.draft_tokens.end());
        r.parents.push_back(-1);
        for (int32_t p : w.draft_parents) r.parents.push_back(p + 1);
        r.tail_slots = w.tail_slots;
        r.accept = true;
        const SessionConfig& cfg = w.session->config;
        r.sampling = cfg.sampling;
        r.top_logprobs = cfg.top_logprobs;
        r.hidden_layers = cfg.hidden_layers;
        reqs.push_back(std::move(r));
        origin.emplace_back(job, static_cast<int>(i));
      }
    }
  }
}

// A failed step: the batch's jobs fail (UNAVAILABLE when the engine failed, then every active
// and queued job too and the server is told), INTERNAL otherwise. Appends to *finished and
// may clear *still_active.
void Scheduler::FailStep(const absl::Status& error, size_t requests, const std::vector<Job*>& batch,
                         std::vector<Job*>* finished_io, std::vector<Job*>* still_active_io) {
  std::vector<Job*>& finished = *finished_io;
  std::vector<Job*>& still_active = *still_active_io;
  const bool failed = engine_->failed();
  spdlog::error("engine step failed (batch={} engine_failed={}): {}", requests, failed,
                error.ToString());
  const absl::Status job_status =
      failed ? absl::UnavailableError("engine failed")
             : absl::InternalError(absl::StrCat("engine step failed: ", error.message()));
  for (Job* job : batch) job->status = job_status;
  finished = batch;
  if (failed) {
    for (Job* job : still_active) job->status = job_status;
    finished.insert(finished.end(), still_active.begin(), still_active.end());
    still_active.clear();
    std::deque<Job*> rejected;
    {
      absl::MutexLock lock(&mu_);
      failed_ = true;
      rejected.swap(queue_);
      metrics_->SetQueueDepth(0);
    }
    for (Job* job : rejected) {
      job->status = absl::UnavailableError("engine failed");
      finished.push_back(job);
    }
    if (on_engine_failure_) on_engine_failure_();
  }
}

// A successful step: each request's result applied to its job (a prefill advances its offset
// and collects outputs; a verify item updates its session, ApplyVerify), then the jobs that
// are done appended to *finished, the prefills with rows left to *still_active.
void Scheduler::ApplyStepResults(const std::vector<tp::StepRequest>& reqs,
                                 const std::vector<std::pair<Job*, int>>& origin,
                                 const std::vector<tp::StepResult>& results,
                                 const std::vector<Job*>& batch, std::vector<Job*>* finished_io,
                                 std::vector<Job*>* still_active_io) {
  std::vector<Job*>& finished = *finished_io;
  std::vector<Job*>& still_active = *still_active_io;
  // Verify jobs: all items or none (a bad result for one item fails the call, but the
  // items already applied stay applied: their sessions moved forward consistently).
  for (size_t k = 0; k < reqs.size(); ++k) {
    auto [job, item] = origin[k];
    const tp::StepResult& res = results[k];
    if (job->kind == Job::Kind::kPrefill) {
      job->offset += static_cast<int64_t>(reqs[k].tokens.size());
      job->next_token = res.predictions.empty() ? -1 : res.predictions.back();
      if (res.predictions.size() != reqs[k].tokens.size()) {
        job->status = absl::InternalError("engine returned a wrong prediction count");
      }
      const size_t hidden_floats = reqs[k].tokens.size() * reqs[k].hidden_layers.size() *
                                   static_cast<size_t>(engine_->config().hidden_size);
      if (res.hidden.size() != hidden_floats ||
          res.logprobs.size() != (reqs[k].top_logprobs >= 0 ? 1u : 0u)) {
        job->status = absl::InternalError("engine returned wrong logprobs / hidden states");
      }
      job->outputs.logprobs = res.logprobs;
      job->outputs.hidden.insert(job->outputs.hidden.end(), res.hidden.begin(), res.hidden.end());
    } else if (job->status.ok()) {
      job->status = ApplyVerify(reqs[k], res, (*job->items)[item]);
    }
  }
  for (Job* job : batch) {
    if (job->kind == Job::Kind::kPrefill && job->status.ok() &&
        job->offset < static_cast<int64_t>(job->prompt->size())) {
      still_active.push_back(job);
      continue;
    }
    if (job->kind == Job::Kind::kPrefill && job->status.ok()) {
      Session& ps = *job->session;
      ps.context_slots.insert(ps.context_slots.end(), job->prompt_slots->begin(),
                              job->prompt_slots->end());
      ps.history.insert(ps.history.end(), job->prompt->begin(), job->prompt->end());
      ps.history.push_back(job->next_token);
      ps.pending = job->next_token;
    }
    finished.push_back(job);
  }
}

void Scheduler::RunBatch(std::vector<Job*>& batch) {
  const absl::Time start = absl::Now();
  std::vector<tp::StepRequest> reqs;
  std::vector<std::pair<Job*, int>> origin;  // (job, item index or -1 for a prefill)
  FormStepRequests(batch, start, &reqs, &origin);
  OrderBySharedPrefix(&reqs, &origin);

  tp::StepTiming timing;
  step_start_ns_.store(absl::ToUnixNanos(start));
  absl::StatusOr<std::vector<tp::StepResult>> results = engine_->Step(reqs, &timing);
  step_start_ns_.store(0);
  for (size_t k = 0; k < reqs.size(); ++k) {
    auto [job, item] = origin[k];
    if (job->kind == Job::Kind::kVerify) {
      (*job->items)[item].session->context_slots = std::move(reqs[k].context_slots);
    }
  }
  const double step_s = absl::ToDoubleSeconds(absl::Now() - start);
  metrics_->ObserveBatchSize(static_cast<int>(reqs.size()));
  metrics_->ObserveEngineStep(step_s, timing.per_rank_s);
  for (Job* job : batch) job->timing.engine_s += step_s;

  if (results.ok() && results->size() != reqs.size()) {
    results = absl::InternalError(absl::StrCat("engine returned ", results->size(), " results for ",
                                               reqs.size(), " requests"));
  }

  std::vector<Job*> finished;
  std::vector<Job*> still_active;
  // Prefills that sat this step out stay active (their offsets are unchanged).
  for (Job* job : active_) {
    if (std::find(batch.begin(), batch.end(), job) == batch.end()) still_active.push_back(job);
  }
  if (!results.ok()) {
    FailStep(results.status(), reqs.size(), batch, &finished, &still_active);
  } else {
    ApplyStepResults(reqs, origin, *results, batch, &finished, &still_active);
  }
  active_ = std::move(still_active);
  // The session and KV gauges follow every change where it happens (SessionManager and
  // SlotAllocator observers); only the rate is refreshed here.
  metrics_->UpdateTokensPerSecond(absl::Now());
  for (Job* job : finished) job->done.Notify();  // the handler may destroy the job now
}

absl::Status Scheduler::ApplyVerify(const tp::StepRequest& req, const tp::StepResult& res,
                                    VerifyWork& item) {
  const int n = static_cast<int>(req.tokens.size());
  // Check the engine's answer before touching the session: a structurally wrong result must
  // not corrupt the KV bookkeeping.
  const int64_t hid = engine_->config().hidden_size;
  const int64_t layers = static_cast<int64_t>(req.hidden_layers.size());
  if (static_cast<int>(res.predictions.size()) != n ||
      res.kept_slots.size() != res.accepted_rows.size() + 1 ||
      res.kept_slots.size() + res.freed_slots.size() != req.tail_slots.size() || res.bonus < 0 ||
      res.bonus >= engine_->config().vocab_size ||
      res.logprobs.size() != (req.top_logprobs >= 0 ? static_cast<size_t>(n) : 0u) ||
      static_cast<int64_t>(res.hidden.size()) !=
          static_cast<int64_t>(res.kept_slots.size()) * layers * hid) {
    return absl::InternalError("engine returned an inconsistent verify result");
  }
  int prev = 0;
  for (int32_t row : res.accepted_rows) {
    if (row < 1 || row >= n || req.parents[row] != prev) {
      return absl::InternalError("engine returned an accepted path that is not a tree path");
    }
    prev = row;
  }
  absl::flat_hash_set<int32_t> tail(req.tail_slots.begin(), req.tail_slots.end());
  for (int32_t s : res.kept_slots) {
    if (tail.erase(s) != 1) return absl::InternalError("engine kept a slot it was not given");
  }
  for (int32_t s : res.freed_slots) {
    if (tail.erase(s) != 1) return absl::InternalError("engine freed a slot it was not given");
  }

  Session& s = *item.session;
  s.context_slots.insert(s.context_slots.end(), res.kept_slots.begin(), res.kept_slots.end());
  if (absl::Status st = slots_->Free(res.freed_slots); !st.ok()) {
    spdlog::error("verify apply: {}", st.ToString());
  }
  s.pending = res.bonus;
  // History: it ended with the old pending token (now committed); then the accepted path's
  // tokens, then the new pending token.
  for (int32_t row : res.accepted_rows) s.history.push_back(req.tokens[row]);
  s.history.push_back(res.bonus);
  item.tail_slots.clear();  // now owned by the session or freed
  item.accepted_nodes.clear();
  item.accepted_tokens.clear();
  std::vector<int> depths(item.draft_parents.size());
  for (size_t i = 0; i < depths.size(); ++i) {
    depths[i] = item.draft_parents[i] < 0 ? 1 : depths[item.draft_parents[i]] + 1;
  }
  for (int32_t row : res.accepted_rows) {
    item.accepted_nodes.push_back(row - 1);
    item.accepted_tokens.push_back(req.tokens[row]);
  }
  item.bonus = res.bonus;
  item.committed_len = s.committed_len();
  // The path rows: the old pending token's row, then the accepted rows. Row j's prediction is
  // the token emitted after it, and its residual stream is the hidden state of its token.
  std::vector<int32_t> path = {0};
  path.insert(path.end(), res.accepted_rows.begin(), res.accepted_rows.end());
  item.logprobs.clear();
  if (req.top_logprobs >= 0) {
    for (int32_t row : path) item.logprobs.push_back(res.logprobs[row]);
  }
  // The engine returns the path rows' hidden states only (tp/engine.h), in this order.
  item.hidden = res.hidden;
  SessionCounters& c = s.counters;
  c.rounds += 1;
  c.draft_tokens += static_cast<int64_t>(item.draft_tokens.size());
  c.accepted_tokens += static_cast<int64_t>(res.accepted_rows.size());
  if (c.accepted_by_depth.size() < res.accepted_rows.size()) {
    c.accepted_by_depth.resize(res.accepted_rows.size(), 0);
  }
  for (size_t k = 0; k < res.accepted_rows.size(); ++k) c.accepted_by_depth[k] += 1;
  item.stats = c;
  if (!item.request_id.empty()) {
    s.StoreResult(StoredResult{item.request_id, item.fingerprint, item.accepted_nodes,
                               item.accepted_tokens, item.bonus, item.committed_len, item.logprobs,
                               item.stats});
  }
  metrics_->ObserveTree(depths, static_cast<int>(res.accepted_rows.size()),
                        s.config.sampling.sampled());
  return absl::OkStatus();
}

}  // namespace verifyd::server
