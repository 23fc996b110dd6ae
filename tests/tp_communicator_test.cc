// The in-process communicator on exactly predictable inputs ("verifiable" collectives):
// sums of small integers (exact in float and bf16), gathers of rank-stamped bytes, abort and
// timeout behaviour.
#include <chrono>
#include <cstring>
#include <thread>

#include "gtest/gtest.h"
#include "kernels/status.h"
#include "tp/communicator.h"

namespace verifyd::tp {
namespace {

// Runs fn(rank, comm) on one thread per rank and returns each rank's status.
template <typename Fn>
std::vector<absl::Status> RunRanks(std::vector<std::unique_ptr<Communicator>>& comms, Fn fn) {
  std::vector<absl::Status> st(comms.size());
  std::vector<std::thread> th;
  for (size_t r = 0; r < comms.size(); ++r) {
    th.emplace_back([&, r] { st[r] = fn(static_cast<int>(r), comms[r].get()); });
  }
  for (auto& t : th) t.join();
  return st;
}

// Runs fn(rank, comm) on one thread per rank of a new group of `world` (10 s timeout); every
// rank must return OK.
template <typename Fn>
void ExpectEveryRankOk(int world, Fn fn) {
  auto comms = CreateInProcessGroup(world, 10000);
  ASSERT_EQ(comms.size(), static_cast<size_t>(world));
  for (const absl::Status& s : RunRanks(comms, fn)) EXPECT_TRUE(s.ok()) << s;
}

TEST(InProcessCommunicator, AllReduceSumIsExactAndIdentical) {
  for (int world : {1, 2, 3, 4, 8}) {
    const size_t count = 1000;
    std::vector<std::vector<float>> bufs(world);
    ExpectEveryRankOk(world, [&](int r, Communicator* c) -> absl::Status {
      EXPECT_EQ(c->rank(), r);
      EXPECT_EQ(c->world_size(), world);
      std::vector<float>& b = bufs[r];
      for (int iter = 0; iter < 5; ++iter) {  // several collectives back to back
        b.resize(count);
        for (size_t i = 0; i < count; ++i) b[i] = static_cast<float>((r + 1) * (i % 7) + iter);
        VERIFYD_RETURN_IF_ERROR(
            c->AllReduceSum(b.data(), count, kernels::DType::kFloat32, nullptr));
        // sum_r ((r+1) * (i%7) + iter) = (i%7) * w(w+1)/2 + w * iter
        for (size_t i = 0; i < count; ++i) {
          const float want = static_cast<float>((i % 7) * world * (world + 1) / 2 + world * iter);
          if (b[i] != want) return absl::InternalError("wrong sum");
        }
      }
      return absl::OkStatus();
    });
  }
}

TEST(InProcessCommunicator, AllReduceSumBf16) {
  ExpectEveryRankOk(4, [&](int r, Communicator* c) -> absl::Status {
    std::vector<kernels::bf16_bits> b(64);
    for (size_t i = 0; i < b.size(); ++i)
      b[i] = kernels::FloatToBf16(static_cast<float>(r * 2 + i));
    VERIFYD_RETURN_IF_ERROR(
        c->AllReduceSum(b.data(), b.size(), kernels::DType::kBFloat16, nullptr));
    for (size_t i = 0; i < b.size(); ++i) {
      const float want = kernels::RoundToBf16(static_cast<float>(2 * 6 + 4 * i));
      if (kernels::Bf16ToFloat(b[i]) != want) return absl::InternalError("wrong bf16 sum");
    }
    return absl::OkStatus();
  });
}

TEST(InProcessCommunicator, AllGatherPlacesEachRank) {
  const int world = 4;
  const size_t bytes = 37;
  ExpectEveryRankOk(world, [&](int r, Communicator* c) -> absl::Status {
    std::vector<unsigned char> send(bytes), recv(bytes * world, 0xee);
    for (size_t i = 0; i < bytes; ++i) send[i] = static_cast<unsigned char>(r * 50 + i);
    VERIFYD_RETURN_IF_ERROR(c->AllGather(send.data(), recv.data(), bytes, nullptr));
    for (int k = 0; k < world; ++k) {
      for (size_t i = 0; i < bytes; ++i) {
        if (recv[k * bytes + i] != static_cast<unsigned char>(k * 50 + i)) {
          return absl::InternalError("wrong gather");
        }
      }
    }
    return absl::OkStatus();
  });
}

TEST(InProcessCommunicator, AllGatherInPlace) {
  const int world = 3;
  ExpectEveryRankOk(world, [&](int r, Communicator* c) -> absl::Status {
    std::vector<int32_t> buf(4 * world, -1);
    for (int i = 0; i < 4; ++i) buf[r * 4 + i] = r * 100 + i;  // own part in place
    VERIFYD_RETURN_IF_ERROR(c->AllGather(buf.data() + r * 4, buf.data(), 16, nullptr));
    for (int k = 0; k < world; ++k) {
      for (int i = 0; i < 4; ++i) {
        if (buf[k * 4 + i] != k * 100 + i) return absl::InternalError("wrong in-place gather");
      }
    }
    return absl::OkStatus();
  });
}

TEST(InProcessCommunicator, AbortReleasesWaitingRanks) {
  const int world = 3;
  auto comms = CreateInProcessGroup(world, 60000);
  // Ranks 0 and 1 enter a collective; rank 2 aborts instead of joining.
  auto st = RunRanks(comms, [&](int r, Communicator* c) -> absl::Status {
    float x = 1;
    if (r == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      c->Abort();
      return absl::OkStatus();
    }
    return c->AllReduceSum(&x, 1, kernels::DType::kFloat32, nullptr);
  });
  EXPECT_EQ(st[0].code(), absl::StatusCode::kUnavailable) << st[0];
  EXPECT_EQ(st[1].code(), absl::StatusCode::kUnavailable) << st[1];
  // Later collectives fail at once.
  float x = 1;
  EXPECT_EQ(comms[0]->AllReduceSum(&x, 1, kernels::DType::kFloat32, nullptr).code(),
            absl::StatusCode::kUnavailable);
  char s = 0, rbuf[3];
  EXPECT_EQ(comms[2]->AllGather(&s, rbuf, 1, nullptr).code(), absl::StatusCode::kUnavailable);
}

TEST(InProcessCommunicator, TimeoutIsDeadlineExceededAndAborts) {
  const int world = 2;
  auto comms = CreateInProcessGroup(world, 100);
  float x = 1;
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status s = comms[0]->AllReduceSum(&x, 1, kernels::DType::kFloat32, nullptr);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_GE(waited, 0.09);
  EXPECT_LT(waited, 5.0);
  // The late rank finds the group aborted.
  EXPECT_EQ(comms[1]->AllReduceSum(&x, 1, kernels::DType::kFloat32, nullptr).code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace verifyd::tp
