// tp::BuildBatchPlan on large batches: slot-list layout, and the aliasing checks (a tail slot
// that is a context slot of any request of the batch, or that appears twice) across requests,
// with enough tail slots that the hashed filter in front of the exact check has many false
// hits (every one must be rejected by the exact check).
#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tp/batch_plan.h"
#include "tp/presets.h"

namespace verifyd::tp {
namespace {

constexpr int kRequests = 64;
constexpr int kRows = 65;
constexpr int kContext = 20000;
constexpr int64_t kPool = 2'000'000;

std::vector<StepRequest> LargeBatch(std::mt19937_64& rng) {
  std::vector<int32_t> ids(kPool);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<StepRequest> batch(kRequests);
  size_t next = 0;
  for (StepRequest& q : batch) {
    q.context_slots.assign(ids.begin() + next, ids.begin() + next + kContext);
    next += kContext;
    for (int t = 0; t < kRows; ++t) {
      q.tokens.push_back(t % 100);
      q.parents.push_back(t - 1);
      q.tail_slots.push_back(ids[next++]);
    }
  }
  return batch;
}

class BatchPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = PresetConfig("tiny");
    ASSERT_TRUE(c.ok()) << c.status();
    config_ = *c;
    limits_.max_batch = kRequests;
    limits_.max_tail_rows = kRows;
    limits_.max_context = kContext + kRows;
  }
  ModelConfig config_;
  EngineLimits limits_;
};

TEST_F(BatchPlanTest, LargeBatchLayoutWithAndWithoutSlotLists) {
  std::mt19937_64 rng(1);
  const std::vector<StepRequest> batch = LargeBatch(rng);
  auto with = BuildBatchPlan(batch, config_, limits_, kPool);
  ASSERT_TRUE(with.ok()) << with.status();
  auto without = BuildBatchPlan(batch, config_, limits_, kPool, /*with_kv_indices=*/false);
  ASSERT_TRUE(without.ok()) << without.status();
  EXPECT_TRUE(without->kv_indices.empty());
  EXPECT_EQ(with->kv_indptr, without->kv_indptr);
  ASSERT_EQ(static_cast<int>(with->kv_indptr.size()), kRequests + 1);
  for (int b = 0; b < kRequests; ++b) {
    const StepRequest& q = batch[b];
    ASSERT_EQ(with->kv_indptr[b + 1] - with->kv_indptr[b], kContext + kRows);
    const int32_t* got = with->kv_indices.data() + with->kv_indptr[b];
    EXPECT_TRUE(std::equal(q.context_slots.begin(), q.context_slots.end(), got)) << b;
    EXPECT_TRUE(std::equal(q.tail_slots.begin(), q.tail_slots.end(), got + kContext)) << b;
  }
  EXPECT_EQ(with->total_rows, kRequests * kRows);
}

TEST_F(BatchPlanTest, TailSlotThatIsAnotherRequestsContextSlot) {
  std::mt19937_64 rng(2);
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<StepRequest> batch = LargeBatch(rng);
    const int b = static_cast<int>(rng() % kRequests);
    const int t = static_cast<int>(rng() % kRows);
    const int other = static_cast<int>(rng() % kRequests);  // may be b itself
    const int32_t s = batch[other].context_slots[rng() % kContext];
    batch[b].tail_slots[t] = s;
    auto plan = BuildBatchPlan(batch, config_, limits_, kPool, trial % 2 == 0);
    ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string want = "batch[" + std::to_string(b) + "].tail_slots[" + std::to_string(t) +
                             "] = " + std::to_string(s) + " is a context slot";
    EXPECT_NE(plan.status().message().find(want), std::string::npos)
        << "want '" << want << "' in: " << plan.status().message();
  }
}

TEST_F(BatchPlanTest, TailSlotUsedTwiceAcrossRequests) {
  std::mt19937_64 rng(3);
  std::vector<StepRequest> batch = LargeBatch(rng);
  batch[41].tail_slots[9] = batch[7].tail_slots[30];
  auto plan = BuildBatchPlan(batch, config_, limits_, kPool);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("batch[41].tail_slots[9]"), std::string::npos)
      << plan.status().message();
  EXPECT_NE(plan.status().message().find("used twice"), std::string::npos);
}

TEST_F(BatchPlanTest, OutOfRangeSlotsNameTheField) {
  std::mt19937_64 rng(4);
  std::vector<StepRequest> batch = LargeBatch(rng);
  batch[12].context_slots[777] = static_cast<int32_t>(kPool);
  auto plan = BuildBatchPlan(batch, config_, limits_, kPool);
  EXPECT_NE(plan.status().message().find("batch[12].context_slots[777]"), std::string::npos)
      << plan.status().message();
  batch = LargeBatch(rng);
  batch[3].tail_slots[0] = -1;
  plan = BuildBatchPlan(batch, config_, limits_, kPool);
  EXPECT_NE(plan.status().message().find("batch[3].tail_slots[0]"), std::string::npos)
      << plan.status().message();
}

}  // namespace
}  // namespace verifyd::tp
