// GPU tree acceptance + KV commit (kernels/cuda/tree_accept_cuda.h) against
// TreeAcceptReference on random trees whose tokens come from a small vocabulary (so paths of
// several accepted nodes occur), batch 1..256, 1..128 rows per request. Outputs are pre-filled
// with a poison value; every written entry must equal the reference.
// Label gpu; skipped (with a message) when no CUDA device is visible.
#include <cuda_runtime_api.h>

#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/tree_accept_cuda.h"
#include "kernels/tree_accept.h"
#include "tests/gpu_test_util.h"

namespace verifyd::kernels::cuda {
namespace {

constexpr int32_t kPoison = -777;

// TreeAcceptParams' arrays: the inputs, then the outputs, in one order.
constexpr const int32_t* TreeAcceptParams::*kInputs[] = {
    &TreeAcceptParams::row_indptr, &TreeAcceptParams::tokens, &TreeAcceptParams::parents,
    &TreeAcceptParams::predictions, &TreeAcceptParams::tail_slots};
constexpr int32_t* TreeAcceptParams::*kOutputs[] = {
    &TreeAcceptParams::accepted, &TreeAcceptParams::num_accepted, &TreeAcceptParams::bonus,
    &TreeAcceptParams::kept_slots, &TreeAcceptParams::freed_slots};
constexpr int kArrays = 5;                                       // of each
enum Output { kAccepted, kNumAccepted, kBonus, kKept, kFreed };  // index in kOutputs

TEST(TreeAcceptCuda, MatchesReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(4242);
  for (int trial = 0; trial < 30; ++trial) {
    const int batch = trial < 10 ? 1 + trial : 1 + static_cast<int>(rng() % 256);
    const int vocab = 2 + static_cast<int>(rng() % 3);
    std::vector<int32_t> indptr = {0}, tokens, parents, preds, slots;
    for (int b = 0; b < batch; ++b) {
      const int n = trial % 5 == 0 ? 128 : 1 + static_cast<int>(rng() % 65);
      for (int t = 0; t < n; ++t) {
        parents.push_back(t == 0 ? -1 : static_cast<int>(rng() % t));
        tokens.push_back(static_cast<int>(rng() % vocab));
        preds.push_back(static_cast<int>(rng() % vocab));
        slots.push_back(static_cast<int>(rng() % 1000000));
      }
      indptr.push_back(indptr.back() + n);
    }
    const size_t rows = tokens.size();
    std::vector<int32_t> acc(rows, kPoison), nacc(batch, kPoison), bonus(batch, kPoison),
        kept(rows, kPoison), freed(rows, kPoison);
    const std::vector<int32_t>* in[kArrays] = {&indptr, &tokens, &parents, &preds, &slots};
    std::vector<int32_t>* out[kArrays] = {&acc, &nacc, &bonus, &kept, &freed};
    TreeAcceptParams p;
    p.batch = batch;
    for (int i = 0; i < kArrays; ++i) {
      p.*kInputs[i] = in[i]->data();
      p.*kOutputs[i] = out[i]->data();
    }
    ASSERT_TRUE(TreeAcceptReference(p).ok());

    // The same on the device: inputs uploaded, outputs poisoned, then read back into got.
    TreeAcceptParams g = p;
    std::vector<std::unique_ptr<test_util::DeviceArray<int32_t>>> dev;
    auto up = [&](const std::vector<int32_t>& v) {
      dev.push_back(std::make_unique<test_util::DeviceArray<int32_t>>(v.size()));
      return dev.back()->Put(v);
    };
    for (int i = 0; i < kArrays; ++i) {
      CUDA_ASSERT(up(*in[i]));
      g.*kInputs[i] = dev.back()->p;
    }
    for (int i = 0; i < kArrays; ++i) {
      CUDA_ASSERT(up(std::vector<int32_t>(out[i]->size(), kPoison)));
      g.*kOutputs[i] = dev.back()->p;
    }
    ASSERT_TRUE(TreeAcceptCuda(g).ok());
    CUDA_ASSERT(cudaDeviceSynchronize());
    std::vector<int32_t> got[kArrays];
    for (int i = 0; i < kArrays; ++i) {
      got[i].resize(out[i]->size());
      CUDA_ASSERT(
          cudaMemcpy(got[i].data(), g.*kOutputs[i], got[i].size() * 4, cudaMemcpyDeviceToHost));
    }
    int64_t total_accepted = 0;
    for (int b = 0; b < batch; ++b) {
      SCOPED_TRACE(testing::Message() << "trial " << trial << " request " << b);
      ASSERT_EQ(got[kNumAccepted][b], nacc[b]);
      EXPECT_EQ(got[kBonus][b], bonus[b]);
      const int r0 = indptr[b], n = indptr[b + 1] - r0;
      total_accepted += nacc[b];
      for (int i = 0; i < nacc[b]; ++i) EXPECT_EQ(got[kAccepted][r0 + i], acc[r0 + i]);
      for (int i = 0; i < 1 + nacc[b]; ++i) EXPECT_EQ(got[kKept][r0 + i], kept[r0 + i]);
      for (int i = 0; i < n - 1 - nacc[b]; ++i) EXPECT_EQ(got[kFreed][r0 + i], freed[r0 + i]);
    }
    if (trial >= 10) EXPECT_GT(total_accepted, 0) << "trees should accept some nodes";
  }
}

}  // namespace
}  // namespace verifyd::kernels::cuda
