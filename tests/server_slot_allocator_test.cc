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

TEST(SlotAllocator, SharedSlotsReturnToThePoolWithTheirLastReference) {
  SlotAllocator a(10);
  int64_t observed = -1;
  a.SetObserver([&](int64_t used, int64_t total) {
    EXPECT_EQ(total, 10);
    observed = used;
  });
  EXPECT_EQ(observed, 0);
  auto x = a.Allocate(4);
  ASSERT_TRUE(x.ok());
  EXPECT_EQ(observed, 4);
  ASSERT_TRUE(a.Share(*x).ok());  // a fork: a second holder, no new slot
  EXPECT_EQ(a.used(), 4);
  EXPECT_EQ(a.shared(), 4);
  EXPECT_EQ(a.refs((*x)[0]), 2);
  // One holder truncates to 2: the last two drop to one reference, still used.
  ASSERT_TRUE(a.Free({(*x)[2], (*x)[3]}).ok());
  EXPECT_EQ(a.used(), 4);
  EXPECT_EQ(a.shared(), 2);
  ASSERT_TRUE(a.Free({(*x)[0], (*x)[1]}).ok());  // that holder closes
  EXPECT_EQ(a.used(), 4);
  EXPECT_EQ(a.shared(), 0);
  ASSERT_TRUE(a.Free(*x).ok());  // the other closes: all back
  EXPECT_EQ(a.used(), 0);
  EXPECT_EQ(observed, 0);
  EXPECT_EQ(a.free_count(), 10);
  // Sharing or freeing what is not allocated changes nothing.
  EXPECT_EQ(a.Share({3}).code(), absl::StatusCode::kInternal);
  auto y = a.Allocate(2);
  ASSERT_TRUE(y.ok());
  ASSERT_TRUE(a.Share({(*y)[0]}).ok());
  // (*y)[0] has two references: listing it three times is one too many; nothing changes.
  EXPECT_EQ(a.Free({(*y)[0], (*y)[0], (*y)[0]}).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(a.refs((*y)[0]), 2);
  EXPECT_EQ(a.shared(), 1);
  ASSERT_TRUE(a.Free({(*y)[0], (*y)[0], (*y)[1]}).ok());
  EXPECT_EQ(a.used(), 0);
  EXPECT_EQ(a.shared(), 0);
  // Allocation is all-or-nothing and the pool is whole again.
  auto z = a.Allocate(10);
  ASSERT_TRUE(z.ok());
  std::set<int32_t> distinct(z->begin(), z->end());
  EXPECT_EQ(distinct.size(), 10u);
}

}  // namespace
}  // namespace verifyd::server
