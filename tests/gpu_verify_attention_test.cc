// CUDA verify attention (kernels/cuda/verify_attention_cuda.h) against the C++ reference
// (VerifyAttentionReference) on fresh seeded random inputs: random trees, scattered slots
// (page size 1), unused slots poisoned with NaN, outputs pre-filled with NaN; relative L2 and
// max-abs error with bf16 tolerances; NaN/Inf positions must match. Also: a captured CUDA
// graph replays to the eager output bit for bit; Supports() names unsupported fields.
// Label gpu; skipped (with a message) when no CUDA device is visible.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"
#include "kernels/common.h"
#include "kernels/cuda/verify_attention_cuda.h"
#include "kernels/verify_attention.h"
#include "tests/gpu_test_util.h"

namespace verifyd::kernels::cuda {
namespace {

// Owning device allocation.
struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  DevBuf() = default;
  explicit DevBuf(size_t n) : bytes(n) {
    if (cudaMalloc(&p, std::max<size_t>(n, 16)) != cudaSuccess) p = nullptr;
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

constexpr int kQk = 576;
constexpr int kV = 512;
constexpr bf16_bits kBf16NaN = 0x7fc0;

// One batch: per-request tail rows n_b and context lengths P_b; everything else random.
struct Case {
  int heads = 8;
  std::vector<int> nodes;  // n_b
  std::vector<int> ctx;    // P_b
  uint64_t seed = 1;
  bool empty_rows = false;  // some rows see no tail key (random masks, not trees)
  bool with_lse = true;
  VerifyKernelConfig config = VerifyKernelConfig::kAuto;
  int max_splits = 0;
  std::string Name() const {
    int64_t rows = 0, keys = 0;
    for (size_t b = 0; b < nodes.size(); ++b) {
      rows += nodes[b];
      keys = std::max<int64_t>(keys, ctx[b]);
    }
    return absl::StrCat("B=", nodes.size(), " H=", heads, " rows=", rows, " max_ctx=", keys,
                        " seed=", seed, " cfg=", static_cast<int>(config),
                        " max_splits=", max_splits);
  }
};

// Host side of a batch (bf16 bits), built from a Case.
struct HostBatch {
  int batch = 0, total_rows = 0, heads = 0, mask_words = 2;
  int64_t num_slots = 0;
  float scale = 0.f;
  std::vector<int32_t> q_indptr, kv_indptr, kv_indices;
  std::vector<uint64_t> mask;
  std::vector<bf16_bits> q, kv;
};

HostBatch MakeBatch(const Case& c) {
  std::mt19937_64 rng(c.seed);
  std::uniform_real_distribution<float> uq(-2.f, 2.f), ukv(-1.f, 1.f);
  HostBatch h;
  h.batch = static_cast<int>(c.nodes.size());
  h.heads = c.heads;
  h.scale = 1.0f / std::sqrt(192.0f);
  h.q_indptr.assign(h.batch + 1, 0);
  h.kv_indptr.assign(h.batch + 1, 0);
  for (int b = 0; b < h.batch; ++b) {
    h.q_indptr[b + 1] = h.q_indptr[b] + c.nodes[b];
    h.kv_indptr[b + 1] = h.kv_indptr[b] + c.ctx[b] + c.nodes[b];
  }
  h.total_rows = h.q_indptr[h.batch];
  const int64_t used = h.kv_indptr[h.batch];
  h.num_slots = used + used / 8 + 37;  // unused slots stay NaN
  std::vector<int32_t> perm(h.num_slots);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  h.kv_indices.assign(perm.begin(), perm.begin() + used);
  h.kv.assign(h.num_slots * kQk, kBf16NaN);
  for (int64_t i = 0; i < used; ++i) {
    bf16_bits* row = h.kv.data() + int64_t{h.kv_indices[i]} * kQk;
    for (int d = 0; d < kQk; ++d) row[d] = FloatToBf16(ukv(rng));
  }
  h.q.resize(static_cast<size_t>(h.total_rows) * c.heads * kQk);
  for (auto& v : h.q) v = FloatToBf16(uq(rng));
  // Tree masks: node t's parent uniform in [0, t); row sees ancestors and itself.
  h.mask.assign(static_cast<size_t>(h.total_rows) * h.mask_words, 0);
  for (int b = 0; b < h.batch; ++b) {
    const int n = c.nodes[b];
    const int r0 = h.q_indptr[b];
    for (int t = 0; t < n; ++t) {
      uint64_t* m = h.mask.data() + static_cast<size_t>(r0 + t) * h.mask_words;
      if (c.empty_rows) {
        for (int j = 0; j < n; ++j)
          if (rng() % 3 == 0) m[j / 64] |= 1ull << (j % 64);
        continue;
      }
      if (t > 0) {
        const int parent = static_cast<int>(rng() % t);
        const uint64_t* pm = h.mask.data() + static_cast<size_t>(r0 + parent) * h.mask_words;
        for (int w = 0; w < h.mask_words; ++w) m[w] = pm[w];
      }
      m[t / 64] |= 1ull << (t % 64);
    }
  }
  return h;
}

struct Errors {
  double rel_l2 = 0, max_abs = 0, lse_max_abs = 0;
  int64_t nan_mismatch = 0, inf_mismatch = 0, lse_mismatch = 0;
};

// Runs the reference and the CUDA path for one case; returns the errors.
void RunCase(const Case& c, Errors* err) {
  const HostBatch h = MakeBatch(c);
  const size_t out_elems = static_cast<size_t>(h.total_rows) * h.heads * kV;
  const size_t lse_elems = static_cast<size_t>(h.total_rows) * h.heads;

  VerifyAttentionParams p;
  p.batch = h.batch;
  p.total_rows = h.total_rows;
  p.num_heads = h.heads;
  p.softmax_scale = h.scale;
  p.dtype = DType::kBFloat16;
  p.num_slots = h.num_slots;
  p.mask_words = h.mask_words;

  // Reference on host copies.
  std::vector<bf16_bits> ref_out(out_elems, kBf16NaN);
  std::vector<float> ref_lse(lse_elems, NAN);
  VerifyAttentionParams rp = p;
  rp.q = h.q.data();
  rp.kv = h.kv.data();
  rp.q_indptr = h.q_indptr.data();
  rp.kv_indptr = h.kv_indptr.data();
  rp.kv_indices = h.kv_indices.data();
  rp.tree_mask = h.mask.data();
  rp.out = ref_out.data();
  rp.lse = c.with_lse ? ref_lse.data() : nullptr;
  ASSERT_TRUE(VerifyAttentionReference(rp).ok());

  // Device copies; outputs poisoned with NaN (0xff bytes).
  DevBuf dq(h.q.size() * 2), dkv(h.kv.size() * 2), dqi(h.q_indptr.size() * 4),
      dki(h.kv_indptr.size() * 4), didx(h.kv_indices.size() * 4), dmask(h.mask.size() * 8),
      dout(out_elems * 2), dlse(lse_elems * 4);
  ASSERT_NE(dkv.p, nullptr);
  CUDA_ASSERT(cudaMemcpy(dq.p, h.q.data(), h.q.size() * 2, cudaMemcpyHostToDevice));
  CUDA_ASSERT(cudaMemcpy(dkv.p, h.kv.data(), h.kv.size() * 2, cudaMemcpyHostToDevice));
  CUDA_ASSERT(cudaMemcpy(dqi.p, h.q_indptr.data(), h.q_indptr.size() * 4, cudaMemcpyHostToDevice));
  CUDA_ASSERT(cudaMemcpy(dki.p, h.kv_indptr.data(), h.kv_indptr.size() * 4, cudaMemcpyHostToDevice));
  CUDA_ASSERT(cudaMemcpy(didx.p, h.kv_indices.data(), h.kv_indices.size() * 4,
                         cudaMemcpyHostToDevice));
  CUDA_ASSERT(cudaMemcpy(dmask.p, h.mask.data(), h.mask.size() * 8, cudaMemcpyHostToDevice));
  CUDA_ASSERT(cudaMemset(dout.p, 0xff, out_elems * 2));
  CUDA_ASSERT(cudaMemset(dlse.p, 0xff, lse_elems * 4));

  VerifyAttentionParams dp = p;
  dp.q = dq.p;
  dp.kv = dkv.p;
  dp.q_indptr = dqi.as<int32_t>();
  dp.kv_indptr = dki.as<int32_t>();
  dp.kv_indices = didx.as<int32_t>();
  dp.tree_mask = dmask.as<uint64_t>();
  dp.out = dout.p;
  dp.lse = c.with_lse ? dlse.as<float>() : nullptr;

  auto dev = VerifyAttentionDeviceInfo::Query();
  ASSERT_TRUE(dev.ok()) << dev.status();
  auto ws = VerifyAttentionWorkspace::AllocateDefault();
  ASSERT_TRUE(ws.ok()) << ws.status();
  VerifyPlanOptions opt;
  opt.config = c.config;
  opt.max_splits = c.max_splits;
  auto plan = PlanVerifyAttention(dp, h.q_indptr.data(), h.kv_indptr.data(), *dev, *ws, opt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(UploadVerifyAttentionPlan(*plan, *ws, nullptr).ok());
  const absl::Status st = VerifyAttentionCuda(dp, *plan, *ws);
  ASSERT_TRUE(st.ok()) << st;
  CUDA_ASSERT(cudaDeviceSynchronize());

  std::vector<bf16_bits> out(out_elems);
  std::vector<float> lse(lse_elems);
  CUDA_ASSERT(cudaMemcpy(out.data(), dout.p, out_elems * 2, cudaMemcpyDeviceToHost));
  CUDA_ASSERT(cudaMemcpy(lse.data(), dlse.p, lse_elems * 4, cudaMemcpyDeviceToHost));
  ASSERT_TRUE(ws->Free().ok());

  double num = 0, den = 0;
  for (size_t i = 0; i < out_elems; ++i) {
    const float a = Bf16ToFloat(out[i]);
    const float r = Bf16ToFloat(ref_out[i]);
    if (std::isnan(a) != std::isnan(r)) {
      ++err->nan_mismatch;
      continue;
    }
    if (std::isinf(a) != std::isinf(r) || (std::isinf(a) && a != r)) {
      ++err->inf_mismatch;
      continue;
    }
    if (std::isnan(a) || std::isinf(a)) continue;
    const double d = static_cast<double>(a) - r;
    num += d * d;
    den += static_cast<double>(r) * r;
    err->max_abs = std::max(err->max_abs, std::abs(d));
  }
  err->rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  if (c.with_lse) {
    for (size_t i = 0; i < lse_elems; ++i) {
      const float a = lse[i], r = ref_lse[i];
      if (std::isnan(a) != std::isnan(r) || std::isinf(a) != std::isinf(r) ||
          (std::isinf(a) && a != r)) {
        ++err->lse_mismatch;
        continue;
      }
      if (std::isfinite(a)) err->lse_max_abs = std::max<double>(err->lse_max_abs, std::abs(a - r));
    }
  }
}

// bf16 tolerances: inputs and output are bf16 (8-bit mantissa), P is rounded to bf16 before
// the PV product; accumulation is fp32 in both. Outputs are averages of values in [-1, 1].
constexpr double kRelL2Tol = 1e-2;
constexpr double kMaxAbsTol = 2.5e-2;
constexpr double kLseTol = 2e-3;  // fp32 scores, different summation order

void ExpectCase(const Case& c) {
  SCOPED_TRACE(c.Name());
  Errors e;
  RunCase(c, &e);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_EQ(e.nan_mismatch, 0);
  EXPECT_EQ(e.inf_mismatch, 0);
  EXPECT_EQ(e.lse_mismatch, 0);
  EXPECT_LE(e.rel_l2, kRelL2Tol);
  EXPECT_LE(e.max_abs, kMaxAbsTol);
  EXPECT_LE(e.lse_max_abs, kLseTol);
  std::printf("  %-70s rel_l2 %.2e max_abs %.2e lse %.2e\n", c.Name().c_str(), e.rel_l2,
              e.max_abs, e.lse_max_abs);
}

TEST(VerifyAttentionCuda, HeadsAndNodesGrid) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 100;
  for (int heads : {1, 8, 16, 64, 128}) {
    for (int nodes : {1, 2, 16, 65}) {
      Case c;
      c.heads = heads;
      const int64_t budget = 6'000'000;  // rows * heads * keys, keeps the CPU oracle quick
      const int ctx = static_cast<int>(std::min<int64_t>(3000, budget / (heads * nodes)));
      c.nodes = {nodes, std::max(1, nodes / 2)};
      c.ctx = {ctx, ctx / 3 + 5};
      c.seed = seed++;
      ExpectCase(c);
    }
  }
}

TEST(VerifyAttentionCuda, RandomSweep) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(20261129);
  auto dev = VerifyAttentionDeviceInfo::Query();
  ASSERT_TRUE(dev.ok());
  const bool dev_is_sm90 = dev->cc_major == 9;
  const int head_choices[] = {1, 2, 3, 5, 8, 16, 24, 32, 64, 128};
  for (int i = 0; i < 40; ++i) {
    Case c;
    c.heads = head_choices[rng() % 10];
    const int batch = 1 + static_cast<int>(rng() % (i % 4 == 0 ? 64 : 8));
    const int64_t budget = 8'000'000;
    for (int b = 0; b < batch; ++b) {
      const int n = 1 + static_cast<int>(rng() % 65);
      int ctx;
      switch (rng() % 4) {
        case 0: ctx = 0; break;
        case 1: ctx = static_cast<int>(rng() % 64); break;
        case 2: ctx = static_cast<int>(rng() % 2048); break;
        default: ctx = static_cast<int>(rng() % 20000); break;
      }
      const int64_t cap = budget / batch / (int64_t{n} * c.heads);
      c.nodes.push_back(n);
      c.ctx.push_back(static_cast<int>(std::min<int64_t>(ctx, cap)));
    }
    c.seed = 1000 + i;
    c.with_lse = (i % 5) != 3;
    c.empty_rows = (i % 7) == 2;
    // auto (the seesaw wgmma kernel on sm_90, mma.sync 16-row elsewhere), and the other
    // paths forced: mma.sync 16-row everywhere, mma.sync 64-row and plain wgmma on sm_90.
    switch (i % 4) {
      case 1: c.config = VerifyKernelConfig::kM16; break;
      case 2: c.config = dev_is_sm90 ? VerifyKernelConfig::kM64 : VerifyKernelConfig::kAuto; break;
      case 3: c.config = dev_is_sm90 ? VerifyKernelConfig::kW64 : VerifyKernelConfig::kAuto; break;
      default: c.config = VerifyKernelConfig::kAuto; break;
    }
    c.max_splits = i % 6 == 5 ? 1 : 0;
    ExpectCase(c);
  }
}

TEST(VerifyAttentionCuda, LargeBatchMixedLengths) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(7);
  Case c;
  c.heads = 8;
  for (int b = 0; b < 256; ++b) {
    c.nodes.push_back(1 + static_cast<int>(rng() % 4));
    c.ctx.push_back(b % 17 == 0 ? 3000 + static_cast<int>(rng() % 3000)
                                : static_cast<int>(rng() % 300));
  }
  c.seed = 77;
  ExpectCase(c);
}

TEST(VerifyAttentionCuda, LongContexts) {
  SKIP_WITHOUT_GPU();
  {
    Case c;  // decode at the longest context
    c.heads = 8;
    c.nodes = {1};
    c.ctx = {262144};
    c.seed = 5;
    ExpectCase(c);
  }
  {
    Case c;  // a small tree at 185k, 16 heads
    c.heads = 16;
    c.nodes = {4};
    c.ctx = {185000};
    c.seed = 6;
    ExpectCase(c);
  }
  {
    Case c;  // long and short requests in one batch (uneven split plan)
    c.heads = 8;
    c.nodes = {2, 16, 1, 5};
    c.ctx = {100000, 17, 0, 40000};
    c.seed = 8;
    ExpectCase(c);
  }
}

TEST(VerifyAttentionCuda, RowsThatSeeNothing) {
  SKIP_WITHOUT_GPU();
  Case c;  // zero context, random masks with empty rows: out = 0, lse = -inf
  c.heads = 16;
  c.nodes = {9, 30, 1};
  c.ctx = {0, 0, 0};
  c.empty_rows = true;
  c.seed = 9;
  ExpectCase(c);
  c.config = VerifyKernelConfig::kM16;
  c.seed = 10;
  ExpectCase(c);
}

TEST(VerifyAttentionCuda, GraphReplayMatchesEager) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.heads = 16;
  c.nodes = {16, 3};
  c.ctx = {30000, 500};
  c.seed = 11;
  const HostBatch h = MakeBatch(c);
  const size_t out_elems = static_cast<size_t>(h.total_rows) * h.heads * kV;
  DevBuf dq(h.q.size() * 2), dkv(h.kv.size() * 2), didx(h.kv_indices.size() * 4),
      dmask(h.mask.size() * 8), dout(out_elems * 2), dout2(out_elems * 2),
      dlse(h.total_rows * h.heads * 4);
  CUDA_ASSERT(cudaMemcpy(dq.p, h.q.data(), h.q.size() * 2, cudaMemcpyHostToDevice));
  CUDA_ASSERT(cudaMemcpy(dkv.p, h.kv.data(), h.kv.size() * 2, cudaMemcpyHostToDevice));
  CUDA_ASSERT(cudaMemcpy(didx.p, h.kv_indices.data(), h.kv_indices.size() * 4,
                         cudaMemcpyHostToDevice));
  CUDA_ASSERT(cudaMemcpy(dmask.p, h.mask.data(), h.mask.size() * 8, cudaMemcpyHostToDevice));
  cudaStream_t stream;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  VerifyAttentionParams p;
  p.batch = h.batch;
  p.total_rows = h.total_rows;
  p.num_heads = h.heads;
  p.softmax_scale = h.scale;
  p.num_slots = h.num_slots;
  p.q = dq.p;
  p.kv = dkv.p;
  p.kv_indices = didx.as<int32_t>();
  p.tree_mask = dmask.as<uint64_t>();
  p.mask_words = h.mask_words;
  p.lse = dlse.as<float>();
  p.stream = stream;
  auto dev = VerifyAttentionDeviceInfo::Query();
  ASSERT_TRUE(dev.ok());
  auto ws = VerifyAttentionWorkspace::AllocateDefault();
  ASSERT_TRUE(ws.ok());
  auto plan = PlanVerifyAttention(p, h.q_indptr.data(), h.kv_indptr.data(), *dev, *ws);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_GT(plan->max_splits, 1) << "the case should exercise the split + combine path";
  ASSERT_TRUE(UploadVerifyAttentionPlan(*plan, *ws, stream).ok());

  p.out = dout.p;
  CUDA_ASSERT(cudaMemsetAsync(dout.p, 0xff, out_elems * 2, stream));
  ASSERT_TRUE(VerifyAttentionCuda(p, *plan, *ws).ok());
  CUDA_ASSERT(cudaStreamSynchronize(stream));

  p.out = dout2.p;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const absl::Status cap = VerifyAttentionCuda(p, *plan, *ws);
  CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(cap.ok()) << cap;
  CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 3; ++rep) {
    CUDA_ASSERT(cudaMemsetAsync(dout2.p, 0xff, out_elems * 2, stream));
    CUDA_ASSERT(cudaGraphLaunch(exec, stream));
    CUDA_ASSERT(cudaStreamSynchronize(stream));
    std::vector<uint16_t> a(out_elems), b(out_elems);
    CUDA_ASSERT(cudaMemcpy(a.data(), dout.p, out_elems * 2, cudaMemcpyDeviceToHost));
    CUDA_ASSERT(cudaMemcpy(b.data(), dout2.p, out_elems * 2, cudaMemcpyDeviceToHost));
    int64_t diff = 0, nans = 0;
    for (size_t i = 0; i < out_elems; ++i) {
      diff += a[i] != b[i];
      nans += std::isnan(Bf16ToFloat(a[i]));
    }
    EXPECT_EQ(diff, 0) << "replay " << rep;
    EXPECT_EQ(nans, 0);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  ASSERT_TRUE(ws->Free().ok());
}

// The seesaw wgmma schedule (VerifyKernelConfig::kS64, sm_90a only; kAuto's choice there), forced,
// against the same oracle and tolerances as every other path. Shapes chosen for its pair
// logic (tiles of 64 keys processed two at a time by two warpgroups): one tile, an odd tile
// count (the second warpgroup idles in the last pair), ranges ending one key into a tile,
// exact multiples of 128, tail-only masking, split (partial outputs + combine) and unsplit
// requests, rows past the request in the last 64-row tile, rows that see nothing.
bool SkipUnlessSm90() {
  auto dev = VerifyAttentionDeviceInfo::Query();
  return !dev.ok() || dev->cc_major != 9;
}

// Small shapes (quick under compute-sanitizer): tile / pair boundaries and empty rows.
TEST(VerifyAttentionCuda, SeesawScheduleEdges) {
  SKIP_WITHOUT_GPU();
  if (SkipUnlessSm90()) GTEST_SKIP() << "the seesaw schedule is sm_90a only";
  uint64_t seed = 5000;
  // Key counts (context + tail) around the tile (64) and pair (128) boundaries, unsplit so
  // the CTA sees exactly this many keys; then the planner's own split of the same batch.
  for (int keys : {1, 16, 63, 64, 65, 127, 128, 129, 191, 192, 193, 320}) {
    for (int max_splits : {1, 0}) {
      Case c;
      c.heads = 16;
      const int n = std::min(keys, 16);
      c.nodes = {n, 1};
      c.ctx = {keys - n, keys + 40};
      c.seed = seed++;
      c.config = VerifyKernelConfig::kS64;
      c.max_splits = max_splits;
      ExpectCase(c);
    }
  }
  // Rows that see no key (random masks), with and without context.
  for (int ctx : {0, 100}) {
    Case c;
    c.heads = 16;
    c.nodes = {9, 30, 1};
    c.ctx = {ctx, ctx, 0};
    c.empty_rows = true;
    c.seed = seed++;
    c.config = VerifyKernelConfig::kS64;
    ExpectCase(c);
  }
  // Partial row tiles: 1, 21 and 65 folded rows (the last tile of 65 holds one row), and
  // 128 heads x 65 nodes = 130 row tiles over 125 keys.
  for (auto [heads, nodes, ctx] : {std::tuple{1, 1, 200}, std::tuple{3, 7, 500},
                                   std::tuple{1, 65, 1000}, std::tuple{128, 65, 60}}) {
    Case c;
    c.heads = heads;
    c.nodes = {nodes};
    c.ctx = {ctx};
    c.seed = seed++;
    c.config = VerifyKernelConfig::kS64;
    ExpectCase(c);
  }
}

// Larger sweep: heads x nodes grid, split and unsplit, a compute-bound-like batch, random
// batches.
TEST(VerifyAttentionCuda, SeesawScheduleSweep) {
  SKIP_WITHOUT_GPU();
  if (SkipUnlessSm90()) GTEST_SKIP() << "the seesaw schedule is sm_90a only";
  uint64_t seed = 6000;
  int i = 0;
  for (int heads : {1, 8, 16, 64, 128}) {
    for (int nodes : {1, 16, 65}) {
      Case c;
      c.heads = heads;
      const int64_t budget = 1'500'000;  // rows * heads * keys, keeps the CPU oracle quick
      const int ctx = static_cast<int>(std::min<int64_t>(3000, budget / (heads * nodes)));
      c.nodes = {nodes, std::max(1, nodes / 3)};
      c.ctx = {ctx, ctx / 3 + 5};
      c.seed = seed++;
      c.config = VerifyKernelConfig::kS64;
      c.max_splits = (i++ % 2) ? 1 : 0;
      ExpectCase(c);
    }
  }
  // 16 nodes x 16 heads (four 64-row tiles sharing each key range), batch 4, long enough
  // for several splits per request.
  {
    Case c;
    c.heads = 16;
    c.nodes = {16, 16, 16, 16};
    c.ctx = {4000, 2500, 700, 3};
    c.seed = seed++;
    c.config = VerifyKernelConfig::kS64;
    ExpectCase(c);
  }
  std::mt19937_64 rng(20261130);
  const int head_choices[] = {1, 3, 8, 16, 24, 64, 128};
  for (int r = 0; r < 16; ++r) {
    Case c;
    c.heads = head_choices[rng() % 7];
    const int batch = 1 + static_cast<int>(rng() % 6);
    for (int b = 0; b < batch; ++b) {
      const int n = 1 + static_cast<int>(rng() % 65);
      const int ctx = static_cast<int>(rng() % (r % 2 ? 300 : 5000));
      const int64_t cap = 1'500'000 / batch / (int64_t{n} * c.heads);
      c.nodes.push_back(n);
      c.ctx.push_back(static_cast<int>(std::min<int64_t>(ctx, cap)));
    }
    c.seed = seed++;
    c.with_lse = (r % 5) != 3;
    c.empty_rows = (r % 7) == 2;
    c.config = VerifyKernelConfig::kS64;
    c.max_splits = r % 4 == 3 ? 1 : 0;
    ExpectCase(c);
  }
}

// Planner (host only) for the seesaw configuration: 64-row, 64-key tiles; splits start on
// 64-key boundaries and cover every key once; refused on a device that is not sm_90.
TEST(VerifyAttentionPlan, SeesawPlanShape) {
  VerifyAttentionDeviceInfo dev{132, 9, 0, 232448, 233472};
  VerifyAttentionWorkspace ws;  // capacity only
  ws.max_work_items = 65536;
  ws.max_combine_items = 16384;
  ws.max_partial_rows = 32768;
  std::vector<int32_t> qi = {0, 16, 32}, ki = {0, 65536 + 16, 65536 + 16 + 1000 + 16};
  VerifyAttentionParams p;
  p.batch = 2;
  p.total_rows = 32;
  p.num_heads = 16;
  VerifyPlanOptions opt;
  opt.config = VerifyKernelConfig::kS64;
  auto plan = PlanVerifyAttention(p, qi.data(), ki.data(), dev, ws, opt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->config, VerifyKernelConfig::kS64);
  EXPECT_EQ(plan->rows_per_cta, 64);
  EXPECT_EQ(plan->keys_per_tile, 64);
  EXPECT_GT(plan->max_splits, 1);
  std::vector<int64_t> covered(2, 0);
  for (const VerifyWorkItem& w : plan->work) {
    EXPECT_EQ(w.kv_begin % 64, 0);
    EXPECT_EQ(w.fold_begin % 64, 0);
    const int b = w.q_row0 == 0 ? 0 : 1;
    covered[b] += w.kv_end - w.kv_begin;
  }
  // Each request has 16 * 16 = 256 folded rows = 4 row tiles, each covering every key once.
  EXPECT_EQ(covered[0], 4 * int64_t{ki[1] - ki[0]});
  EXPECT_EQ(covered[1], 4 * int64_t{ki[2] - ki[1]});
  VerifyAttentionDeviceInfo sm120{84, 12, 0, 101376, 102400};
  auto refused = PlanVerifyAttention(p, qi.data(), ki.data(), sm120, ws, opt);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(refused.status().message().find("seesaw"), std::string::npos);
}

TEST(VerifyAttentionCuda, SupportsNamesTheField) {
  VerifyAttentionDeviceInfo dev{132, 9, 0, 232448, 233472};
  VerifyAttentionParams p;
  p.batch = 1;
  p.total_rows = 1;
  p.num_heads = 8;
  EXPECT_TRUE(SupportsVerifyAttentionCuda(p, dev).ok());
  p.dtype = DType::kFloat32;
  EXPECT_NE(SupportsVerifyAttentionCuda(p, dev).message().find("dtype"), std::string::npos);
  p.dtype = DType::kBFloat16;
  p.qk_dim = 192;
  EXPECT_NE(SupportsVerifyAttentionCuda(p, dev).message().find("qk_dim"), std::string::npos);
  p.qk_dim = 576;
  p.v_dim = 128;
  EXPECT_NE(SupportsVerifyAttentionCuda(p, dev).message().find("v_dim"), std::string::npos);
  p.v_dim = 512;
  p.mask_words = 3;
  EXPECT_NE(SupportsVerifyAttentionCuda(p, dev).message().find("mask_words"),
            std::string::npos);
  p.mask_words = 2;
  VerifyAttentionDeviceInfo small{84, 12, 0, 101376, 102400};
  EXPECT_TRUE(SupportsVerifyAttentionCuda(p, small).ok());
  VerifyAttentionDeviceInfo old{80, 7, 5, 65536, 65536};
  EXPECT_EQ(SupportsVerifyAttentionCuda(p, old).code(), absl::StatusCode::kUnimplemented);
}

// Unaligned q / kv / out are refused before anything is launched (the kernels move rows
// with 16-byte and bulk copies), naming the field. Host only: the check precedes every CUDA
// call, so the fake device pointers are never touched.
TEST(VerifyAttentionCuda, RejectsUnalignedPointers) {
  VerifyAttentionDeviceInfo dev{132, 9, 0, 232448, 233472};
  VerifyAttentionWorkspace ws;  // capacity only
  ws.max_work_items = 1024;
  ws.max_combine_items = 1024;
  ws.max_partial_rows = 65536;
  const std::vector<int32_t> qi = {0, 4}, ki = {0, 1000};
  VerifyAttentionParams p;
  p.batch = 1;
  p.total_rows = 4;
  p.num_heads = 8;
  p.num_slots = 1000;
  auto plan = PlanVerifyAttention(p, qi.data(), ki.data(), dev, ws);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_FALSE(plan->work.empty());
  alignas(16) static unsigned char fake[64];
  const std::vector<int32_t> slots(1000, 0);
  const std::vector<uint64_t> mask(8, ~0ull);
  p.kv_indices = slots.data();
  p.tree_mask = mask.data();
  for (const char* field : {"q", "kv", "out"}) {
    p.q = fake;
    p.kv = fake;
    p.out = fake;
    if (std::string(field) == "q") p.q = fake + 2;
    if (std::string(field) == "kv") p.kv = fake + 8;
    if (std::string(field) == "out") p.out = fake + 4;
    const absl::Status s = VerifyAttentionCuda(p, *plan, ws);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field << ": " << s;
    EXPECT_NE(s.message().find(std::string(field) + " must be 16-byte aligned"),
              std::string::npos)
        << s;
  }
}

// The planner (host only): splits a long single request over the SMs, leaves a batch that
// already fills the device unsplit, and keeps every key covered exactly once.
TEST(VerifyAttentionPlan, CoversEveryKeyOnce) {
  VerifyAttentionDeviceInfo dev{132, 9, 0, 232448, 233472};
  VerifyAttentionWorkspace ws;  // capacity only
  ws.max_work_items = 65536;
  ws.max_combine_items = 16384;
  ws.max_partial_rows = 32768;
  for (int trial = 0; trial < 3; ++trial) {
    std::vector<int32_t> qi = {0}, ki = {0};
    std::vector<int> n, L;
    std::mt19937 rng(trial);
    const int B = trial == 0 ? 1 : (trial == 1 ? 7 : 200);
    for (int b = 0; b < B; ++b) {
      n.push_back(1 + rng() % 16);
      L.push_back(n.back() + (trial == 0 ? 185000 : static_cast<int>(rng() % 50000)));
      qi.push_back(qi.back() + n.back());
      ki.push_back(ki.back() + L.back());
    }
    VerifyAttentionParams p;
    p.batch = B;
    p.total_rows = qi.back();
    p.num_heads = 8;
    auto plan = PlanVerifyAttention(p, qi.data(), ki.data(), dev, ws);
    ASSERT_TRUE(plan.ok()) << plan.status();
    // Coverage: for each (request, folded row tile), the key ranges tile [0, L_b).
    std::vector<std::vector<std::pair<int, int>>> ranges(B * 64);
    for (const VerifyWorkItem& w : plan->work) {
      int b = static_cast<int>(std::upper_bound(qi.begin(), qi.end(), w.q_row0) - qi.begin()) - 1;
      ASSERT_EQ(w.kv_len, L[b]);
      ranges[b * 64 + w.fold_begin / plan->rows_per_cta].push_back({w.kv_begin, w.kv_end});
    }
    for (int b = 0; b < B; ++b) {
      const int tiles = (n[b] * 8 + plan->rows_per_cta - 1) / plan->rows_per_cta;
      for (int t = 0; t < tiles; ++t) {
        auto r = ranges[b * 64 + t];
        std::sort(r.begin(), r.end());
        ASSERT_FALSE(r.empty());
        int at = 0;
        for (auto [lo, hi] : r) {
          EXPECT_EQ(lo, at);
          EXPECT_GT(hi, lo);
          at = hi;
        }
        EXPECT_EQ(at, L[b]);
      }
    }
    if (trial == 0) EXPECT_GE(plan->work.size(), 100u) << "one long request must be split";
  }
}

}  // namespace
}  // namespace verifyd::kernels::cuda
