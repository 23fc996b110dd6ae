// NcclCommunicator (tp/cuda/nccl_communicator.h) on the GPUs of this machine:
//   - a group over every visible GPU (world = device count, 1 on a one-GPU machine): the
//     all-reduce (f32 and bf16) and all-gather give the exactly predictable results of
//     nccl-tests' "verifiable" inputs (small integers, exact in both dtypes);
//   - a rank whose peers never join: init fails with Unavailable within the timeout (the
//     non-blocking communicator is polled and aborted, no hang);
//   - after Abort() every collective answers Unavailable;
//   - the batch-invariant rank-order reduction equals the host's rank-order float sum.
// Label gpu; skipped with a message when no CUDA device is visible. Runs with
// NCCL_NVLS_ENABLE=0 (no NVLink multicast).
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common.h"
#include "tests/gpu_test_util.h"
#include "tp/cuda/nccl_communicator.h"

namespace verifyd::tp {
namespace {

class NcclTest : public ::testing::Test {
 protected:
  void SetUp() override { setenv("NCCL_NVLS_ENABLE", "0", 1); }

  // Every visible GPU, one rank each.
  static std::vector<int> AllDevices() {
    std::vector<int> devices;
    for (int d = 0; d < test_util::CudaDeviceCount(); ++d) devices.push_back(d);
    return devices;
  }

  // Runs fn(communicator, rank, stream) on one thread per rank (the rank's device current,
  // a fresh stream) and joins them.
  template <class F>
  static void OnEveryRank(std::vector<std::unique_ptr<NcclCommunicator>>& group, F&& fn) {
    std::vector<std::thread> threads;
    for (int r = 0; r < static_cast<int>(group.size()); ++r) {
      threads.emplace_back([&, r] {
        NcclCommunicator& c = *group[r];
        cudaSetDevice(c.device());
        cudaStream_t s;
        cudaStreamCreate(&s);
        fn(c, r, s);
        cudaStreamDestroy(s);
      });
    }
    for (auto& t : threads) t.join();
  }
};

TEST_F(NcclTest, CollectivesGiveExactResults) {
  SKIP_WITHOUT_GPU();
  const int world = test_util::CudaDeviceCount();
  auto group = CreateNcclGroup(AllDevices(), 30000);
  ASSERT_TRUE(group.ok()) << group.status();
  const size_t n = 100003;  // odd count: no alignment luck
  std::vector<absl::Status> st(world);
  std::vector<std::vector<float>> got_f(world), got_g(world);
  std::vector<std::vector<uint16_t>> got_b(world);
  OnEveryRank(*group, [&](NcclCommunicator& c, int r, cudaStream_t s) {
    // f32: element i of rank r = (i % 13) + r -> sum = world * (i % 13) + world(world-1)/2.
    std::vector<float> hf(n);
    std::vector<uint16_t> hb(n);
    for (size_t i = 0; i < n; ++i) {
      hf[i] = static_cast<float>(i % 13 + r);
      hb[i] = kernels::FloatToBf16(static_cast<float>(i % 7 + r));
    }
    float *df = nullptr, *dg = nullptr;
    uint16_t* db = nullptr;
    cudaMalloc(reinterpret_cast<void**>(&df), n * 4);
    cudaMalloc(reinterpret_cast<void**>(&db), n * 2);
    cudaMalloc(reinterpret_cast<void**>(&dg), n * 4 * world);
    cudaMemcpy(df, hf.data(), n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(db, hb.data(), n * 2, cudaMemcpyHostToDevice);
    absl::Status s1 = c.AllReduceSum(df, n, kernels::DType::kFloat32, s);
    absl::Status s2 = s1.ok() ? c.AllReduceSum(db, n, kernels::DType::kBFloat16, s) : s1;
    // all-gather of the original f32 values of each rank (recomputed into a fresh buffer)
    float* dsend = nullptr;
    cudaMalloc(reinterpret_cast<void**>(&dsend), n * 4);
    cudaMemcpy(dsend, hf.data(), n * 4, cudaMemcpyHostToDevice);
    absl::Status s3 = s2.ok() ? c.AllGather(dsend, dg, n * 4, s) : s2;
    absl::Status s4 = s3.ok() ? c.Synchronize(s) : s3;
    st[r] = s4;
    got_f[r].resize(n);
    got_b[r].resize(n);
    got_g[r].resize(n * world);
    cudaMemcpy(got_f[r].data(), df, n * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(got_b[r].data(), db, n * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(got_g[r].data(), dg, n * 4 * world, cudaMemcpyDeviceToHost);
    cudaFree(df);
    cudaFree(db);
    cudaFree(dg);
    cudaFree(dsend);
  });
  const float base = world * (world - 1) / 2.0f;
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(got_f[r][i], world * static_cast<float>(i % 13) + base) << "f32 i=" << i;
      ASSERT_EQ(kernels::Bf16ToFloat(got_b[r][i]), world * static_cast<float>(i % 7) + base)
          << "bf16 i=" << i;
      for (int k = 0; k < world; ++k) {
        ASSERT_EQ(got_g[r][k * n + i], static_cast<float>(i % 13 + k)) << "gather i=" << i;
      }
    }
  }
}

// The batch-invariant reduction (EnableRankOrderReduce: all-gather, then a sum in rank order):
// random fp32 data (sums that round), and every rank's result must equal, bit for bit, the
// host's float sum of the ranks' values in rank order — for a message and for a prefix of it
// (the order must not depend on the size); more than the buffer holds is InvalidArgument.
TEST_F(NcclTest, RankOrderReduceSumsInRankOrder) {
  SKIP_WITHOUT_GPU();
  const int world = test_util::CudaDeviceCount();
  auto group = CreateNcclGroup(AllDevices(), 30000);
  ASSERT_TRUE(group.ok()) << group.status();
  const size_t n = 50001, prefix = 777;
  auto value = [](int r, size_t i) {
    return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 1.3 * r) * 1e3 /
                              (1.0 + static_cast<double>(i % 97)));
  };
  std::vector<absl::Status> st(world);
  std::vector<std::vector<float>> got(world), got_prefix(world);
  OnEveryRank(*group, [&](NcclCommunicator& c, int r, cudaStream_t s) {
    std::vector<float> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = value(r, i);
    float *d = nullptr, *dp = nullptr;
    cudaMalloc(reinterpret_cast<void**>(&d), n * 4);
    cudaMalloc(reinterpret_cast<void**>(&dp), prefix * 4);
    cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dp, h.data(), prefix * 4, cudaMemcpyHostToDevice);
    absl::Status a = c.EnableRankOrderReduce(n * 4);
    if (a.ok()) a = c.AllReduceSum(d, n, kernels::DType::kFloat32, s);
    if (a.ok()) a = c.AllReduceSum(dp, prefix, kernels::DType::kFloat32, s);
    if (a.ok()) a = c.Synchronize(s);
    st[r] = a;
    got[r].resize(n);
    got_prefix[r].resize(prefix);
    cudaMemcpy(got[r].data(), d, n * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(got_prefix[r].data(), dp, prefix * 4, cudaMemcpyDeviceToHost);
    // Too large for the buffer: refused before anything is enqueued.
    const absl::Status big = c.AllReduceSum(d, n + 1, kernels::DType::kFloat32, s);
    if (st[r].ok() && big.code() != absl::StatusCode::kInvalidArgument) {
      st[r] = absl::InternalError("a message over the buffer was not refused");
    }
    cudaFree(d);
    cudaFree(dp);
  });
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
    for (size_t i = 0; i < n; ++i) {
      float want = 0.f;
      for (int k = 0; k < world; ++k) want += value(k, i);
      ASSERT_EQ(got[r][i], want) << "rank " << r << " i=" << i;
      if (i < prefix) ASSERT_EQ(got_prefix[r][i], want) << "prefix, rank " << r << " i=" << i;
    }
  }
}

TEST_F(NcclTest, MissingPeerTimesOutWithUnavailable) {
  SKIP_WITHOUT_GPU();
  auto id = NcclCommunicator::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  const auto t0 = std::chrono::steady_clock::now();
  // Rank 0 of 2; rank 1 never joins.
  auto c = NcclCommunicator::Create(*id, 0, 2, 0, 3000, nullptr);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_LT(secs, 30.0) << "the init wait must end near its 3 s deadline";
}

TEST_F(NcclTest, AbortMakesEveryCollectiveUnavailable) {
  SKIP_WITHOUT_GPU();
  auto group = CreateNcclGroup({0}, 30000);
  ASSERT_TRUE(group.ok()) << group.status();
  NcclCommunicator& c = *(*group)[0];
  float* d = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&d), 64 * 4);
  c.Abort();
  EXPECT_TRUE(c.failed());
  EXPECT_EQ(c.AllReduceSum(d, 64, kernels::DType::kFloat32, nullptr).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(c.AllGather(d, d, 4, nullptr).code(), absl::StatusCode::kUnavailable);
  cudaFree(d);
}

TEST(NcclArgs, BadArgumentsAreRejectedBeforeNccl) {
  auto c = NcclCommunicator::Create("short", 0, 1, 0, 1000, nullptr);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  auto g = CreateNcclGroup({}, 1000);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace verifyd::tp
