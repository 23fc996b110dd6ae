// GPU tree acceptance + KV commit (kernels/cuda/tree_accept_cuda.h) against
// TreeAcceptReference on random trees whose tokens come from a small vocabulary (so paths of
// several accepted nodes occur), batch 1..256, 1..128 rows per request. Outputs are pre-filled
// with a poison value; every written entry must equal the reference.
// Label gpu; skipped (with a message) when no CUDA device is visible.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/tree_accept_cuda.h"
#include "kernels/tree_accept.h"
#include "tests/gpu_test_util.h"

namespace verifyd::kernels::cuda {
namespace {

constexpr int32_t kPoison = -777;

struct Dev {
  int32_t* p = nullptr;
  explicit Dev(size_t n) { cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(n, 1) * 4); }
  ~Dev() { cudaFree(p); }
};

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
    TreeAcceptParams p;
    p.batch = batch;
    p.row_indptr = indptr.data();
    p.tokens = tokens.data();
    p.parents = parents.data();
    p.predictions = preds.data();
    p.tail_slots = slots.data();
    p.accepted = acc.data();
    p.num_accepted = nacc.data();
    p.bonus = bonus.data();
    p.kept_slots = kept.data();
    p.freed_slots = freed.data();
    ASSERT_TRUE(TreeAcceptReference(p).ok());

    Dev di(indptr.size()), dt(rows), dp(rows), dpr(rows), ds(rows), da(rows), dn(batch), db(batch),
        dk(rows), df(rows);
    auto up = [](Dev& d, const std::vector<int32_t>& v) {
      return cudaMemcpy(d.p, v.data(), v.size() * 4, cudaMemcpyHostToDevice);
    };
    CUDA_ASSERT(up(di, indptr));
    CUDA_ASSERT(up(dt, tokens));
    CUDA_ASSERT(up(dp, parents));
    CUDA_ASSERT(up(dpr, preds));
    CUDA_ASSERT(up(ds, slots));
    const std::vector<int32_t> poison_rows(rows, kPoison), poison_b(batch, kPoison);
    CUDA_ASSERT(up(da, poison_rows));
    CUDA_ASSERT(up(dk, poison_rows));
    CUDA_ASSERT(up(df, poison_rows));
    CUDA_ASSERT(up(dn, poison_b));
    CUDA_ASSERT(up(db, poison_b));
    TreeAcceptParams g = p;
    g.row_indptr = di.p;
    g.tokens = dt.p;
    g.parents = dp.p;
    g.predictions = dpr.p;
    g.tail_slots = ds.p;
    g.accepted = da.p;
    g.num_accepted = dn.p;
    g.bonus = db.p;
    g.kept_slots = dk.p;
    g.freed_slots = df.p;
    ASSERT_TRUE(TreeAcceptCuda(g).ok());
    CUDA_ASSERT(cudaDeviceSynchronize());
    std::vector<int32_t> gacc(rows), gn(batch), gb(batch), gk(rows), gf(rows);
    CUDA_ASSERT(cudaMemcpy(gacc.data(), da.p, rows * 4, cudaMemcpyDeviceToHost));
    CUDA_ASSERT(cudaMemcpy(gn.data(), dn.p, batch * 4, cudaMemcpyDeviceToHost));
    CUDA_ASSERT(cudaMemcpy(gb.data(), db.p, batch * 4, cudaMemcpyDeviceToHost));
    CUDA_ASSERT(cudaMemcpy(gk.data(), dk.p, rows * 4, cudaMemcpyDeviceToHost));
    CUDA_ASSERT(cudaMemcpy(gf.data(), df.p, rows * 4, cudaMemcpyDeviceToHost));
    int64_t total_accepted = 0;
    for (int b = 0; b < batch; ++b) {
      SCOPED_TRACE(testing::Message() << "trial " << trial << " request " << b);
      ASSERT_EQ(gn[b], nacc[b]);
      EXPECT_EQ(gb[b], bonus[b]);
      const int r0 = indptr[b], n = indptr[b + 1] - r0;
      total_accepted += nacc[b];
      for (int i = 0; i < nacc[b]; ++i) EXPECT_EQ(gacc[r0 + i], acc[r0 + i]);
      for (int i = 0; i < 1 + nacc[b]; ++i) EXPECT_EQ(gk[r0 + i], kept[r0 + i]);
      for (int i = 0; i < n - 1 - nacc[b]; ++i) EXPECT_EQ(gf[r0 + i], freed[r0 + i]);
    }
    if (trial >= 10) EXPECT_GT(total_accepted, 0) << "trees should accept some nodes";
  }
}

}  // namespace
}  // namespace verifyd::kernels::cuda
