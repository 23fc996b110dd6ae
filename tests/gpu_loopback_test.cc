// The loopback communicator (tp/cuda/loopback_communicator.h): N ranks on one GPU, one thread
// per rank, on inputs whose results are exactly predictable (nccl-tests "verifiable" style):
// fp32 and bf16 sums of small integers are exact, so every rank must hold exactly the
// rank-order sum; all-gather is a copy. Also: a missing rank times out with Unavailable and
// fails the group, and Abort makes every later collective Unavailable.
// Label gpu.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common.h"
#include "tests/gpu_test_util.h"
#include "tp/cuda/loopback_communicator.h"

namespace verifyd::tp {
namespace {

// Runs fn(rank) on one thread per rank and joins them.
template <typename Fn>
void OnRanks(int n, Fn fn) {
  std::vector<std::thread> t;
  for (int r = 0; r < n; ++r) t.emplace_back([&fn, r] { fn(r); });
  for (auto& x : t) x.join();
}

TEST(Loopback, CollectivesGiveExactResults) {
  for (int world : {1, 2, 3, 4, 8}) {
    auto group = CreateLoopbackGroup(world, /*device=*/0, /*timeout_ms=*/20000);
    ASSERT_TRUE(group.ok()) << group.status();
    constexpr size_t kCount = 100003;  // not a multiple of the block size
    std::vector<int> failures(world, 0);
    OnRanks(world, [&](int r) {
      auto& comm = *(*group)[r];
      cudaSetDevice(0);
      cudaStream_t s;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      std::vector<float> host(kCount);
      for (size_t i = 0; i < kCount; ++i) host[i] = float((r + 1) * 3 + (i % 101));
      std::vector<uint16_t> hb(kCount);
      for (size_t i = 0; i < kCount; ++i) hb[i] = kernels::FloatToBf16(float(r + (i % 7)));
      float* d = nullptr;
      uint16_t* db = nullptr;
      char* gsend = nullptr;
      char* grecv = nullptr;
      cudaMalloc(reinterpret_cast<void**>(&d), kCount * 4);
      cudaMalloc(reinterpret_cast<void**>(&db), kCount * 2);
      cudaMalloc(reinterpret_cast<void**>(&gsend), 64);
      cudaMalloc(reinterpret_cast<void**>(&grecv), 64 * world);
      cudaMemcpy(d, host.data(), kCount * 4, cudaMemcpyHostToDevice);
      cudaMemcpy(db, hb.data(), kCount * 2, cudaMemcpyHostToDevice);
      cudaMemset(gsend, r + 1, 64);
      // Three rounds in a row: buffers are reused, so a rank that overwrote its buffer
      // before another read it would show up as a wrong sum.
      for (int round = 0; round < 3; ++round) {
        if (!comm.AllReduceSum(d, kCount, kernels::DType::kFloat32, s).ok()) ++failures[r];
      }
      if (!comm.AllReduceSum(db, kCount, kernels::DType::kBFloat16, s).ok()) ++failures[r];
      if (!comm.AllGather(gsend, grecv, 64, s).ok()) ++failures[r];
      if (!comm.Synchronize(s).ok()) ++failures[r];
      std::vector<float> got(kCount);
      std::vector<uint16_t> gotb(kCount);
      std::vector<char> gath(64 * world);
      cudaMemcpy(got.data(), d, kCount * 4, cudaMemcpyDeviceToHost);
      cudaMemcpy(gotb.data(), db, kCount * 2, cudaMemcpyDeviceToHost);
      cudaMemcpy(gath.data(), grecv, 64 * world, cudaMemcpyDeviceToHost);
      // After round k every rank holds S_k; round k+1 sums world copies: S_{k+1} = world S_k.
      int64_t w3 = int64_t{world} * world;
      for (size_t i = 0; i < kCount; ++i) {
        double s0 = 0, sb = 0;
        for (int q = 0; q < world; ++q) {
          s0 += (q + 1) * 3 + double(i % 101);
          sb += q + double(i % 7);
        }
        if (got[i] != float(s0 * w3) || kernels::Bf16ToFloat(gotb[i]) != float(sb)) {
          ++failures[r];
          break;
        }
      }
      for (int q = 0; q < world; ++q) {
        for (int b = 0; b < 64; ++b) {
          if (gath[q * 64 + b] != char(q + 1)) ++failures[r];
        }
      }
      cudaFree(d);
      cudaFree(db);
      cudaFree(gsend);
      cudaFree(grecv);
      cudaStreamDestroy(s);
    });
    for (int r = 0; r < world; ++r) EXPECT_EQ(failures[r], 0) << "world " << world << " rank " << r;
  }
}

TEST(Loopback, MissingRankTimesOutAndFailsTheGroup) {
  auto group = CreateLoopbackGroup(2, 0, /*timeout_ms=*/300);
  ASSERT_TRUE(group.ok()) << group.status();
  float* d = nullptr;
  CUDA_ASSERT(cudaMalloc(reinterpret_cast<void**>(&d), 16));
  cudaStream_t s;
  CUDA_ASSERT(cudaStreamCreate(&s));
  const absl::Status st = (*group)[0]->AllReduceSum(d, 4, kernels::DType::kFloat32, s);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("DeadlineExceeded"), std::string::npos) << st;
  EXPECT_TRUE((*group)[1]->failed());
  EXPECT_EQ((*group)[1]->AllReduceSum(d, 4, kernels::DType::kFloat32, s).code(),
            absl::StatusCode::kUnavailable);
  cudaFree(d);
  cudaStreamDestroy(s);
}

TEST(Loopback, AbortMakesEveryCollectiveUnavailable) {
  auto group = CreateLoopbackGroup(4, 0, 20000);
  ASSERT_TRUE(group.ok()) << group.status();
  (*group)[2]->Abort();
  float* d = nullptr;
  CUDA_ASSERT(cudaMalloc(reinterpret_cast<void**>(&d), 16));
  for (auto& c : *group) {
    EXPECT_EQ(c->AllGather(d, d, 0, nullptr).code(), absl::StatusCode::kUnavailable);
    EXPECT_TRUE(c->failed());
  }
  cudaFree(d);
}

TEST(Loopback, BadArgumentsAreRejected) {
  EXPECT_EQ(CreateLoopbackGroup(kMaxLoopbackRanks + 1, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto group = CreateLoopbackGroup(1, 0);
  ASSERT_TRUE(group.ok());
  float* d = nullptr;
  CUDA_ASSERT(cudaMalloc(reinterpret_cast<void**>(&d), 16));
  EXPECT_EQ((*group)[0]->AllReduceSum(d, 4, static_cast<kernels::DType>(7), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  cudaFree(d);
}

}  // namespace
}  // namespace verifyd::tp
