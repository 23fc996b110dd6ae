// KV slot allocator: hands out the engine's latent-KV pool slots (page size 1: one slot per
// token) to sessions. Fixed capacity (= Engine::kv_slots()). Allocation is all-or-nothing:
// a request for more slots than are free fails with ResourceExhausted and changes nothing.
// Freeing a slot that is not allocated (double free, out of range) is an Internal error and
// changes nothing, so bookkeeping bugs surface instead of corrupting the pool.
//
// Thread-safety: all methods are safe to call from any thread (one internal mutex).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace verifyd::server {

class SlotAllocator {
 public:
  explicit SlotAllocator(int64_t kv_slots);

  // Returns `n` distinct free slots (n >= 0), or ResourceExhausted when fewer are free.
  absl::StatusOr<std::vector<int32_t>> Allocate(int64_t n);
  // Returns slots to the pool; Internal (and no change at all) if any is not allocated.
  absl::Status Free(const std::vector<int32_t>& slots);

  int64_t kv_slots() const { return kv_slots_; }
  int64_t used() const;
  int64_t free_count() const;

 private:
  const int64_t kv_slots_;
  mutable absl::Mutex mu_;
  std::vector<int32_t> free_list_ ABSL_GUARDED_BY(mu_);  // stack of free slots
  std::vector<uint8_t> in_use_ ABSL_GUARDED_BY(mu_);     // [kv_slots] 1 = allocated
};

}  // namespace verifyd::server
