#include "server/session_manager.h"

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

}  // namespace

SessionManager::SessionManager(SlotAllocator* slots, int max_sessions, absl::Duration ttl)
    : slots_(slots), max_sessions_(max_sessions), ttl_(ttl) {}

absl::StatusOr<std::shared_ptr<Session>> SessionManager::Create(int64_t prompt_len,
                                                                std::vector<int32_t>* prompt_slots,
                                                                const std::string& owner) {
  absl::MutexLock lock(&mu_);
  if (static_cast<int>(table_.size()) >= max_sessions_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session table full (", max_sessions_, " sessions)"));
  }
  auto allocated = slots_->Allocate(prompt_len);
  if (!allocated.ok()) return allocated.status();
  *prompt_slots = std::move(*allocated);
  std::string id = NewSessionId();
  while (table_.contains(id)) id = NewSessionId();
  auto s = std::make_shared<Session>(id, owner);
  s->busy = true;
  s->last_used = absl::Now();
  table_[id] = s;
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
}

absl::StatusOr<std::shared_ptr<Session>> SessionManager::Acquire(const std::string& id,
                                                                 const std::string& owner) {
  absl::MutexLock lock(&mu_);
  auto it = table_.find(id);
  if (it == table_.end() || !it->second->ready || it->second->owner != owner) {
    return absl::NotFoundError("session not found (unknown, closed or expired)");
  }
  Session& s = *it->second;
  if (s.busy) return absl::FailedPreconditionError("session has a request in flight");
  s.busy = true;
  s.last_used = absl::Now();
  return it->second;
}

void SessionManager::Release(const std::shared_ptr<Session>& s) {
  absl::MutexLock lock(&mu_);
  s->busy = false;
  s->last_used = absl::Now();
  if (s->closed) FreeAllLocked(*s);
}

absl::Status SessionManager::Close(const std::string& id, const std::string& owner) {
  absl::MutexLock lock(&mu_);
  auto it = table_.find(id);
  if (it == table_.end() || !it->second->ready || it->second->owner != owner) {
    return absl::NotFoundError("session not found (unknown, closed or expired)");
  }
  std::shared_ptr<Session> s = std::move(it->second);
  table_.erase(it);
  s->closed = true;
  if (!s->busy) FreeAllLocked(*s);
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
