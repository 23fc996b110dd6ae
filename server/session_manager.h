// Sessions: one sequence each, with its committed KV slots (positions 0..committed_len-1 in
// order), its pending token (emitted, KV not yet computed), its token history (the committed
// tokens then the pending token: what TruncateSession rolls back to) and the results of its
// last few Verify items that carried a request id (what a retry gets back).
//
// Ownership protocol: a session is *busy* while one request (prefill, verify, truncate, fork)
// for it is in flight; Acquire() marks it busy and Release() clears it. While busy, the
// request's owner (a handler, or the scheduler's engine thread during a step) is the only code
// that reads or writes the session's context_slots / history / pending / results fields, so
// they need no lock; the busy flag, the table and the timestamps are guarded by the manager's
// mutex. A busy session is never expired; closing a busy session removes it from the table at
// once and frees its slots at Release(). Acquire() on a busy session waits for it (bounded by
// the caller's deadline and cancellation), so a call abandoned by its client never makes the
// next call fail.
//
// Shared slots: Fork() and Create() with a prefix give the new session references to the
// other session's committed slots (SlotAllocator reference counts); a session only ever
// writes slots it allocated itself (tail slots), and freeing drops its references, so a slot
// returns to the pool when the last session holding it lets go.
//
// Client binding: a session may carry an owner (the client identity of server/security.h,
// "" when the API has no identities). Acquire/Close with a different owner answer exactly as
// for an unknown id (NotFound, same message), so one client cannot use, close, fork, or even
// learn of another client's session.
//
// Thread-safety: all methods are safe from any thread; the observer (the active-sessions
// gauge) runs under the manager's mutex.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/sampling.h"
#include "server/slot_allocator.h"
#include "tp/engine.h"

namespace verifyd::server {

// Verify results remembered per session for retries (VerifyItem.request_id).
inline constexpr int kStoredResultsPerSession = 8;
inline constexpr int kMaxRequestIdBytes = 128;

// What a session returns besides tokens and how it draws them, fixed at OpenSession (forks
// inherit it).
struct SessionConfig {
  kernels::SamplingParams sampling;    // default: greedy
  int top_logprobs = -1;               // -1: no logprobs
  std::vector<int32_t> hidden_layers;  // empty: no hidden states
  bool hidden_fp32 = false;            // else bf16
  bool include_prompt = false;         // the prompt's hidden states at OpenSession
};

// A session's counters (VerifyResult.stats).
struct SessionCounters {
  int64_t rounds = 0;
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;
  std::vector<int64_t> accepted_by_depth;  // [d]: accepted nodes at depth d + 1
};

// The result of one applied Verify item, kept for a retry with the same request id (hidden
// states are not kept).
struct StoredResult {
  std::string request_id;
  uint64_t fingerprint = 0;  // of the item's draft tree (service.cc ItemFingerprint)
  std::vector<int32_t> accepted_nodes;
  std::vector<int32_t> accepted_tokens;
  int32_t bonus_token = -1;
  int64_t committed_len = 0;
  std::vector<tp::RowLogprobs> logprobs;  // with top_logprobs: one per emitted token
  SessionCounters stats;                  // the session's counters after that round
};

struct Session {
  Session(std::string session_id, std::string owner_identity)
      : id(std::move(session_id)), owner(std::move(owner_identity)) {}
  const std::string id;
  const std::string owner;  // client identity that opened it ("" = none)
  // Owned by the in-flight request while busy (see the header comment).
  std::vector<int32_t> context_slots;  // [committed_len] KV slots, position order
  std::vector<int32_t> history;        // [committed_len + 1] committed tokens, then pending
  int32_t pending = -1;                // pending token (valid once prefilled)
  std::deque<StoredResult> results;    // last kStoredResultsPerSession, oldest first
  SessionConfig config;                // set before the prefill, then read-only (forks copy it)
  SessionCounters counters;            // updated by every applied Verify item
  int64_t committed_len() const { return static_cast<int64_t>(context_slots.size()); }
  // The stored result for `request_id` (non-empty), or null.
  const StoredResult* FindResult(const std::string& request_id) const;
  // Remembers a result, dropping the oldest beyond kStoredResultsPerSession.
  void StoreResult(StoredResult r);

 private:
  friend class SessionManager;
  bool busy = false;
  bool ready = false;   // prefill finished
  bool closed = false;  // removed from the table; free slots at Release()
  absl::Time last_used;
};

// How long Acquire may wait for a session that has another request in flight.
struct WaitBounds {
  // InfinitePast (the default): do not wait (FailedPrecondition at once); otherwise wait until
  // this time (then DeadlineExceeded).
  absl::Time deadline = absl::InfinitePast();
  std::function<bool()> cancelled;  // optional: polled every ~20 ms; true -> Cancelled
};

class SessionManager {
 public:
  // `ttl`: idle time after which a session (not busy) is expired; <= 0 disables expiry.
  SessionManager(SlotAllocator* slots, int max_sessions, absl::Duration ttl);

  // Called with the number of open sessions now and after every change (set once, before
  // use; runs under the manager's mutex).
  void SetObserver(std::function<void(int active)> observer);

  // Creates a busy, not-yet-ready session and allocates `prompt_len` slots for its prefill
  // (returned in *prompt_slots, which the scheduler appends to context_slots once
  // prefilled). With `prefix` (a ready session the caller holds busy) the new session starts
  // with the prefix's committed slots (shared) and committed tokens. ResourceExhausted when
  // the table or the KV pool is full.
  absl::StatusOr<std::shared_ptr<Session>> Create(int64_t prompt_len,
                                                  std::vector<int32_t>* prompt_slots,
                                                  const std::string& owner = "",
                                                  const Session* prefix = nullptr);
  // Prefill done: the session becomes ready (and stays busy until Release()).
  void MarkReady(const std::shared_ptr<Session>& s);
  // Removes a session whose prefill failed and frees `extra_slots` with its context slots.
  void Discard(const std::shared_ptr<Session>& s, const std::vector<int32_t>& extra_slots);

  // Marks a ready session busy for one request, waiting (within `bounds`) while another
  // request holds it. NotFound (unknown, closed, expired, or owned by another client; also
  // when it is closed while waiting), FailedPrecondition (busy and `bounds` says not to
  // wait), DeadlineExceeded / Cancelled (still busy when the wait ended).
  absl::StatusOr<std::shared_ptr<Session>> Acquire(const std::string& id,
                                                   const std::string& owner = "",
                                                   const WaitBounds& bounds = {});
  // Acquire for several distinct sessions at once: waits until all are free, then marks all
  // busy together (no partial holds while waiting, so two calls cannot deadlock). On
  // NotFound, *failed_index is the index of the first missing id.
  absl::StatusOr<std::vector<std::shared_ptr<Session>>> AcquireAll(
      const std::vector<std::string>& ids, const std::string& owner, const WaitBounds& bounds,
      int* failed_index);
  // Ends the request: not busy, idle clock restarted; frees everything if it was closed.
  void Release(const std::shared_ptr<Session>& s);

  // Rolls a session the caller holds busy back to its first `committed_len` tokens (checked
  // by the caller: 0 < committed_len <= s->committed_len()), dropping its references to the
  // slots beyond and its stored results. The pending token becomes history[committed_len].
  void Truncate(const std::shared_ptr<Session>& s, int64_t committed_len);
  // A new ready, idle session with the same committed slots (shared), history, pending token
  // and config as `parent` (which the caller holds busy); its counters start at zero.
  // ResourceExhausted when the table is full.
  absl::StatusOr<std::shared_ptr<Session>> Fork(const std::shared_ptr<Session>& parent,
                                                const std::string& owner);

  // NotFound for an unknown id (or one owned by another client).
  absl::Status Close(const std::string& id, const std::string& owner = "");
  // Expires idle sessions; returns how many.
  int ExpireIdle(absl::Time now);

  int active() const;

 private:
  void FreeAllLocked(Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string NewIdLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NotifyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  SlotAllocator* const slots_;
  const int max_sessions_;
  const absl::Duration ttl_;
  mutable absl::Mutex mu_;
  absl::CondVar released_;  // signalled when a session stops being busy or leaves the table
  absl::flat_hash_map<std::string, std::shared_ptr<Session>> table_ ABSL_GUARDED_BY(mu_);
  std::function<void(int)> observer_ ABSL_GUARDED_BY(mu_);
};

}  // namespace verifyd::server
