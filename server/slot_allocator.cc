#include "server/slot_allocator.h"

#include "absl/strings/str_cat.h"

namespace verifyd::server {

SlotAllocator::SlotAllocator(int64_t kv_slots) : kv_slots_(kv_slots) {
  free_list_.reserve(static_cast<size_t>(kv_slots));
  // Stack order: slot 0 is handed out first.
  for (int64_t s = kv_slots - 1; s >= 0; --s) free_list_.push_back(static_cast<int32_t>(s));
  in_use_.assign(static_cast<size_t>(kv_slots), 0);
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
  for (int32_t s : out) in_use_[s] = 1;
  return out;
}

absl::Status SlotAllocator::Free(const std::vector<int32_t>& slots) {
  absl::MutexLock lock(&mu_);
  // Check everything first so a bad list changes nothing; duplicates inside `slots` are
  // caught by marking as we go and undoing on failure.
  for (size_t i = 0; i < slots.size(); ++i) {
    const int32_t s = slots[i];
    if (s < 0 || s >= kv_slots_ || !in_use_[s]) {
      for (size_t j = 0; j < i; ++j) in_use_[slots[j]] = 1;
      return absl::InternalError(absl::StrCat("freeing slot ", s, " that is not allocated"));
    }
    in_use_[s] = 0;
  }
  free_list_.insert(free_list_.end(), slots.begin(), slots.end());
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

}  // namespace verifyd::server
