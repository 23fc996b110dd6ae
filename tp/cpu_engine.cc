// The CPU engine: rank threads, job hand-off, failure handling and acceptance.
#include "tp/cpu_engine.h"

#include <chrono>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/tree_accept.h"
#include "kernels/verify_attention.h"
#include "tp/presets.h"
#include "tp/sharding.h"

namespace verifyd::tp {

// ---- FaultInjector ------------------------------------------------------------------------

struct FaultInjector::State {
  std::mutex mu;
  std::condition_variable cv;
  int fail_rank = -1;  // guarded by mu
  int hang_rank = -1;  // guarded by mu
  int hang_limit_ms = 30000;
  bool released = false;  // guarded by mu
};

FaultInjector::FaultInjector() : state_(std::make_shared<State>()) {}

void FaultInjector::FailRankOnNextStep(int rank) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->fail_rank = rank;
}

void FaultInjector::HangRankOnNextStep(int rank, int hang_limit_ms) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->hang_rank = rank;
  state_->hang_limit_ms = hang_limit_ms;
  state_->released = false;
}

void FaultInjector::Release() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->released = true;
  state_->cv.notify_all();
}

RankFaultHook FaultInjector::Hook() const {
  std::shared_ptr<State> st = state_;
  return [st](int rank, int64_t step) -> absl::Status {
    std::unique_lock<std::mutex> lock(st->mu);
    if (st->fail_rank == rank) {
      st->fail_rank = -1;
      return absl::InternalError(absl::StrCat("injected failure of rank ", rank, " at step ", step));
    }
    if (st->hang_rank == rank) {
      st->hang_rank = -1;
      st->cv.wait_for(lock, std::chrono::milliseconds(st->hang_limit_ms),
                      [&] { return st->released; });
      return absl::UnavailableError(absl::StrCat("injected hang of rank ", rank, " at step ", step));
    }
    return absl::OkStatus();
  };
}

// ---- CpuEngine ----------------------------------------------------------------------------

struct CpuEngine::Rank {
  std::unique_ptr<RankForward> forward;
  // Outputs of the last job this rank finished (guarded by CpuEngine::mu_).
  uint64_t done_job = 0;
  absl::Status status;
  std::vector<int32_t> predictions;
  std::vector<float> logits;
  double seconds = 0;
};

namespace {

absl::StatusOr<std::shared_ptr<const ModelWeights>> ResolveWeights(const CpuEngineOptions& o) {
  if (o.weights) return o.weights;
  absl::StatusOr<ModelConfig> preset = PresetConfig(o.model, o.preset_layers);
  if (preset.ok()) {
    absl::StatusOr<ModelWeights> w = GenerateRandomWeights(*preset, o.seed);
    if (!w.ok()) return w.status();
    return std::make_shared<const ModelWeights>(std::move(*w));
  }
  if (preset.status().code() != absl::StatusCode::kNotFound) return preset.status();
  std::error_code ec;
  if (!std::filesystem::is_directory(o.model, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: '", o.model, "' is neither a preset (",
                     absl::StrJoin(PresetNames(), ", "), ") nor a checkpoint directory"));
  }
  absl::StatusOr<ModelWeights> w = LoadModelFromDirectory(o.model);
  if (!w.ok()) return w.status();
  return std::make_shared<const ModelWeights>(std::move(*w));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuEngine>> CpuEngine::Create(const CpuEngineOptions& o) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (o.tp < 1) return bad("tp: ", o.tp, " must be >= 1");
  if (o.kv_capacity < 1 || o.kv_capacity > INT32_MAX) {
    return bad("kv_capacity: ", o.kv_capacity, " must be in [1, 2^31)");
  }
  if (o.max_batch < 1) return bad("max_batch: ", o.max_batch, " must be >= 1");
  if (o.max_tail_rows < 1 || o.max_tail_rows > kernels::kMaxTailRows) {
    return bad("max_tail_rows: ", o.max_tail_rows, " must be in [1, ", kernels::kMaxTailRows, "]");
  }
  if (o.max_context < 0) return bad("max_context: ", o.max_context, " must be >= 0");
  if (o.comm_timeout_ms < 1) return bad("comm_timeout_ms: ", o.comm_timeout_ms, " must be >= 1");
  if (o.step_timeout_ms < 0) return bad("step_timeout_ms: ", o.step_timeout_ms, " must be >= 0");
  absl::StatusOr<std::shared_ptr<const ModelWeights>> weights = ResolveWeights(o);
  if (!weights.ok()) return weights.status();
  const ModelWeights& w = **weights;
  if (absl::Status s = ValidateModelWeights(w); !s.ok()) return s;
  if (absl::Status s = ValidateTpSize(w.config, o.tp); !s.ok()) return s;

  std::unique_ptr<CpuEngine> e(new CpuEngine());
  e->config_ = w.config;
  e->tp_ = o.tp;
  e->kv_capacity_ = o.kv_capacity;
  e->limits_.max_tail_rows = o.max_tail_rows;
  e->limits_.max_batch = o.max_batch;
  e->limits_.max_context = o.max_context == 0
                               ? w.config.max_position_embeddings
                               : std::min(o.max_context, w.config.max_position_embeddings);
  e->comm_timeout_ms_ = o.comm_timeout_ms;
  e->step_timeout_ms_ = o.step_timeout_ms;
  e->fault_hook_ = o.fault_hook;
  e->comms_ = CreateInProcessGroup(o.tp, o.comm_timeout_ms);
  for (int r = 0; r < o.tp; ++r) {
    absl::StatusOr<RankWeights> shard = ShardWeights(w, o.tp, r);
    if (!shard.ok()) return shard.status();
    auto rank = std::make_unique<Rank>();
    rank->forward = std::make_unique<RankForward>(w.config, std::move(*shard), e->comms_[r].get(),
                                                  o.kv_capacity);
    e->ranks_.push_back(std::move(rank));
  }
  for (int r = 0; r < o.tp; ++r) e->threads_.emplace_back(&CpuEngine::RankLoop, e.get(), r);
  return e;
}

CpuEngine::~CpuEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
    cv_.notify_all();
  }
  for (auto& c : comms_) c->Abort();  // frees ranks waiting in a collective
  for (std::thread& t : threads_) t.join();
}

void CpuEngine::RankLoop(int r) {
  uint64_t seen = 0;
  while (true) {
    std::shared_ptr<const BatchPlan> plan;
    bool want_logits = false;
    int64_t step = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return shutdown_ || job_id_ != seen; });
      if (shutdown_) return;
      seen = job_id_;
      plan = job_plan_;
      want_logits = job_logits_;
      step = step_index_;
    }
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status s;
    std::vector<int32_t> preds;
    std::vector<float> logits;
    if (fault_hook_) s = fault_hook_(r, step);
    if (s.ok() && failed_.load()) s = absl::UnavailableError("engine already failed");
    if (s.ok()) s = ranks_[r]->forward->Forward(*plan, &preds, want_logits ? &logits : nullptr);
    if (!s.ok()) comms_[r]->Abort();  // the other ranks stop waiting for this one
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard<std::mutex> lock(mu_);
    Rank& rk = *ranks_[r];
    rk.done_job = seen;
    rk.status = s;
    rk.predictions = std::move(preds);
    rk.logits = std::move(logits);
    rk.seconds = secs;
    if (!s.ok() && first_failed_rank_ < 0) first_failed_rank_ = r;
    cv_.notify_all();
  }
}

absl::StatusOr<std::vector<StepResult>> CpuEngine::Step(const std::vector<StepRequest>& batch,
                                                        StepTiming* timing) {
  return RunStep(batch, nullptr, timing);
}

absl::StatusOr<std::vector<StepResult>> CpuEngine::StepWithLogits(
    const std::vector<StepRequest>& batch, std::vector<float>* logits, StepTiming* timing) {
  if (logits == nullptr) return absl::InvalidArgumentError("StepWithLogits: logits is null");
  return RunStep(batch, logits, timing);
}

absl::StatusOr<std::vector<StepResult>> CpuEngine::RunStep(const std::vector<StepRequest>& batch,
                                                           std::vector<float>* logits,
                                                           StepTiming* timing) {
  std::lock_guard<std::mutex> step_lock(step_mu_);
  const auto t0 = std::chrono::steady_clock::now();
  if (failed_.load()) return absl::UnavailableError("cpu engine: a rank failed earlier");
  absl::StatusOr<BatchPlan> plan = BuildBatchPlan(batch, config_, limits_, kv_capacity_);
  if (!plan.ok()) return plan.status();
  if (plan->total_rows == 0) {
    if (logits) logits->clear();
    return std::vector<StepResult>{};
  }
  auto shared_plan = std::make_shared<const BatchPlan>(std::move(*plan));
  const BatchPlan& p = *shared_plan;

  std::unique_lock<std::mutex> lock(mu_);
  job_plan_ = shared_plan;
  job_logits_ = logits != nullptr;
  first_failed_rank_ = -1;
  const uint64_t id = ++job_id_;
  cv_.notify_all();
  auto all_done = [&] {
    for (const auto& r : ranks_) {
      if (r->done_job != id) return false;
    }
    return true;
  };
  auto any_failed = [&] {
    for (const auto& r : ranks_) {
      if (r->done_job == id && !r->status.ok()) return true;
    }
    return false;
  };
  if (step_timeout_ms_ > 0) {
    cv_.wait_until(lock, t0 + std::chrono::milliseconds(step_timeout_ms_),
                   [&] { return all_done() || any_failed(); });
  } else {
    cv_.wait(lock, [&] { return all_done() || any_failed(); });
  }
  if (!all_done()) {
    // A rank failed (or the step timed out): free the others from their collectives, give
    // them time to report.
    lock.unlock();
    for (auto& c : comms_) c->Abort();
    lock.lock();
    cv_.wait_for(lock, std::chrono::milliseconds(comm_timeout_ms_), all_done);
  }
  ++step_index_;
  // Collect: the rank that failed first names the error (the others then saw an aborted
  // group), else a rank that did not finish.
  std::string failure;
  if (first_failed_rank_ >= 0) {
    failure = absl::StrCat("rank ", first_failed_rank_, ": ",
                           ranks_[first_failed_rank_]->status.ToString());
  }
  for (int r = 0; r < tp_; ++r) {
    if (ranks_[r]->done_job != id) {
      absl::StrAppend(&failure, failure.empty() ? "" : "; ", "rank ", r, " did not finish (hung)");
    }
  }
  if (failure.empty()) {
    for (int r = 1; r < tp_; ++r) {
      if (ranks_[r]->predictions != ranks_[0]->predictions) {
        failure = absl::StrCat("rank ", r, " predictions differ from rank 0's");
        break;
      }
    }
  }
  if (!failure.empty()) {
    failed_.store(true);
    lock.unlock();
    for (auto& c : comms_) c->Abort();
    return absl::UnavailableError(absl::StrCat("cpu engine step failed: ", failure));
  }
  const std::vector<int32_t> preds = ranks_[0]->predictions;
  if (logits) *logits = std::move(ranks_[0]->logits);
  if (timing) {
    timing->per_rank_s.clear();
    for (const auto& r : ranks_) timing->per_rank_s.push_back(r->seconds);
  }
  lock.unlock();

  // Acceptance, once, from the predictions every rank agrees on.
  std::vector<StepResult> results(batch.size());
  for (size_t b = 0; b < batch.size(); ++b) {
    const int32_t row0 = p.q_indptr[b], n = p.q_indptr[b + 1] - row0;
    StepResult& res = results[b];
    res.predictions.assign(preds.begin() + row0, preds.begin() + row0 + n);
    if (!batch[b].accept) {
      // Prefill chunk: every row is committed; bonus = the prediction after the last row.
      res.bonus = res.predictions.back();
      res.kept_slots = batch[b].tail_slots;
      continue;
    }
    const int32_t indptr[2] = {0, n};
    std::vector<int32_t> accepted(n), kept(n), freed(n);
    int32_t num_accepted = 0, bonus = -1;
    kernels::TreeAcceptParams ap;
    ap.batch = 1;
    ap.row_indptr = indptr;
    ap.tokens = p.tokens.data() + row0;
    ap.parents = p.parents.data() + row0;
    ap.predictions = preds.data() + row0;
    ap.tail_slots = p.tail_slots.data() + row0;
    ap.accepted = accepted.data();
    ap.num_accepted = &num_accepted;
    ap.bonus = &bonus;
    ap.kept_slots = kept.data();
    ap.freed_slots = freed.data();
    if (absl::Status s = kernels::TreeAcceptReference(ap); !s.ok()) {
      return absl::InternalError(absl::StrCat("tree acceptance of batch[", b, "]: ", s.message()));
    }
    res.accepted_rows.assign(accepted.begin(), accepted.begin() + num_accepted);
    res.bonus = bonus;
    res.kept_slots.assign(kept.begin(), kept.begin() + 1 + num_accepted);
    res.freed_slots.assign(freed.begin(), freed.begin() + (n - 1 - num_accepted));
  }
  if (timing) {
    timing->total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return results;
}

std::vector<float> CpuEngine::LatentRow(int rank, int64_t layer, int32_t slot) const {
  const int64_t lat = config_.latent_dim();
  const float* base = ranks_.at(rank)->forward->kv_layer(layer) + int64_t{slot} * lat;
  return std::vector<float>(base, base + lat);
}

absl::StatusOr<std::unique_ptr<Engine>> CreateCpuEngine(const CpuEngineOptions& options) {
  absl::StatusOr<std::unique_ptr<CpuEngine>> e = CpuEngine::Create(options);
  if (!e.ok()) return e.status();
  return std::unique_ptr<Engine>(std::move(*e));
}

}  // namespace verifyd::tp
