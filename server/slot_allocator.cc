#include "server/slot_allocator.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace verifyd::server {

SlotAllocator::SlotAllocator(int64_t kv_slots) : kv_slots_(kv_slots) {
  absl::MutexLock lock(&mu_);
  free_list_.reserve(static_cast<size_t>(kv_slots));
  // Stack order: slot 0 is handed out first.
  for (int64_t s = kv_slots - 1; s >= 0; --s) free_list_.push_back(static_cast<int32_t>(s));
  refs_.assign(static_cast<size_t>(kv_slots), 0);
}

void SlotAllocator::SetObserver(std::function<void(int64_t, int64_t)> observer) {
  absl::MutexLock lock(&mu_);
  observer_ = std::move(observer);
  NotifyLocked();
}

void SlotAllocator::NotifyLocked() {
  if (observer_) observer_(kv_slots_ - static_cast<int64_t>(free_list_.size()), kv_slots_);
}

absl::StatusOr<std::vector<int32_t>> SlotAllocator::Allocate(int64_t n) {
  if (n < 0) return absl::InvalidArgumentError("slot count must be >= 0");
  absl::MutexLock lock(&mu_);
  if (n > static_cast<int64_t>(free_list_.size())) {
    return absl::ResourceExhaustedError(absl::StrCat("KV pool exhausted: ", n, " slots needed, ",
                                                     free_list_.size(), " free of ", kv_slots_));
  }
  std::vector<int32_t> out(free_list_.end() - n, free_list_.end());
  free_list_.resize(free_list_.size() - n);
  for (int32_t s : out) refs_[s] = 1;
  if (n > 0) NotifyLocked();
  return out;
}

absl::Status SlotAllocator::Share(const std::vector<int32_t>& slots) {
  absl::MutexLock lock(&mu_);
  for (int32_t s : slots) {
    if (s < 0 || s >= kv_slots_ || refs_[s] == 0) {
      return absl::InternalError(absl::StrCat("sharing slot ", s, " that is not allocated"));
    }
  }
  for (int32_t s : slots) {
    if (++refs_[s] == 2) ++shared_;
  }
  return absl::OkStatus();
}

absl::Status SlotAllocator::Free(const std::vector<int32_t>& slots) {
  absl::MutexLock lock(&mu_);
  // Check everything first so a bad list changes nothing; duplicates inside `slots` are
  // caught by dropping references as we go and undoing on failure.
  for (size_t i = 0; i < slots.size(); ++i) {
    const int32_t s = slots[i];
    if (s < 0 || s >= kv_slots_ || refs_[s] <= 0) {
      for (size_t j = 0; j < i; ++j) {
        if (++refs_[slots[j]] == 2) ++shared_;
      }
      return absl::InternalError(absl::StrCat("freeing slot ", s, " that is not allocated"));
    }
    if (refs_[s]-- == 2) --shared_;
  }
  // Commit: slots now at zero references go back to the pool, once each (-1 marks "pushed").
  for (int32_t s : slots) {
    if (refs_[s] == 0) {
      refs_[s] = -1;
      free_list_.push_back(s);
    }
  }
  for (int32_t s : slots) {
    if (refs_[s] == -1) refs_[s] = 0;
  }
  if (!slots.empty()) NotifyLocked();
  return absl::OkStatus();
}

int64_t SlotAllocator::used() const {
  absl::MutexLock lock(&mu_);
  return kv_slots_ - static_cast<int64_t>(free_list_.size());
}

int64_t SlotAllocator::free_count() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(free_list_.size());
}

int64_t SlotAllocator::shared() const {
  absl::MutexLock lock(&mu_);
  return shared_;
}

int32_t SlotAllocator::refs(int32_t slot) const {
  absl::MutexLock lock(&mu_);
  if (slot < 0 || slot >= kv_slots_) return 0;
  return refs_[slot];
}

}  // namespace verifyd::server
