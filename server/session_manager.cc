#include "server/session_manager.h"

#include <algorithm>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace verifyd::server {
namespace {

// 128 random bits as hex: unguessable, so one client cannot address another's session.
std::string NewSessionId() {
  thread_local absl::BitGen gen;
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen), absl::Uniform<uint64_t>(gen));
}

absl::Status NotFound() {
  return absl::NotFoundError("session not found (unknown, closed or expired)");
}

constexpr absl::Duration kWaitPoll = absl::Milliseconds(20);

}  // namespace

const StoredResult* Session::FindResult(const std::string& request_id) const {
  if (request_id.empty()) return nullptr;
  for (const StoredResult& r : results) {
    if (r.request_id == request_id) return &r;
  }
  return nullptr;
}

void Session::StoreResult(StoredResult r) {
  results.push_back(std::move(r));
  while (results.size() > static_cast<size_t>(kStoredResultsPerSession)) results.pop_front();
}

SessionManager::SessionManager(SlotAllocator* slots, int max_sessions, absl::Duration ttl)
    : slots_(slots), max_sessions_(max_sessions), ttl_(ttl) {}

void SessionManager::SetObserver(std::function<void(int)> observer) {
  absl::MutexLock lock(&mu_);
  observer_ = std::move(observer);
  NotifyLocked();
}

void SessionManager::NotifyLocked() {
  if (observer_) observer_(static_cast<int>(table_.size()));
}

std::string SessionManager::NewIdLocked() const {
  std::string id = NewSessionId();
  while (table_.contains(id)) id = NewSessionId();
  return id;
}

absl::StatusOr<std::shared_ptr<Session>> SessionManager::Create(int64_t prompt_len,
                                                                std::vector<int32_t>* prompt_slots,
                                                                const std::string& owner,
                                                                const Session* prefix) {
  absl::MutexLock lock(&mu_);
  if (static_cast<int>(table_.size()) >= max_sessions_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session table full (", max_sessions_, " sessions)"));
  }
  auto allocated = slots_->Allocate(prompt_len);
  if (!allocated.ok()) return allocated.status();
  auto s = std::make_shared<Session>(NewIdLocked(), owner);
  if (prefix != nullptr) {
    if (absl::Status st = slots_->Share(prefix->context_slots); !st.ok()) {
      (void)slots_->Free(*allocated);
      return st;
    }
    s->context_slots = prefix->context_slots;
    s->history.assign(prefix->history.begin(),
                      prefix->history.begin() + static_cast<int64_t>(prefix->context_slots.size()));
  }
  *prompt_slots = std::move(*allocated);
  s->busy = true;
  s->last_used = absl::Now();
  table_[s->id] = s;
  NotifyLocked();
  return s;
}

void SessionManager::MarkReady(const std::shared_ptr<Session>& s) {
  absl::MutexLock lock(&mu_);
  s->ready = true;
}

void SessionManager::Discard(const std::shared_ptr<Session>& s,
                             const std::vector<int32_t>& extra_slots) {
  absl::MutexLock lock(&mu_);
  auto it = table_.find(s->id);
  if (it != table_.end() && it->second == s) table_.erase(it);
  if (!extra_slots.empty()) {
    if (auto st = slots_->Free(extra_slots); !st.ok()) spdlog::error("discard: {}", st.ToString());
  }
  FreeAllLocked(*s);
  s->closed = true;
  s->busy = false;
  NotifyLocked();
  released_.SignalAll();
}

absl::StatusOr<std::shared_ptr<Session>> SessionManager::Acquire(const std::string& id,
                                                                 const std::string& owner,
                                                                 const WaitBounds& bounds) {
  int failed = -1;
  auto all = AcquireAll({id}, owner, bounds, &failed);
  if (!all.ok()) return all.status();
  return std::move((*all)[0]);
}

absl::StatusOr<std::vector<std::shared_ptr<Session>>> SessionManager::AcquireAll(
    const std::vector<std::string>& ids, const std::string& owner, const WaitBounds& bounds,
    int* failed_index) {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Session>> out(ids.size());
  for (;;) {
    bool any_busy = false;
    for (size_t i = 0; i < ids.size(); ++i) {
      auto it = table_.find(ids[i]);
      if (it == table_.end() || !it->second->ready || it->second->owner != owner) {
        if (failed_index != nullptr) *failed_index = static_cast<int>(i);
        return NotFound();
      }
      out[i] = it->second;
      any_busy = any_busy || it->second->busy;
    }
    if (!any_busy) break;
    if (bounds.deadline == absl::InfinitePast()) {
      return absl::FailedPreconditionError("session has a request in flight");
    }
    const absl::Time now = absl::Now();
    if (now >= bounds.deadline) {
      return absl::DeadlineExceededError(
          "the session's request in flight did not finish before this call's deadline");
    }
    if (bounds.cancelled && bounds.cancelled()) {
      return absl::CancelledError("the call was cancelled while waiting for its session");
    }
    released_.WaitWithTimeout(&mu_, std::min(kWaitPoll, bounds.deadline - now));
  }
  const absl::Time now = absl::Now();
  for (auto& s : out) {
    s->busy = true;
    s->last_used = now;
  }
  return out;
}

void SessionManager::Release(const std::shared_ptr<Session>& s) {
  absl::MutexLock lock(&mu_);
  s->busy = false;
  s->last_used = absl::Now();
  if (s->closed) FreeAllLocked(*s);
  released_.SignalAll();
}

void SessionManager::Truncate(const std::shared_ptr<Session>& s, int64_t committed_len) {
  // The caller holds `s` busy: its fields are ours; only the allocator call needs a lock
  // (its own).
  Session& x = *s;
  std::vector<int32_t> beyond(x.context_slots.begin() + committed_len, x.context_slots.end());
  x.context_slots.resize(static_cast<size_t>(committed_len));
  x.pending = x.history[static_cast<size_t>(committed_len)];
  x.history.resize(static_cast<size_t>(committed_len) + 1);
  x.results.clear();  // they describe states that no longer exist
  if (auto st = slots_->Free(beyond); !st.ok()) {
    spdlog::error("session {}: truncate: {}", x.id, st.ToString());
  }
}

absl::StatusOr<std::shared_ptr<Session>> SessionManager::Fork(
    const std::shared_ptr<Session>& parent, const std::string& owner) {
  absl::MutexLock lock(&mu_);
  if (static_cast<int>(table_.size()) >= max_sessions_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session table full (", max_sessions_, " sessions)"));
  }
  if (absl::Status st = slots_->Share(parent->context_slots); !st.ok()) return st;
  auto s = std::make_shared<Session>(NewIdLocked(), owner);
  s->context_slots = parent->context_slots;
  s->history = parent->history;
  s->pending = parent->pending;
  s->config = parent->config;
  s->ready = true;
  s->last_used = absl::Now();
  table_[s->id] = s;
  NotifyLocked();
  return s;
}

absl::Status SessionManager::Close(const std::string& id, const std::string& owner) {
  absl::MutexLock lock(&mu_);
  auto it = table_.find(id);
  if (it == table_.end() || !it->second->ready || it->second->owner != owner) return NotFound();
  std::shared_ptr<Session> s = std::move(it->second);
  table_.erase(it);
  s->closed = true;
  if (!s->busy) FreeAllLocked(*s);
  NotifyLocked();
  released_.SignalAll();
  return absl::OkStatus();
}

int SessionManager::ExpireIdle(absl::Time now) {
  if (ttl_ <= absl::ZeroDuration()) return 0;
  absl::MutexLock lock(&mu_);
  std::vector<std::string> expired;
  for (auto& [id, s] : table_) {
    if (!s->busy && s->ready && now - s->last_used > ttl_) expired.push_back(id);
  }
  for (const auto& id : expired) {
    auto it = table_.find(id);
    it->second->closed = true;
    FreeAllLocked(*it->second);
    table_.erase(it);
  }
  if (!expired.empty()) {
    NotifyLocked();
    released_.SignalAll();
  }
  return static_cast<int>(expired.size());
}

int SessionManager::active() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(table_.size());
}

void SessionManager::FreeAllLocked(Session& s) {
  if (s.context_slots.empty()) return;
  if (auto st = slots_->Free(s.context_slots); !st.ok()) {
    spdlog::error("session {}: {}", s.id, st.ToString());
  }
  s.context_slots.clear();
}

}  // namespace verifyd::server
