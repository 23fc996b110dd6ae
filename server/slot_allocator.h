// KV slot allocator: hands out the engine's latent-KV pool slots (page size 1: one slot per
// token) to sessions, reference-counted so that sessions branched from one another (fork,
// open with a prefix) share their common prefix's slots without a copy. Fixed capacity
// (= Engine::kv_slots()). Allocate() returns slots with one reference each; Share() adds a
// reference to allocated slots; Free() drops one reference per listed slot and returns a slot
// to the pool when its last reference goes. Allocation is all-or-nothing: a request for more
// slots than are free fails with ResourceExhausted and changes nothing. Freeing or sharing a
// slot that is not allocated (double free, out of range) is an Internal error and changes
// nothing, so bookkeeping bugs surface instead of corrupting the pool.
//
// An optional observer sees the number of used slots after every change (it feeds the
// verifyd_kv_slots_used gauge, so the gauge is exact at any time).
//
// Thread-safety: all methods are safe to call from any thread (one internal mutex); the
// observer runs under it and must not call back into the allocator.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace verifyd::server {

class SlotAllocator {
 public:
  explicit SlotAllocator(int64_t kv_slots);

  // Called with (used, kv_slots) now and after every change. Set once, before use.
  void SetObserver(std::function<void(int64_t used, int64_t total)> observer);

  // Returns `n` distinct free slots (n >= 0) with one reference each, or ResourceExhausted
  // when fewer are free.
  absl::StatusOr<std::vector<int32_t>> Allocate(int64_t n);
  // Adds one reference to each listed slot; Internal (and no change at all) if any is not
  // allocated.
  absl::Status Share(const std::vector<int32_t>& slots);
  // Drops one reference per listed slot (a slot listed twice drops two); slots whose last
  // reference goes return to the pool. Internal (and no change at all) if a slot is not
  // allocated or would drop below zero references.
  absl::Status Free(const std::vector<int32_t>& slots);

  int64_t kv_slots() const { return kv_slots_; }
  int64_t used() const;              // slots with at least one reference
  int64_t free_count() const;        // kv_slots() - used()
  int64_t shared() const;            // slots with more than one reference
  int32_t refs(int32_t slot) const;  // references held on `slot` (0 = free or out of range)

 private:
  void NotifyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t kv_slots_;
  mutable absl::Mutex mu_;
  std::vector<int32_t> free_list_ ABSL_GUARDED_BY(mu_);  // stack of free slots
  std::vector<int32_t> refs_ ABSL_GUARDED_BY(mu_);       // [kv_slots] references per slot
  int64_t shared_ ABSL_GUARDED_BY(mu_) = 0;              // slots with refs_ > 1
  std::function<void(int64_t, int64_t)> observer_ ABSL_GUARDED_BY(mu_);
};

}  // namespace verifyd::server
