// SlotAllocator: all-or-nothing allocation, exhaustion, bad frees change nothing.
#include <algorithm>
#include <random>
#include <set>

#include "gtest/gtest.h"
#include "server/slot_allocator.h"

namespace verifyd::server {
namespace {

TEST(SlotAllocator, AllocatesDistinctSlotsAndExhausts) {
  SlotAllocator a(10);
  auto x = a.Allocate(4);
  ASSERT_TRUE(x.ok());
  auto y = a.Allocate(6);
  ASSERT_TRUE(y.ok());
  std::set<int32_t> all(x->begin(), x->end());
  all.insert(y->begin(), y->end());
  EXPECT_EQ(all.size(), 10u);
  EXPECT_EQ(*all.begin(), 0);
  EXPECT_EQ(*all.rbegin(), 9);
  EXPECT_EQ(a.used(), 10);
  auto z = a.Allocate(1);
  EXPECT_EQ(z.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a.used(), 10);
  ASSERT_TRUE(a.Free(*x).ok());
  EXPECT_EQ(a.used(), 6);
  EXPECT_TRUE(a.Allocate(4).ok());
}

TEST(SlotAllocator, FailedAllocationChangesNothing) {
  SlotAllocator a(8);
  ASSERT_TRUE(a.Allocate(5).ok());
  EXPECT_EQ(a.Allocate(4).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a.free_count(), 3);
  EXPECT_TRUE(a.Allocate(3).ok());
}

TEST(SlotAllocator, BadFreeIsInternalAndChangesNothing) {
  SlotAllocator a(8);
  auto x = a.Allocate(3);
  ASSERT_TRUE(x.ok());
  // A list with one valid slot, then an unallocated one: nothing may be freed.
  std::vector<int32_t> bad = {(*x)[0], 7};
  EXPECT_EQ(a.Free(bad).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(a.used(), 3);
  EXPECT_EQ(a.Free({-1}).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(a.Free({8}).code(), absl::StatusCode::kInternal);
  // Duplicate inside one list.
  EXPECT_EQ(a.Free({(*x)[1], (*x)[1]}).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(a.used(), 3);
  ASSERT_TRUE(a.Free(*x).ok());
  EXPECT_EQ(a.Free(*x).code(), absl::StatusCode::kInternal);  // double free
  EXPECT_EQ(a.used(), 0);
}

TEST(SlotAllocator, RandomChurnKeepsCountsExact) {
  std::mt19937_64 rng(42);
  SlotAllocator a(100);
  std::vector<std::vector<int32_t>> held;
  int64_t expect_used = 0;
  for (int it = 0; it < 2000; ++it) {
    if (held.empty() || rng() % 2) {
      const int64_t n = static_cast<int64_t>(rng() % 20);
      auto x = a.Allocate(n);
      if (n <= 100 - expect_used) {
        ASSERT_TRUE(x.ok());
        expect_used += n;
        held.push_back(*x);
      } else {
        ASSERT_EQ(x.status().code(), absl::StatusCode::kResourceExhausted);
      }
    } else {
      const size_t k = rng() % held.size();
      ASSERT_TRUE(a.Free(held[k]).ok());
      expect_used -= static_cast<int64_t>(held[k].size());
      held.erase(held.begin() + static_cast<long>(k));
    }
    ASSERT_EQ(a.used(), expect_used);
  }
  std::set<int32_t> distinct;
  for (const auto& h : held) distinct.insert(h.begin(), h.end());
  EXPECT_EQ(static_cast<int64_t>(distinct.size()), expect_used);
}

}  // namespace
}  // namespace verifyd::server
