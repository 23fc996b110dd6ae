// CUDA verify attention (kernels/cuda/verify_attention/api.h) against the C++ reference
// (VerifyAttentionReference) on fresh seeded random inputs: random trees, scattered slots
// (page size 1), unused slots poisoned with NaN, the last tail node's KV slot (a leaf: hidden
// from every other row of its request) filled with +-3e4 sentinels so a mask error moves the
// output grossly, outputs and the workspace (partials + LSE) pre-filled with NaN. Compared
// per (row, head): relative L2 and max-abs error with bf16 tolerances, NaN/Inf positions must
// match. Also: a captured CUDA graph replays to the eager output bit for bit.
// Host-only checks of the planner and launcher: kernels_verify_attention_{plan,launch}_test.
// Label gpu; the binary reports Skipped when no CUDA device is visible.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/common.h"
#include "kernels/cuda/dense/fallback_attention.h"
#include "kernels/cuda/verify_attention/api.h"
#include "kernels/kv_fp8.h"
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
// The tests' workspace staging area (kS64Staged with an FP8 cache; poisoned like the rest).
constexpr int64_t kStagedKeys = int64_t{1} << 18;
constexpr float kSentinel = 3.0e4f;  // KV of keys some rows must not see (exact in bf16: 30080)

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
  bool positional = false;       // a positional plan (the batch-invariant mode's)
  bool shared_context = false;   // ... with the context splits shared by a request's nodes
  int64_t max_partial_rows = 0;  // > 0: a workspace this small (positional plans: passes)
  int split_group = -1;          // positional plans: VerifyPlanOptions::positional_split_group
  // > 0: requests b >= 1 with shared[b] set begin with request 0's first `prefix` context
  // slots (forks), and the planner gets the host kv indices (shared-prefix plans).
  int prefix = 0;
  std::vector<bool> shared;
  bool kv_fp8 = false;  // the cache in the FP8 format (kernels/kv_fp8.h)
  // Each listed key row scaled by its own 2^u, u uniform in [-20, 12] (FP8 scales spanning
  // 2^32 within a tile).
  bool kv_scale_spread = false;
  std::string Name() const {
    int64_t rows = 0, keys = 0;
    for (size_t b = 0; b < nodes.size(); ++b) {
      rows += nodes[b];
      keys = std::max<int64_t>(keys, ctx[b]);
    }
    return absl::StrCat("B=", nodes.size(), " H=", heads, " rows=", rows, " max_ctx=", keys,
                        " seed=", seed, " cfg=", static_cast<int>(config),
                        positional ? " positional" : "", shared_context ? " shared" : "",
                        prefix > 0 ? absl::StrCat(" prefix=", prefix) : "", kv_fp8 ? " fp8" : "",
                        kv_scale_spread ? " spread" : "", " max_splits=", max_splits);
  }
};

// Host side of a batch (bf16 bits), built from a Case.
struct HostBatch {
  int batch = 0, total_rows = 0, heads = 0, mask_words = 2;
  int64_t kv_slots = 0;
  float scale = 0.f;
  std::vector<int32_t> q_indptr, kv_indptr, kv_indices;
  std::vector<uint64_t> mask;
  std::vector<bf16_bits> q, kv;
  // FP8 cache: every listed row of kv stored in the format (KvFp8EncodeRow of its values);
  // the rows nobody lists are 0xff bytes (NaN codes and scales).
  bool kv_fp8 = false;
  std::vector<uint8_t> kv8;
  const void* kv_data() const {
    return kv_fp8 ? static_cast<const void*>(kv8.data()) : static_cast<const void*>(kv.data());
  }
  size_t kv_bytes() const { return kv_fp8 ? kv8.size() : kv.size() * 2; }
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
  h.kv_slots = used + used / 8 + 37;  // unused slots stay NaN
  std::vector<int32_t> perm(h.kv_slots);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  h.kv_indices.assign(perm.begin(), perm.begin() + used);
  for (int b = 1; b < h.batch && c.prefix > 0; ++b) {  // forks: request 0's first slots
    if (!c.shared.empty() && !c.shared[b]) continue;
    for (int k = 0; k < c.prefix; ++k) h.kv_indices[h.kv_indptr[b] + k] = h.kv_indices[k];
  }
  h.kv.assign(h.kv_slots * kQk, kBf16NaN);
  for (int64_t i = 0; i < used; ++i) {
    bf16_bits* row = h.kv.data() + int64_t{h.kv_indices[i]} * kQk;
    const float spread =
        c.kv_scale_spread ? std::ldexp(1.f, static_cast<int>(rng() % 33) - 20) : 1.f;
    for (int d = 0; d < kQk; ++d) row[d] = FloatToBf16(ukv(rng) * spread);
  }
  // Sentinels: the last tail node of a tree is a leaf (parents precede children), so every
  // other row of the request must not see its key; +-3e4 in the key and value columns makes
  // any leak dominate (or zero) the softmax of the rows it reaches.
  if (!c.empty_rows) {
    for (int b = 0; b < h.batch; ++b) {
      if (c.nodes[b] < 2) continue;
      bf16_bits* row = h.kv.data() + int64_t{h.kv_indices[h.kv_indptr[b + 1] - 1]} * kQk;
      for (int d = 0; d < kQk; ++d) row[d] = FloatToBf16(d % 2 ? -kSentinel : kSentinel);
    }
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
  if (c.kv_fp8) {
    h.kv_fp8 = true;
    const int64_t rb = KvFp8RowBytes(kV, kQk - kV, kKvFp8Group);
    h.kv8.assign(static_cast<size_t>(h.kv_slots * rb), 0xff);
    std::vector<float> row(kQk);
    for (int64_t i = 0; i < used; ++i) {
      const int64_t slot = h.kv_indices[i];
      for (int d = 0; d < kQk; ++d) row[d] = Bf16ToFloat(h.kv[slot * kQk + d]);
      KvFp8EncodeRow(row.data(), kV, kQk - kV, kKvFp8Group, h.kv8.data() + slot * rb);
    }
  }
  return h;
}

// Worst per-(row, head) errors of one case.
struct Errors {
  double rel_l2 = 0;       // max over (row, head) of |out - ref| / |ref| (L2 over 512 columns)
  double max_abs = 0;      // max over (row, head) of max |out - ref| / max(1, max |ref|)
  double lse_max_abs = 0;  // max |lse - ref| / max(1, |ref|)
  int64_t nan_mismatch = 0, inf_mismatch = 0, lse_mismatch = 0;
  int64_t worst_row = -1;  // folded row (row * heads + head) of rel_l2
};

// Per (row, head) comparison of bf16 outputs [rows, 512] (and fp32 LSE [rows] when given).
void CompareRows(const std::vector<bf16_bits>& out, const std::vector<bf16_bits>& ref,
                 const std::vector<float>* lse, const std::vector<float>* ref_lse, Errors* err) {
  const size_t rows = ref.size() / kV;
  for (size_t r = 0; r < rows; ++r) {
    double num = 0, den = 0, row_abs = 0, ref_max = 0;
    for (int c = 0; c < kV; ++c) {
      const float a = Bf16ToFloat(out[r * kV + c]);
      const float e = Bf16ToFloat(ref[r * kV + c]);
      if (std::isnan(a) != std::isnan(e)) {
        ++err->nan_mismatch;
        continue;
      }
      if (std::isinf(a) != std::isinf(e) || (std::isinf(a) && a != e)) {
        ++err->inf_mismatch;
        continue;
      }
      if (!std::isfinite(a)) continue;
      const double d = static_cast<double>(a) - e;
      num += d * d;
      den += static_cast<double>(e) * e;
      row_abs = std::max(row_abs, std::abs(d));
      ref_max = std::max(ref_max, static_cast<double>(std::abs(e)));
    }
    // Rows that see nothing are exactly 0 in both: compare absolutely there.
    const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    if (rel > err->rel_l2) {
      err->rel_l2 = rel;
      err->worst_row = static_cast<int64_t>(r);
    }
    err->max_abs = std::max(err->max_abs, row_abs / std::max(1.0, ref_max));
  }
  if (lse == nullptr) return;
  for (size_t i = 0; i < ref_lse->size(); ++i) {
    const float a = (*lse)[i], e = (*ref_lse)[i];
    if (std::isnan(a) != std::isnan(e) || std::isinf(a) != std::isinf(e) ||
        (std::isinf(a) && a != e)) {
      ++err->lse_mismatch;
      continue;
    }
    if (std::isfinite(a)) {
      err->lse_max_abs =
          std::max<double>(err->lse_max_abs, std::abs(a - e) / std::max(1.0f, std::abs(e)));
    }
  }
}

// The scalar fields of a batch's params (pointers left null).
VerifyAttentionParams ScalarParams(const HostBatch& h) {
  VerifyAttentionParams p;
  p.batch = h.batch;
  p.total_rows = h.total_rows;
  p.num_heads = h.heads;
  p.softmax_scale = h.scale;
  p.dtype = DType::kBFloat16;
  p.kv_slots = h.kv_slots;
  p.kv_fp8 = h.kv_fp8;
  p.mask_words = h.mask_words;
  return p;
}

// A batch's device copies (inputs uploaded by Upload) and its outputs, poisoned with NaN
// (0xff bytes): out [rows, heads, 512] bf16, lse [rows, heads] fp32.
struct DeviceBatch {
  DevBuf q, kv, q_indptr, kv_indptr, kv_indices, mask, out, lse;
  explicit DeviceBatch(const HostBatch& h)
      : q(h.q.size() * 2),
        kv(h.kv_bytes()),
        q_indptr(h.q_indptr.size() * 4),
        kv_indptr(h.kv_indptr.size() * 4),
        kv_indices(h.kv_indices.size() * 4),
        mask(h.mask.size() * 8),
        out(static_cast<size_t>(h.total_rows) * h.heads * kV * 2),
        lse(static_cast<size_t>(h.total_rows) * h.heads * 4) {}
  void Upload(const HostBatch& h) {
    ASSERT_NE(kv.p, nullptr);
    CUDA_ASSERT(cudaMemcpy(q.p, h.q.data(), q.bytes, cudaMemcpyHostToDevice));
    CUDA_ASSERT(cudaMemcpy(kv.p, h.kv_data(), kv.bytes, cudaMemcpyHostToDevice));
    CUDA_ASSERT(cudaMemcpy(q_indptr.p, h.q_indptr.data(), q_indptr.bytes, cudaMemcpyHostToDevice));
    CUDA_ASSERT(
        cudaMemcpy(kv_indptr.p, h.kv_indptr.data(), kv_indptr.bytes, cudaMemcpyHostToDevice));
    CUDA_ASSERT(
        cudaMemcpy(kv_indices.p, h.kv_indices.data(), kv_indices.bytes, cudaMemcpyHostToDevice));
    CUDA_ASSERT(cudaMemcpy(mask.p, h.mask.data(), mask.bytes, cudaMemcpyHostToDevice));
    CUDA_ASSERT(cudaMemset(out.p, 0xff, out.bytes));
    CUDA_ASSERT(cudaMemset(lse.p, 0xff, lse.bytes));
  }
};

// Runs the CUDA path on a batch: device copies, outputs and the whole workspace poisoned with
// NaN (0xff bytes) before the plan upload writes the work lists (a partial row the kernel
// fails to write reaches the output as NaN). max_partial_rows > 0: a workspace of that many
// partial rows (else the default one). opt.host_tree_mask is set to the batch's mask.
void RunCuda(const HostBatch& h, VerifyPlanOptions opt, bool with_lse, int64_t max_partial_rows,
             std::vector<bf16_bits>* out, std::vector<float>* lse) {
  DeviceBatch d(h);
  ASSERT_NO_FATAL_FAILURE(d.Upload(h));
  VerifyAttentionParams dp = ScalarParams(h);
  dp.q = d.q.p;
  dp.kv = d.kv.p;
  dp.q_indptr = d.q_indptr.as<int32_t>();
  dp.kv_indptr = d.kv_indptr.as<int32_t>();
  dp.kv_indices = d.kv_indices.as<int32_t>();
  dp.tree_mask = d.mask.as<uint64_t>();
  dp.out = d.out.p;
  dp.lse = with_lse ? d.lse.as<float>() : nullptr;

  auto dev = VerifyAttentionDeviceInfo::Query();
  ASSERT_TRUE(dev.ok()) << dev.status();
  // A small workspace: few partial rows and index entries, so positional plans need passes.
  auto ws = max_partial_rows > 0
                ? VerifyAttentionWorkspace::Allocate(1 << 18, 1 << 16, max_partial_rows, 1 << 16,
                                                     max_partial_rows * 8)
                : VerifyAttentionWorkspace::AllocateDefault(kStagedKeys);
  ASSERT_TRUE(ws.ok()) << ws.status();
  opt.host_tree_mask = h.mask.data();
  auto plan = PlanVerifyAttention(dp, h.q_indptr.data(), h.kv_indptr.data(), *dev, *ws, opt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  CUDA_ASSERT(cudaMemset(ws->device, 0xff, ws->bytes));
  ASSERT_TRUE(UploadVerifyAttentionPlan(*plan, *ws, nullptr).ok());
  const absl::Status st = VerifyAttentionCuda(dp, *plan, *ws);
  ASSERT_TRUE(st.ok()) << st;
  CUDA_ASSERT(cudaDeviceSynchronize());
  if (plan->shared_packs > 0) {
    std::printf("  shared prefixes: %d packs, %lld key reads saved, %zu work items\n",
                plan->shared_packs, static_cast<long long>(plan->shared_reads_saved),
                plan->work.size());
  }
  if (max_partial_rows > 0 && plan->max_splits > 1) {
    std::printf("  positional plan: %zu work items, %zu passes\n", plan->work.size(),
                plan->passes.size());
  }
  out->resize(d.out.bytes / 2);
  lse->resize(d.lse.bytes / 4);
  CUDA_ASSERT(cudaMemcpy(out->data(), d.out.p, d.out.bytes, cudaMemcpyDeviceToHost));
  CUDA_ASSERT(cudaMemcpy(lse->data(), d.lse.p, d.lse.bytes, cudaMemcpyDeviceToHost));
  ASSERT_TRUE(ws->Free().ok());
}

// Runs the fallback attention (kernels/cuda/dense/fallback_attention.h, the engine's path for
// latent widths other than 576) on a batch, output poisoned with NaN first.
void RunFallback(const HostBatch& h, std::vector<bf16_bits>* out) {
  DeviceBatch d(h);
  ASSERT_NO_FATAL_FAILURE(d.Upload(h));
  kernels::cuda::FallbackAttentionParams p;
  p.batch = h.batch;
  p.total_rows = h.total_rows;
  p.num_heads = h.heads;
  p.qk_dim = kQk;
  p.v_dim = kV;
  p.softmax_scale = h.scale;
  p.q = d.q.p;
  p.kv = d.kv.p;
  p.kv_fp8 = h.kv_fp8;
  p.q_indptr = d.q_indptr.as<int32_t>();
  p.kv_indptr = d.kv_indptr.as<int32_t>();
  p.kv_indices = d.kv_indices.as<int32_t>();
  p.tree_mask = d.mask.as<uint64_t>();
  p.mask_words = h.mask_words;
  p.out = d.out.p;
  const absl::Status st = kernels::cuda::FallbackAttentionCuda(p);
  ASSERT_TRUE(st.ok()) << st;
  CUDA_ASSERT(cudaDeviceSynchronize());
  out->resize(d.out.bytes / 2);
  CUDA_ASSERT(cudaMemcpy(out->data(), d.out.p, d.out.bytes, cudaMemcpyDeviceToHost));
}

// The C++ reference on a batch's host copies: out (NaN-initialised) and, when lse is given,
// the log-sum-exp rows.
void RunReference(const HostBatch& h, std::vector<bf16_bits>* out, std::vector<float>* lse) {
  out->assign(static_cast<size_t>(h.total_rows) * h.heads * kV, kBf16NaN);
  if (lse != nullptr) lse->assign(static_cast<size_t>(h.total_rows) * h.heads, NAN);
  VerifyAttentionParams rp = ScalarParams(h);
  rp.q = h.q.data();
  rp.kv = h.kv_data();
  rp.q_indptr = h.q_indptr.data();
  rp.kv_indptr = h.kv_indptr.data();
  rp.kv_indices = h.kv_indices.data();
  rp.tree_mask = h.mask.data();
  rp.out = out->data();
  rp.lse = lse != nullptr ? lse->data() : nullptr;
  ASSERT_TRUE(VerifyAttentionReference(rp).ok());
}

// Runs the reference and the CUDA path for one case; returns the errors.
void RunCase(const Case& c, Errors* err) {
  const HostBatch h = MakeBatch(c);
  std::vector<bf16_bits> ref_out;
  std::vector<float> ref_lse;
  ASSERT_NO_FATAL_FAILURE(RunReference(h, &ref_out, c.with_lse ? &ref_lse : nullptr));

  std::vector<bf16_bits> out;
  std::vector<float> lse;
  VerifyPlanOptions opt;
  opt.config = c.config;
  opt.max_splits = c.max_splits;
  opt.positional = c.positional;
  opt.positional_shared_context = c.shared_context;
  opt.positional_split_group = c.split_group;
  if (c.prefix > 0) opt.host_kv_indices = h.kv_indices.data();
  ASSERT_NO_FATAL_FAILURE(RunCuda(h, opt, c.with_lse, c.max_partial_rows, &out, &lse));
  CompareRows(out, ref_out, c.with_lse ? &lse : nullptr, c.with_lse ? &ref_lse : nullptr, err);
}

// Tolerances for dtype bf16, per (row, head): inputs and output are bf16 (8-bit mantissa), P
// is rounded to bf16 before the PV product; accumulation is fp32 in both. Outputs are
// averages of values in [-1, 1] (or a sentinel row, +-3e4, for the rows that see it), so the
// max-abs error is relative to max(1, the row's largest reference value).
constexpr double kRelL2Tol = 2e-2;
constexpr double kMaxAbsTol = 3e-2;
constexpr double kLseTol = 2e-3;  // relative to max(1, |lse|): fp32 scores, other order
// FP8 cache: the kernels round each dequantized key to bf16 (e4m3 x scale has up to 11
// significant bits), the reference keeps it in fp32: a score moves by ~2^-9 of |q| |k| (about
// 2e-3 here), which the LSE shows (measured up to 3.4e-3 on an H200); the outputs stay
// within the bf16 tolerances above.
constexpr double kLseTolFp8 = 1e-2;

void ExpectCase(const Case& c) {
  SCOPED_TRACE(c.Name());
  Errors e;
  RunCase(c, &e);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_EQ(e.nan_mismatch, 0);
  EXPECT_EQ(e.inf_mismatch, 0);
  EXPECT_EQ(e.lse_mismatch, 0);
  EXPECT_LE(e.max_abs, kMaxAbsTol);
  EXPECT_LE(e.lse_max_abs, c.kv_fp8 ? kLseTolFp8 : kLseTol);
  EXPECT_LE(e.rel_l2, kRelL2Tol) << "worst folded row " << e.worst_row;
  std::printf("  %-70s rel_l2 %.2e max_abs %.2e lse %.2e\n", c.Name().c_str(), e.rel_l2, e.max_abs,
              e.lse_max_abs);
  std::fflush(stdout);  // a run cut by a timeout still shows how far it got
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
        case 0:
          ctx = 0;
          break;
        case 1:
          ctx = static_cast<int>(rng() % 64);
          break;
        case 2:
          ctx = static_cast<int>(rng() % 2048);
          break;
        default:
          ctx = static_cast<int>(rng() % 20000);
          break;
      }
      const int64_t cap = budget / batch / (int64_t{n} * c.heads);
      c.nodes.push_back(n);
      c.ctx.push_back(static_cast<int>(std::min<int64_t>(ctx, cap)));
    }
    c.seed = 1000 + i;
    c.with_lse = (i % 5) != 3;
    c.empty_rows = (i % 7) == 2;
    // auto (the seesaw wgmma kernel on sm_90 except tiny decode, mma.sync 16-row elsewhere),
    // and each configuration forced: mma.sync 16-row everywhere, seesaw on sm_90.
    switch (i % 3) {
      case 1:
        c.config = VerifyKernelConfig::kM16;
        break;
      case 2:
        c.config = dev_is_sm90 ? VerifyKernelConfig::kS64 : VerifyKernelConfig::kAuto;
        break;
      default:
        c.config = VerifyKernelConfig::kAuto;
        break;
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
  CUDA_ASSERT(
      cudaMemcpy(didx.p, h.kv_indices.data(), h.kv_indices.size() * 4, cudaMemcpyHostToDevice));
  CUDA_ASSERT(cudaMemcpy(dmask.p, h.mask.data(), h.mask.size() * 8, cudaMemcpyHostToDevice));
  cudaStream_t stream;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  VerifyAttentionParams p = ScalarParams(h);
  p.q = dq.p;
  p.kv = dkv.p;
  p.kv_indices = didx.as<int32_t>();
  p.tree_mask = dmask.as<uint64_t>();
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
  {
    // The launch runs the variant the plan carries: a plan without one, or whose variant is
    // not its configuration's, is refused before anything runs.
    VerifyAttentionPlan bad = *plan;
    bad.variant = -1;
    p.out = dout.p;
    EXPECT_EQ(VerifyAttentionCuda(p, bad, *ws).code(), absl::StatusCode::kFailedPrecondition);
    bad.variant = plan->variant;
    bad.rows_per_cta = plan->rows_per_cta * 2;
    EXPECT_EQ(VerifyAttentionCuda(p, bad, *ws).code(), absl::StatusCode::kFailedPrecondition);
  }

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
// Shared-prefix plans (forks of one context read once per pack of requests) against the
// reference: decode forks and draft trees with their own context after the prefix, strangers
// between groups, both configurations; the KV slots nobody reads are NaN, the workspace
// poisoned, so a wrong key range or partial row shows.
TEST(VerifyAttentionCuda, SharedPrefixMatchesReference) {
  SKIP_WITHOUT_GPU();
  std::vector<Case> cases;
  {
    Case c;  // 32 decode forks of one 8,192-key context, 8 heads
    c.heads = 8;
    c.nodes.assign(32, 1);
    c.ctx.assign(32, 8192);
    c.prefix = 8192;
    c.seed = 21;
    cases.push_back(c);
  }
  {
    Case c;  // trees of 1-4 nodes, own context after a 5,000-key prefix, two strangers
    c.heads = 16;
    std::mt19937 rng(22);
    for (int b = 0; b < 12; ++b) {
      c.nodes.push_back(1 + static_cast<int>(rng() % 4));
      c.ctx.push_back(5000 + static_cast<int>(rng() % 1500));
      c.shared.push_back(b != 4 && b != 9);
    }
    c.prefix = 5000;
    c.seed = 22;
    cases.push_back(c);
  }
  {
    Case c = cases[0];  // the 16-row configuration: packs of two forks
    c.nodes.assign(8, 1);
    c.ctx.assign(8, 3000);
    c.prefix = 3000;
    c.config = VerifyKernelConfig::kM16;
    c.seed = 23;
    cases.push_back(c);
  }
  for (const Case& c : cases) ExpectCase(c);
}

// The FP8 latent cache (kernels/kv_fp8.h): the 16-row FP8 variant of the device (on sm_90
// two CTAs per SM, Q in shared memory) against the reference over the same stored bytes: head /
// node grid, splits, a long context, positional plans (and their passes), shared prefixes, rows
// that see nothing. The rows nobody lists are NaN codes and scales; the sentinel leaf keys (+-3e4)
// are stored exactly.
TEST(VerifyAttentionCuda, Fp8CacheMatchesReference) {
  SKIP_WITHOUT_GPU();
  std::vector<Case> cases;
  uint64_t seed = 700;
  for (int heads : {1, 8, 16, 64, 128}) {
    for (int nodes : {1, 2, 16, 65}) {
      Case c;
      c.heads = heads;
      const int ctx = static_cast<int>(std::min<int64_t>(3000, 6'000'000 / (heads * nodes)));
      c.nodes = {nodes, std::max(1, nodes / 2)};
      c.ctx = {ctx, ctx / 3 + 5};
      c.seed = seed++;
      cases.push_back(c);
    }
  }
  {
    Case c;  // one long decode row: many splits and the combine
    c.heads = 16;
    c.nodes = {1};
    c.ctx = {70000};
    c.seed = seed++;
    cases.push_back(c);
  }
  {
    Case c;  // mixed batch, few splits allowed
    c.heads = 8;
    c.nodes = {4, 1, 9, 2, 1};
    c.ctx = {1200, 33, 5000, 0, 777};
    c.max_splits = 3;
    c.seed = seed++;
    cases.push_back(c);
  }
  {
    Case c;  // positional plans, shared context, passes through a small workspace
    c.heads = 16;
    c.nodes = {7, 1, 3};
    c.ctx = {9000, 2500, 40};
    c.positional = true;
    c.shared_context = true;
    c.max_partial_rows = 512;  // a 9,000-key node: 18 splits x 16 rows
    c.seed = seed++;
    cases.push_back(c);
    c.shared_context = false;
    c.max_partial_rows = 0;
    c.seed = seed++;
    cases.push_back(c);
  }
  {
    Case c;  // forks sharing an 8,192-key prefix
    c.heads = 8;
    c.nodes.assign(16, 1);
    c.ctx.assign(16, 8192);
    c.prefix = 8192;
    c.seed = seed++;
    cases.push_back(c);
  }
  {
    Case c;  // random masks: rows that see no tail key (some see nothing at all)
    c.heads = 8;
    c.nodes = {5, 3};
    c.ctx = {0, 100};
    c.empty_rows = true;
    c.seed = seed++;
    cases.push_back(c);
  }
  auto dev = VerifyAttentionDeviceInfo::Query();
  ASSERT_TRUE(dev.ok());
  // Every case with kAuto (on sm_90 the keys-on-M kernel; positional plans: PositionalConfigFor,
  // the 16-row one); the 16-row FP8 variant forced on every third case and the positional ones;
  // on sm_90 the keys-on-M kernel forced on the positional ones and the seesaw FP8 variant (kS64)
  // on every third case (another third) and a positional one.
  for (size_t i = 0; i < cases.size(); ++i) {
    Case c = cases[i];
    c.kv_fp8 = true;
    ExpectCase(c);
    if (i % 3 == 0 || c.positional) {
      c.config = VerifyKernelConfig::kM16;
      ExpectCase(c);
    }
    if (c.positional && dev->cc_major == 9) {
      c.config = VerifyKernelConfig::kKm16;
      ExpectCase(c);
    }
    // (Not with the positional case's 512-row workspace: a 64-row variant needs 64 partial rows
    // per split, and the plan says so: RESOURCE_EXHAUSTED.)
    const bool s64_fits = !(c.positional && c.max_partial_rows > 0);
    if ((i % 3 == 1 || c.positional) && s64_fits && dev->cc_major == 9) {
      c.config = VerifyKernelConfig::kS64;
      ExpectCase(c);
    }
    // The staged configuration (bf16 rows staged in the workspace; not positional).
    if ((i % 3 == 2 || c.prefix > 0) && !c.positional && dev->cc_major == 9) {
      c.config = VerifyKernelConfig::kS64Staged;
      ExpectCase(c);
    }
  }
}

// The fallback attention over an FP8 cache against the reference (same bytes).
TEST(VerifyAttentionCuda, FallbackFp8CacheMatchesReference) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.heads = 8;
  c.nodes = {9, 1, 3};
  c.ctx = {1500, 4000, 0};
  c.seed = 4401;
  c.kv_fp8 = true;
  const HostBatch h = MakeBatch(c);
  std::vector<bf16_bits> out, ref_out;
  ASSERT_NO_FATAL_FAILURE(RunFallback(h, &out));
  ASSERT_NO_FATAL_FAILURE(RunReference(h, &ref_out, nullptr));
  Errors err;
  CompareRows(out, ref_out, nullptr, nullptr, &err);
  std::printf("  fallback, FP8 cache: rel_l2 %.2e max_abs %.2e\n", err.rel_l2, err.max_abs);
  EXPECT_EQ(err.nan_mismatch, 0);
  EXPECT_LT(err.rel_l2, kRelL2Tol);
  EXPECT_LT(err.max_abs, kMaxAbsTol);
}

bool SkipUnlessSm90() {
  auto dev = VerifyAttentionDeviceInfo::Query();
  return !dev.ok() || dev->cc_major != 9;
}

// A spread of key magnitudes within a tile (the per-tile power of two of P_g moves; FP8 scales
// 2^-29 .. 2^3): 16 heads, requests of `nodes` rows over `ctx` context keys each.
void ExpectScaleSpreadCase(const Case& base, std::vector<int> nodes, std::vector<int> ctx,
                           uint64_t& seed) {
  Case c = base;
  c.heads = 16;
  c.nodes = std::move(nodes);
  c.ctx = std::move(ctx);
  c.kv_scale_spread = true;
  c.seed = seed++;
  ExpectCase(c);
}

// The keys-on-M FP8 kernel (sm_90a) at its tile and warpgroup boundaries: key counts around
// 64 (one tile per warpgroup) and 128 / 256 (both warpgroups, odd and even tile counts), 1 to
// 16 rows in a CTA, unsplit and split; scales spanning 2^-20 .. 2^12 within a tile.
TEST(VerifyAttentionCuda, KeysOnMFp8Edges) {
  SKIP_WITHOUT_GPU();
  if (SkipUnlessSm90()) GTEST_SKIP() << "the keys-on-M kernel is sm_90a only";
  uint64_t seed = 9100;
  for (int keys : {1, 63, 64, 65, 127, 128, 129, 191, 256, 257, 700}) {
    for (int heads : {1, 3, 8, 16}) {
      Case c;
      c.heads = heads;
      c.nodes = {heads == 16 ? 1 : 2};
      c.ctx = {keys};
      c.kv_fp8 = true;
      c.config = VerifyKernelConfig::kKm16;
      c.max_splits = keys > 256 ? 3 : 1;
      c.seed = seed++;
      ExpectCase(c);
    }
  }
  Case base;
  base.kv_fp8 = true;
  base.config = VerifyKernelConfig::kKm16;
  ExpectScaleSpreadCase(base, {1, 3}, {5000, 900}, seed);
}

// Edge-case groups of the seesaw kernels' tests, each case built on `base` (config, cache
// format) with seeds taken in order from `seed`.
// Key counts (context + tail) around the tile (64) and pair (128) boundaries, unsplit so the
// CTA sees exactly this many keys, then the planner's own split of the same batch.
void ExpectKeyCountEdges(const Case& base, std::initializer_list<int> key_counts, uint64_t& seed) {
  for (int keys : key_counts) {
    for (int max_splits : {1, 0}) {
      Case c = base;
      c.heads = 16;
      const int n = std::min(keys, 16);
      c.nodes = {n, 1};
      c.ctx = {keys - n, keys + 40};
      c.seed = seed++;
      c.max_splits = max_splits;
      ExpectCase(c);
    }
  }
}
// Rows that see no key (random masks), with and without context.
void ExpectEmptyRowEdges(const Case& base, uint64_t& seed) {
  for (int ctx : {0, 100}) {
    Case c = base;
    c.heads = 16;
    c.nodes = {9, 30, 1};
    c.ctx = {ctx, ctx, 0};
    c.empty_rows = true;
    c.seed = seed++;
    ExpectCase(c);
  }
}
// Partial row tiles: one request of `heads` x `nodes` rows over `ctx` context keys each.
void ExpectRowTileEdges(const Case& base, std::initializer_list<std::tuple<int, int, int>> shapes,
                        uint64_t& seed) {
  for (auto [heads, nodes, ctx] : shapes) {
    Case c = base;
    c.heads = heads;
    c.nodes = {nodes};
    c.ctx = {ctx};
    c.seed = seed++;
    ExpectCase(c);
  }
}

// The seesaw FP8 variant (kS64 with an FP8 cache: f16 tiles its producer converts from the
// stored rows) at its tile, pair and warp boundaries: key counts around 64 / 128 and the
// producer's 16-row warp slices, 1 to 128 heads (partial row tiles), unsplit and split,
// rows that see no key, and key magnitudes spanning 2^-20 .. 2^12 (scales 2^-29 .. 2^3: the
// fp32 conversion path below 2^-14).
TEST(VerifyAttentionCuda, SeesawFp8Edges) {
  SKIP_WITHOUT_GPU();
  if (SkipUnlessSm90()) GTEST_SKIP() << "the seesaw schedule is sm_90a only";
  uint64_t seed = 9300;
  Case base;
  base.kv_fp8 = true;
  base.config = VerifyKernelConfig::kS64;
  ExpectKeyCountEdges(base, {1, 16, 17, 63, 64, 65, 127, 128, 129, 192, 193, 700}, seed);
  ExpectRowTileEdges(base, {{1, 1, 200}, {3, 7, 500}, {1, 65, 1000}, {128, 65, 60}, {128, 1, 4000}},
                     seed);
  ExpectEmptyRowEdges(base, seed);
  ExpectScaleSpreadCase(base, {4, 3}, {5000, 900}, seed);
}

// The staged FP8 configuration (kS64Staged: the batch's keys dequantized into bf16 rows of the
// workspace, then the bf16 seesaw kernel) at the same edges, plus a batch of requests.
TEST(VerifyAttentionCuda, StagedFp8Edges) {
  SKIP_WITHOUT_GPU();
  if (SkipUnlessSm90()) GTEST_SKIP() << "the seesaw schedule is sm_90a only";
  uint64_t seed = 9400;
  Case base;
  base.kv_fp8 = true;
  base.config = VerifyKernelConfig::kS64Staged;
  ExpectKeyCountEdges(base, {1, 17, 63, 64, 65, 129, 700}, seed);
  ExpectRowTileEdges(base, {{1, 1, 200}, {3, 7, 500}, {128, 65, 60}, {128, 1, 4000}}, seed);
  ExpectEmptyRowEdges(base, seed);
  ExpectScaleSpreadCase(base, {4, 3, 16, 1}, {5000, 900, 3000, 0}, seed);
}

// Small shapes (quick under compute-sanitizer): tile / pair boundaries and empty rows.
TEST(VerifyAttentionCuda, SeesawScheduleEdges) {
  SKIP_WITHOUT_GPU();
  if (SkipUnlessSm90()) GTEST_SKIP() << "the seesaw schedule is sm_90a only";
  uint64_t seed = 5000;
  Case base;
  base.config = VerifyKernelConfig::kS64;
  ExpectKeyCountEdges(base, {1, 16, 63, 64, 65, 127, 128, 129, 191, 192, 193, 320}, seed);
  ExpectEmptyRowEdges(base, seed);
  // 1, 21 and 65 folded rows (the last tile of 65 holds one row), and 128 heads x 65 nodes =
  // 130 row tiles over 125 keys.
  ExpectRowTileEdges(base, {{1, 1, 200}, {3, 7, 500}, {1, 65, 1000}, {128, 65, 60}}, seed);
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

// ---- Positional plans: the batch-invariant mode ---------------------------------------------

// Against the reference: random trees and random (non-tree) masks, head counts that fill a
// tile or not, contexts that need 1..32 splits, and a workspace so small that the plan runs
// in several passes; the 16-row kernel and (sm_90) the seesaw kernel.
TEST(VerifyAttentionCuda, PositionalMatchesReference) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 900;
  const int64_t kSmall = 6000;  // partial rows (x 8 index entries): several passes
  struct Shape {
    int heads;
    std::vector<int> nodes, ctx;
    bool empty_rows;
    int64_t max_partial_rows;
  };
  const Shape shapes[] = {
      {8, {1}, {1000}, false, 0},
      {16, {1, 16, 65}, {0, 4095, 300}, false, 0},
      {40, {5, 33}, {4097, 20000}, false, 0},
      {64, {17, 2, 9}, {70000, 100, 12345}, false, kSmall},
      {8, {64, 3}, {33, 5000}, true, 0},
      {128, {4, 1}, {9000, 30000}, false, kSmall},
      {24, {9, 1}, {1000, 3000}, false, 0},  // one pass: index lists built in the plain launch
  };
  const bool sm90 = !SkipUnlessSm90();
  for (const Shape& sh : shapes) {
    for (const VerifyKernelConfig config : {VerifyKernelConfig::kM16, VerifyKernelConfig::kS64}) {
      if (config == VerifyKernelConfig::kS64 && !sm90) continue;
      // mode 2: seesaw with split groups forced (two context splits per work item).
      for (const int mode : {0, 1, 2}) {
        if (mode == 2 && config != VerifyKernelConfig::kS64) continue;
        Case c;
        c.heads = sh.heads;
        c.nodes = sh.nodes;
        c.ctx = sh.ctx;
        c.empty_rows = sh.empty_rows;
        c.seed = seed++;
        c.config = config;
        c.positional = true;
        c.shared_context = mode == 1;
        c.split_group = mode == 2 ? 2 : -1;
        c.max_partial_rows = sh.max_partial_rows;
        ExpectCase(c);
      }
    }
  }
}

// The chains of a tree batch: one request per tree node (in reverse order) holding the
// node's context, its visible tail rows (ancestors) as context and itself as the only tail
// row; then two unrelated requests from another random batch (slots moved past the tree's).
// source_row[i]: the tree row of chain row i (-1: unrelated).
HostBatch ChainsOf(const HostBatch& tree, int heads, std::vector<int>* source_row_out) {
  std::vector<int>& source_row = *source_row_out;
  Case other_case;
  other_case.heads = heads;
  other_case.nodes = {12, 1};
  other_case.ctx = {777, 30000};
  other_case.seed = 99;
  const HostBatch other = MakeBatch(other_case);
  HostBatch chain;
  chain.heads = heads;
  chain.scale = tree.scale;
  chain.kv_slots = tree.kv_slots + other.kv_slots;
  chain.kv = tree.kv;
  chain.kv.insert(chain.kv.end(), other.kv.begin(), other.kv.end());
  chain.q_indptr = {0};
  chain.kv_indptr = {0};
  for (int r = tree.total_rows - 1; r >= 0; --r) {
    const int b = static_cast<int>(std::upper_bound(tree.q_indptr.begin(), tree.q_indptr.end(), r) -
                                   tree.q_indptr.begin()) -
                  1;
    const int n = tree.q_indptr[b + 1] - tree.q_indptr[b];
    const int ctx = tree.kv_indptr[b + 1] - tree.kv_indptr[b] - n;
    const int t = r - tree.q_indptr[b];
    const int32_t* slots = tree.kv_indices.data() + tree.kv_indptr[b];
    chain.kv_indices.insert(chain.kv_indices.end(), slots, slots + ctx);
    const uint64_t* m = tree.mask.data() + static_cast<size_t>(r) * tree.mask_words;
    for (int j = 0; j < t; ++j) {
      if ((m[j / 64] >> (j % 64)) & 1) chain.kv_indices.push_back(slots[ctx + j]);
    }
    chain.kv_indices.push_back(slots[ctx + t]);
    chain.q.insert(chain.q.end(), tree.q.begin() + static_cast<size_t>(r) * heads * kQk,
                   tree.q.begin() + static_cast<size_t>(r + 1) * heads * kQk);
    chain.mask.push_back(1);
    chain.mask.push_back(0);
    chain.q_indptr.push_back(chain.q_indptr.back() + 1);
    chain.kv_indptr.push_back(static_cast<int32_t>(chain.kv_indices.size()));
    source_row.push_back(r);
  }
  for (int b = 0; b < other.batch; ++b) {
    for (int i = other.kv_indptr[b]; i < other.kv_indptr[b + 1]; ++i) {
      chain.kv_indices.push_back(other.kv_indices[i] + static_cast<int32_t>(tree.kv_slots));
    }
    for (int r = other.q_indptr[b]; r < other.q_indptr[b + 1]; ++r) {
      chain.mask.push_back(other.mask[2 * r]);
      chain.mask.push_back(other.mask[2 * r + 1]);
      source_row.push_back(-1);
    }
    chain.q.insert(chain.q.end(),
                   other.q.begin() + static_cast<size_t>(other.q_indptr[b]) * heads * kQk,
                   other.q.begin() + static_cast<size_t>(other.q_indptr[b + 1]) * heads * kQk);
    chain.q_indptr.push_back(chain.q_indptr.back() + other.q_indptr[b + 1] - other.q_indptr[b]);
    chain.kv_indptr.push_back(static_cast<int32_t>(chain.kv_indices.size()));
  }
  chain.batch = static_cast<int>(chain.q_indptr.size()) - 1;
  chain.total_rows = chain.q_indptr.back();
  return chain;
}

// The point of the configuration: a draft-tree node's output and LSE are bit-identical to the
// same query decoded as a one-row chain (context = the request's context + the node's
// ancestors, in order), whatever else shares the batch: the chains of every node of several
// trees run together in one batch, in reverse order, next to unrelated requests, and with a
// workspace small enough to need passes. On the seesaw kernel the tree runs with split groups
// forced (3 context splits per work item: VerifyWorkItem::split_keys) and the chains with one
// split per item, so grouped splits are checked bit-identical to ungrouped ones too.
TEST(VerifyAttentionCuda, PositionalTreeEqualsChain) {
  SKIP_WITHOUT_GPU();
  const bool sm90 = !SkipUnlessSm90();
  for (const auto& [heads, config] :
       std::vector<std::pair<int, VerifyKernelConfig>>{{8, VerifyKernelConfig::kM16},
                                                       {24, VerifyKernelConfig::kM16},
                                                       {8, VerifyKernelConfig::kS64},
                                                       {16, VerifyKernelConfig::kS64},
                                                       {64, VerifyKernelConfig::kS64},
                                                       {128, VerifyKernelConfig::kS64}}) {
    if (config == VerifyKernelConfig::kS64 && !sm90) continue;
    for (const bool shared : {false, true}) {
      Case c;
      c.heads = heads;
      c.nodes = {33, 1, 65, 7};
      c.ctx = {4000, 70000, 100, 9000};
      c.seed = 1234 + heads;
      const HostBatch tree = MakeBatch(c);
      std::vector<bf16_bits> tree_out;
      std::vector<float> tree_lse;
      VerifyPlanOptions opt;
      opt.config = config;
      opt.positional = true;
      opt.positional_shared_context = shared;
      VerifyPlanOptions tree_opt = opt;
      if (config == VerifyKernelConfig::kS64) tree_opt.positional_split_group = 3;
      ASSERT_NO_FATAL_FAILURE(RunCuda(tree, tree_opt, true, 0, &tree_out, &tree_lse));

      std::vector<int> source_row;  // tree row of each chain row (-1: unrelated)
      const HostBatch chain = ChainsOf(tree, heads, &source_row);
      std::vector<bf16_bits> chain_out;
      std::vector<float> chain_lse;
      opt.positional_split_group = 0;
      ASSERT_NO_FATAL_FAILURE(RunCuda(chain, opt, true, 5000, &chain_out, &chain_lse));

      int64_t differing = 0, compared = 0;
      for (size_t i = 0; i < source_row.size(); ++i) {
        const int r = source_row[i];
        if (r < 0) continue;
        for (int h = 0; h < heads; ++h) {
          const size_t a = (static_cast<size_t>(r) * heads + h), z = (i * heads + h);
          ++compared;
          const bool same_out =
              std::equal(tree_out.begin() + a * kV, tree_out.begin() + (a + 1) * kV,
                         chain_out.begin() + z * kV);
          const bool same_lse = std::memcmp(&tree_lse[a], &chain_lse[z], sizeof(float)) == 0;
          if (!same_out || !same_lse) ++differing;
        }
      }
      std::printf("  heads %d, config %d%s: %lld (row, head) pairs, %lld differ from their chain\n",
                  heads, static_cast<int>(config), shared ? " shared context" : "",
                  static_cast<long long>(compared), static_cast<long long>(differing));
      EXPECT_EQ(compared, static_cast<int64_t>(tree.total_rows) * heads);
      EXPECT_EQ(differing, 0) << "heads " << heads << " shared " << shared;
    }
  }
}

// The fallback attention is positional too: a tree node's output is bit-identical to the
// same query decoded as a one-row chain next to other requests (its visible keys go to the
// same warps in the same order), and it matches the C++ reference. Many (row, head, column)
// outputs: a kernel whose key order moved with the tree would flip some bf16 roundings.
TEST(VerifyAttentionCuda, FallbackTreeEqualsChainAndReference) {
  SKIP_WITHOUT_GPU();
  for (const int heads : {8, 16}) {
    Case c;
    c.heads = heads;
    c.nodes = {33, 1, 65, 7};
    c.ctx = {2000, 5000, 100, 900};
    c.seed = 4321 + heads;
    const HostBatch tree = MakeBatch(c);
    std::vector<bf16_bits> tree_out, chain_out;
    ASSERT_NO_FATAL_FAILURE(RunFallback(tree, &tree_out));
    std::vector<int> source_row;
    const HostBatch chain = ChainsOf(tree, heads, &source_row);
    ASSERT_NO_FATAL_FAILURE(RunFallback(chain, &chain_out));
    int64_t differing = 0, compared = 0;
    for (size_t i = 0; i < source_row.size(); ++i) {
      const int r = source_row[i];
      if (r < 0) continue;
      for (int h = 0; h < heads; ++h) {
        const size_t a = static_cast<size_t>(r) * heads + h, z = i * heads + h;
        ++compared;
        differing += !std::equal(tree_out.begin() + a * kV, tree_out.begin() + (a + 1) * kV,
                                 chain_out.begin() + z * kV);
      }
    }
    // Against the reference (as the optimised kernel's cases).
    std::vector<bf16_bits> ref_out;
    ASSERT_NO_FATAL_FAILURE(RunReference(tree, &ref_out, nullptr));
    Errors err;
    CompareRows(tree_out, ref_out, nullptr, nullptr, &err);
    std::printf(
        "  fallback, heads %d: %lld (row, head) pairs, %lld differ from their chain; rel_l2 "
        "%.2e max_abs %.2e against the reference\n",
        heads, static_cast<long long>(compared), static_cast<long long>(differing), err.rel_l2,
        err.max_abs);
    EXPECT_EQ(compared, static_cast<int64_t>(tree.total_rows) * heads);
    EXPECT_EQ(differing, 0) << "heads " << heads;
    EXPECT_EQ(err.nan_mismatch, 0);
    EXPECT_LT(err.rel_l2, kRelL2Tol);
    EXPECT_LT(err.max_abs, kMaxAbsTol);
  }
}

}  // namespace
}  // namespace verifyd::kernels::cuda
