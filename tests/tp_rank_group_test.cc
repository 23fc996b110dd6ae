// tp::RankGroup, the rank-thread machinery of both engines: a job runs once on every rank,
// the first failure names the error, a rank that does not finish is reported hung after the
// deadline and the abort callback, and the fault injector fails or hangs one rank.
#include <atomic>
#include <chrono>
#include <thread>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tp/rank_group.h"

namespace verifyd::tp {
namespace {

using std::chrono::milliseconds;

TEST(RankGroup, RunsTheJobOnceOnEveryRank) {
  RankGroup group(3);
  std::atomic<int> mask{0};
  RankGroup::Outcome out = group.Run(
      [&](int r) {
        mask.fetch_or(1 << r);
        return absl::OkStatus();
      },
      std::nullopt, milliseconds(100), nullptr);
  EXPECT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.failure, "");
  EXPECT_EQ(out.seconds.size(), 3u);
  EXPECT_EQ(mask.load(), 7);
}

TEST(RankGroup, FailingRankNamesTheError) {
  RankGroup group(2);
  RankGroup::Outcome out =
      group.Run([](int r) { return r == 1 ? absl::InternalError("boom") : absl::OkStatus(); },
                std::nullopt, milliseconds(1000), nullptr);
  EXPECT_EQ(out.status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(out.failure, "rank 1: INTERNAL: boom");
  // The group stays usable.
  out = group.Run([](int) { return absl::OkStatus(); }, std::nullopt, milliseconds(100), nullptr);
  EXPECT_TRUE(out.status.ok()) << out.status;
}

TEST(RankGroup, HungRankIsReportedAfterTheDeadlineAndAbort) {
  RankGroup group(2);
  std::atomic<bool> aborted{false};
  RankGroup::Outcome out = group.Run(
      [&](int r) {
        if (r == 0) {
          while (!aborted.load()) std::this_thread::sleep_for(milliseconds(1));
          std::this_thread::sleep_for(milliseconds(300));  // still busy after the grace
        }
        return absl::OkStatus();
      },
      RankGroup::Clock::now() + milliseconds(50), milliseconds(20), [&] { aborted.store(true); });
  EXPECT_TRUE(aborted.load());
  EXPECT_EQ(out.status.code(), absl::StatusCode::kUnavailable) << out.status;
  EXPECT_EQ(out.failure, "rank 0 did not finish (hung)");
  group.Stop();  // waits for rank 0
}

TEST(FaultInjector, FailsTheChosenRankOnce) {
  FaultInjector inj;
  RankFaultHook hook = inj.Hook();
  inj.FailRankOnNextStep(1);
  EXPECT_TRUE(hook(0, 0).ok());
  EXPECT_EQ(hook(1, 0).code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(hook(1, 1).ok());
}

}  // namespace
}  // namespace verifyd::tp
