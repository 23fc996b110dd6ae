// RankGroup and FaultInjector (see rank_group.h).
#include "tp/rank_group.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace verifyd::tp {

// ---- RankGroup ----------------------------------------------------------------------------

RankGroup::RankGroup(int ranks, std::function<void(int)> on_thread_start,
                     std::function<void(int)> on_thread_exit)
    : on_thread_start_(std::move(on_thread_start)), on_thread_exit_(std::move(on_thread_exit)) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ranks_.resize(ranks);
  }
  for (int r = 0; r < ranks; ++r) threads_.emplace_back(&RankGroup::Loop, this, r);
}

RankGroup::~RankGroup() { Stop(); }

void RankGroup::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void RankGroup::Loop(int r) {
  if (on_thread_start_) on_thread_start_(r);
  uint64_t seen = 0;
  for (;;) {
    Job fn;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return shutdown_ || job_id_ != seen; });
      if (shutdown_) break;
      seen = job_id_;
      fn = job_;
    }
    const auto t0 = Clock::now();
    absl::Status st = fn(r);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    {
      std::lock_guard<std::mutex> lock(mu_);
      RankState& rs = ranks_[r];
      if (!st.ok() && first_failed_rank_ < 0 && seen == job_id_) first_failed_rank_ = r;
      rs.status = std::move(st);
      rs.seconds = secs;
      rs.done_job = seen;
    }
    cv_.notify_all();
  }
  if (on_thread_exit_) on_thread_exit_(r);
}

void RankGroup::ClaimFailure(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  if (first_failed_rank_ < 0) first_failed_rank_ = rank;
}

RankGroup::Outcome RankGroup::Run(Job job, std::optional<Clock::time_point> deadline,
                                  std::chrono::milliseconds grace,
                                  const std::function<void()>& abort) {
  std::unique_lock<std::mutex> lock(mu_);
  job_ = std::move(job);
  first_failed_rank_ = -1;
  const uint64_t id = ++job_id_;
  cv_.notify_all();
  auto all_done = [&] {
    for (const RankState& r : ranks_) {
      if (r.done_job != id) return false;
    }
    return true;
  };
  auto any_failed = [&] {
    for (const RankState& r : ranks_) {
      if (r.done_job == id && !r.status.ok()) return true;
    }
    return false;
  };
  if (deadline.has_value()) {
    cv_.wait_until(lock, *deadline, [&] { return all_done() || any_failed(); });
  } else {
    cv_.wait(lock, [&] { return all_done() || any_failed(); });
  }
  if (!all_done()) {
    // A rank failed (or the deadline passed): free the others from their collectives, give
    // them time to report.
    lock.unlock();
    if (abort) abort();
    lock.lock();
    cv_.wait_for(lock, grace, all_done);
  }
  // The rank that failed first names the error (the others then saw an aborted group), then
  // the ranks that did not finish.
  Outcome out;
  if (first_failed_rank_ >= 0) {
    out.status = ranks_[first_failed_rank_].status;
    out.failure = absl::StrCat("rank ", first_failed_rank_, ": ", out.status.ToString());
  }
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (ranks_[r].done_job != id) {
      absl::StrAppend(&out.failure, out.failure.empty() ? "" : "; ", "rank ", r,
                      " did not finish (hung)");
    }
  }
  if (out.status.ok() && !out.failure.empty()) out.status = absl::UnavailableError(out.failure);
  for (const RankState& r : ranks_) out.seconds.push_back(r.seconds);
  return out;
}

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
      return absl::InternalError(
          absl::StrCat("injected failure of rank ", rank, " at step ", step));
    }
    if (st->hang_rank == rank) {
      st->hang_rank = -1;
      st->cv.wait_for(lock, std::chrono::milliseconds(st->hang_limit_ms),
                      [&] { return st->released; });
      return absl::UnavailableError(
          absl::StrCat("injected hang of rank ", rank, " at step ", step));
    }
    return absl::OkStatus();
  };
}

}  // namespace verifyd::tp
