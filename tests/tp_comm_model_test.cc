// tp::ModeledSeconds, the latency + bandwidth model of an 8-GPU NVLink collective used by the
// reports of a single rank run alone: the NCCL-tests bus-bandwidth formulas by hand, the
// latency floor at 0 bytes, world 1 = no communication, monotonic in bytes, the sum over a
// list, and ValidateCommModel naming the bad field.
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tp/comm_model.h"

namespace verifyd::tp {
namespace {

// Round numbers so the expected times are easy to check by hand.
CommModel HandModel() {
  CommModel m;
  m.name = "hand";
  m.all_reduce_latency_us = 10.0;
  m.all_reduce_bus_gbps = 100.0;
  m.all_gather_latency_us = 5.0;
  m.all_gather_bus_gbps = 200.0;
  m.world = 8;
  return m;
}

TEST(CommModelTest, AllReduceByHand) {
  const CommModel m = HandModel();
  // 8 MB at world 8: 2 * 7/8 * 8e6 B / 100e9 B/s = 140 us, + 10 us.
  EXPECT_NEAR(ModeledSeconds(m, {CollectiveKind::kAllReduce, 8'000'000}), 150e-6, 1e-12);
  // 1 MB: 17.5 us + 10 us.
  EXPECT_NEAR(ModeledSeconds(m, {CollectiveKind::kAllReduce, 1'000'000}), 27.5e-6, 1e-12);
  // World 2: 2 * 1/2 * 1e6 / 100e9 = 10 us, + 10 us.
  CommModel two = m;
  two.world = 2;
  EXPECT_NEAR(ModeledSeconds(two, {CollectiveKind::kAllReduce, 1'000'000}), 20e-6, 1e-12);
}

TEST(CommModelTest, AllGatherByHand) {
  const CommModel m = HandModel();
  // Each rank sends 1 MB at world 8: 7/8 * 8e6 B / 200e9 B/s = 35 us, + 5 us.
  EXPECT_NEAR(ModeledSeconds(m, {CollectiveKind::kAllGather, 1'000'000}), 40e-6, 1e-12);
  // 4 KB each: 7 * 4096 / 200e9 = 0.14336 us, + 5 us.
  EXPECT_NEAR(ModeledSeconds(m, {CollectiveKind::kAllGather, 4096}), 5.14336e-6, 1e-12);
}

TEST(CommModelTest, LatencyFloorAtZeroBytes) {
  const CommModel m = HandModel();
  EXPECT_DOUBLE_EQ(ModeledSeconds(m, {CollectiveKind::kAllReduce, 0}), 10e-6);
  EXPECT_DOUBLE_EQ(ModeledSeconds(m, {CollectiveKind::kAllGather, 0}), 5e-6);
}

TEST(CommModelTest, WorldOneIsNoCommunication) {
  CommModel m = HandModel();
  m.world = 1;
  EXPECT_EQ(ModeledSeconds(m, {CollectiveKind::kAllReduce, 0}), 0.0);
  EXPECT_EQ(ModeledSeconds(m, {CollectiveKind::kAllReduce, 1 << 30}), 0.0);
  EXPECT_EQ(ModeledSeconds(m, {CollectiveKind::kAllGather, 1 << 20}), 0.0);
  EXPECT_EQ(ModeledSeconds(m, std::vector<CollectiveCall>{{CollectiveKind::kAllReduce, 64},
                                                          {CollectiveKind::kAllGather, 64}}),
            0.0);
}

TEST(CommModelTest, MonotonicInBytes) {
  const CommModel m = NvlinkH200x8();
  for (CollectiveKind kind : {CollectiveKind::kAllReduce, CollectiveKind::kAllGather}) {
    double prev = ModeledSeconds(m, {kind, 0});
    for (int64_t bytes = 1; bytes <= (int64_t{1} << 34); bytes *= 4) {
      const double t = ModeledSeconds(m, {kind, bytes});
      EXPECT_GT(t, prev) << "bytes " << bytes;
      prev = t;
    }
  }
}

TEST(CommModelTest, SumOverList) {
  const CommModel m = HandModel();
  const std::vector<CollectiveCall> calls = {{CollectiveKind::kAllReduce, 8'000'000},
                                             {CollectiveKind::kAllGather, 1'000'000},
                                             {CollectiveKind::kAllReduce, 0}};
  EXPECT_NEAR(ModeledSeconds(m, calls), 150e-6 + 40e-6 + 10e-6, 1e-12);
  EXPECT_EQ(ModeledSeconds(m, std::vector<CollectiveCall>{}), 0.0);
}

TEST(CommModelTest, NvlinkH200x8Constants) {
  const CommModel m = NvlinkH200x8();
  EXPECT_EQ(m.world, 8);
  EXPECT_DOUBLE_EQ(m.all_reduce_bus_gbps, 370.0);
  EXPECT_DOUBLE_EQ(m.all_gather_bus_gbps, 370.0);
  EXPECT_DOUBLE_EQ(m.all_reduce_latency_us, 25.0);
  EXPECT_DOUBLE_EQ(m.all_gather_latency_us, 25.0);
  EXPECT_FALSE(m.name.empty());
  EXPECT_NE(m.source.find("https://"), std::string::npos);
  EXPECT_TRUE(ValidateCommModel(m).ok());
  // 64 MiB all-reduce: 25 us + 1.75 * 67108864 / 370e9 = 342.4 us (docs/PERF.md quotes it).
  EXPECT_NEAR(ModeledSeconds(m, {CollectiveKind::kAllReduce, 64 << 20}), 342.4e-6, 0.05e-6);
}

TEST(CommModelTest, ValidateNamesTheField) {
  auto message = [](const CommModel& m, const std::vector<CollectiveCall>& calls = {}) {
    absl::Status s = ValidateCommModel(m, calls);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    return std::string(s.message());
  };
  CommModel m = HandModel();
  m.world = 0;
  EXPECT_NE(message(m).find("CommModel.world"), std::string::npos);
  m = HandModel();
  m.all_reduce_bus_gbps = 0;
  EXPECT_NE(message(m).find("CommModel.all_reduce_bus_gbps"), std::string::npos);
  m = HandModel();
  m.all_gather_bus_gbps = -1;
  EXPECT_NE(message(m).find("CommModel.all_gather_bus_gbps"), std::string::npos);
  m = HandModel();
  m.all_reduce_latency_us = -1;
  EXPECT_NE(message(m).find("CommModel.all_reduce_latency_us"), std::string::npos);
  m = HandModel();
  m.all_gather_latency_us = std::nan("");
  EXPECT_NE(message(m).find("CommModel.all_gather_latency_us"), std::string::npos);
  EXPECT_NE(
      message(HandModel(), {{CollectiveKind::kAllReduce, 4}, {CollectiveKind::kAllGather, -1}})
          .find("calls[1].bytes"),
      std::string::npos);
  EXPECT_TRUE(ValidateCommModel(HandModel(), {{CollectiveKind::kAllGather, 0}}).ok());
}

}  // namespace
}  // namespace verifyd::tp
