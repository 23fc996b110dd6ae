// Sessions: one sequence each, with its committed KV slots (positions 0..committed_len-1 in
// order) and its pending token (emitted, KV not yet computed).
//
// Ownership protocol: a session is *busy* while one request (prefill or verify) for it is in
// flight; Acquire() marks it busy and Release() clears it. While busy, the request's owner
// (the scheduler's engine thread) is the only code that reads or writes the session's
// context_slots / pending fields, so they need no lock; the busy flag, the table and the
// timestamps are guarded by the manager's mutex. A busy session is never expired; closing a
// busy session removes it from the table at once and frees its slots at Release().
//
// Client binding: a session may carry an owner (the client identity of server/security.h,
// "" when the API has no identities). Acquire/Close with a different owner answer exactly as
// for an unknown id (NotFound, same message), so one client cannot use, close, or even learn
// of another client's session.
//
// Thread-safety: all methods are safe from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/slot_allocator.h"

namespace verifyd::server {

struct Session {
  Session(std::string session_id, std::string owner_identity)
      : id(std::move(session_id)), owner(std::move(owner_identity)) {}
  const std::string id;
  const std::string owner;  // client identity that opened it ("" = none)
  // Owned by the in-flight request while busy (see the header comment).
  std::vector<int32_t> context_slots;  // [committed_len] KV slots, position order
  int32_t pending = -1;                // pending token (valid once prefilled)
  int64_t committed_len() const { return static_cast<int64_t>(context_slots.size()); }

 private:
  friend class SessionManager;
  bool busy = false;
  bool ready = false;   // prefill finished
  bool closed = false;  // removed from the table; free slots at Release()
  absl::Time last_used;
};

class SessionManager {
 public:
  // `ttl`: idle time after which a session (not busy) is expired; <= 0 disables expiry.
  SessionManager(SlotAllocator* slots, int max_sessions, absl::Duration ttl);

  // Creates a busy, not-yet-ready session and allocates `prompt_len` slots for its prefill
  // (returned in *prompt_slots, which the caller moves into context_slots once prefilled).
  // ResourceExhausted when the table or the KV pool is full.
  absl::StatusOr<std::shared_ptr<Session>> Create(int64_t prompt_len,
                                                  std::vector<int32_t>* prompt_slots,
                                                  const std::string& owner = "");
  // Prefill done: the session becomes ready (and stays busy until Release()).
  void MarkReady(const std::shared_ptr<Session>& s);
  // Removes a session whose prefill failed and frees `extra_slots` with its context slots.
  void Discard(const std::shared_ptr<Session>& s, const std::vector<int32_t>& extra_slots);

  // Marks a ready session busy for one request. NotFound (unknown, closed, expired, or
  // owned by another client), FailedPrecondition (another request for it is in flight).
  absl::StatusOr<std::shared_ptr<Session>> Acquire(const std::string& id,
                                                   const std::string& owner = "");
  // Ends the request: not busy, idle clock restarted; frees everything if it was closed.
  void Release(const std::shared_ptr<Session>& s);

  // NotFound for an unknown id (or one owned by another client).
  absl::Status Close(const std::string& id, const std::string& owner = "");
  // Expires idle sessions; returns how many.
  int ExpireIdle(absl::Time now);

  int active() const;

 private:
  void FreeAllLocked(Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  SlotAllocator* const slots_;
  const int max_sessions_;
  const absl::Duration ttl_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Session>> table_ ABSL_GUARDED_BY(mu_);
};

}  // namespace verifyd::server
