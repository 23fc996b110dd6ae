// cuBLAS bf16 GEMM wrapper (see gemm.h). Row-major y = x . w^T is the column-major product
// y^T (n x m) = op(w) (n x k) . x^T (k x m), so w is operand A and x operand B.
#include "kernels/cuda/dense/gemm.h"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"

namespace verifyd::kernels::cuda {
namespace {

// Batch-invariant GEMMs (EnableFixedGemmAlgorithms): per cuBLAS handle, a cuBLASLt handle and,
// per shape class, a reference algorithm (used at every row count: a row's result is then
// independent of m) plus, per row class, the fastest algorithm found whose output equals the
// reference's bit for bit on this device (ChooseRowClasses).
struct ShapeAlgos {
  cublasLtMatmulAlgo_t reference;
  // (largest m of the class, algorithm), ascending; the last class is unbounded.
  std::vector<std::pair<int64_t, cublasLtMatmulAlgo_t>> classes;
  const cublasLtMatmulAlgo_t& For(int64_t m) const {
    for (const auto& c : classes) {
      if (m <= c.first) return c.second;
    }
    return reference;
  }
};

struct FixedAlgos {
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  int64_t max_rows = 0;
  // (transa, n, k, lda, ldb, ldc, strides a/b/c, batch, a type, c type, compute) -> algorithms
  using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                         int64_t, int, int, int, int>;
  std::map<Key, ShapeAlgos> algos;
  bool row_classes = true;              // false: the reference at every m
  std::vector<GemmRowClassChoice> log;  // FixedGemmChoices
  std::mutex mu;
};

std::mutex g_fixed_mu;
std::atomic<int> g_fixed_handles{0};  // handles in the registry: 0 keeps GEMMs lock-free
std::unordered_map<void*, std::unique_ptr<FixedAlgos>>& FixedRegistry() {
  static auto* r = new std::unordered_map<void*, std::unique_ptr<FixedAlgos>>();
  return *r;
}

FixedAlgos* FixedFor(void* handle) {
  if (g_fixed_handles.load(std::memory_order_acquire) == 0) return nullptr;
  std::lock_guard<std::mutex> lock(g_fixed_mu);
  auto& r = FixedRegistry();
  auto it = r.find(handle);
  return it == r.end() ? nullptr : it->second.get();
}

// One column-major GEMM (cuBLAS's convention) C[n, m] = op(A) B through cuBLASLt with the
// handle's pinned algorithm for this shape class (chosen at the first call: the heuristic's
// choice at a reference row count, split-K off, checked against 1 and max_rows rows).
struct LtGemm {
  cublasOperation_t ta = CUBLAS_OP_T;
  int64_t n = 0, m = 0, k = 0;
  const void* a = nullptr;
  cudaDataType_t a_type = CUDA_R_16BF;
  int64_t lda = 0, stride_a = 0;
  const void* b = nullptr;
  int64_t ldb = 0, stride_b = 0;
  void* c = nullptr;
  cudaDataType_t c_type = CUDA_R_32F;
  int64_t ldc = 0, stride_c = 0;
  int batch = 1;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  float alpha = 1.f, beta = 0.f;
};

// The packed row-major y[m, n] = x[m, k] . w[n, k]^T of GemmBf16 / GemmF32 as an LtGemm.
LtGemm DenseLt(int64_t m, int64_t n, int64_t k, const void* w, int64_t ldw, const void* x,
               int64_t ldx, void* y, int64_t ldy) {
  LtGemm g;
  g.n = n;
  g.m = m;
  g.k = k;
  g.a = w;
  g.lda = ldw;
  g.b = x;
  g.ldb = ldx;
  g.c = y;
  g.ldc = ldy;
  return g;
}

struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  ~LtDescs() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

absl::Status MakeDescs(const LtGemm& g, int64_t m, LtDescs* d) {
  VERIFYD_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&d->op, g.compute, CUDA_R_32F));
  const cublasOperation_t tb = CUBLAS_OP_N;
  VERIFYD_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSA, &g.ta, sizeof(g.ta)));
  VERIFYD_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const bool t = g.ta == CUBLAS_OP_T;
  VERIFYD_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&d->a, g.a_type, t ? g.k : g.n, t ? g.n : g.k, g.lda));
  VERIFYD_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d->b, g.a_type, g.k, m, g.ldb));
  VERIFYD_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d->c, g.c_type, g.n, m, g.ldc));
  if (g.batch > 1) {
    const int32_t count = g.batch;
    for (auto [layout, stride] :
         {std::pair{d->a, g.stride_a}, std::pair{d->b, g.stride_b}, std::pair{d->c, g.stride_c}}) {
      VERIFYD_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutSetAttribute(
          layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      VERIFYD_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutSetAttribute(
          layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    }
  }
  return absl::OkStatus();
}

size_t DTypeBytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

// Up to `max` cuBLASLt heuristic choices for g at m rows, split-K forced off, that also run at
// every row count in [lo, hi] (checked at both ends) within the workspace.
std::vector<cublasLtMatmulAlgo_t> Candidates(FixedAlgos& f, const LtGemm& g, int64_t m, int64_t lo,
                                             int64_t hi, int max) {
  std::vector<cublasLtMatmulAlgo_t> out;
  LtDescs ref;
  if (!MakeDescs(g, m, &ref).ok()) return out;
  cublasLtMatmulPreference_t pref = nullptr;
  if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return out;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                       &f.workspace_bytes, sizeof(f.workspace_bytes));
  cublasLtMatmulHeuristicResult_t res[16];
  int found = 0;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(f.lt, ref.op, ref.a, ref.b, ref.c, ref.c,
                                                           pref, 16, res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (hs != CUBLAS_STATUS_SUCCESS) return out;
  for (int i = 0; i < found && static_cast<int>(out.size()) < max; ++i) {
    cublasLtMatmulAlgo_t cand = res[i].algo;
    const int32_t splitk = 1;
    const uint32_t red = CUBLASLT_REDUCTION_SCHEME_NONE;
    cublasLtMatmulAlgoConfigSetAttribute(&cand, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                         sizeof(splitk));
    cublasLtMatmulAlgoConfigSetAttribute(&cand, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red,
                                         sizeof(red));
    bool ok = true;
    for (int64_t rows : {lo, m, hi}) {
      LtDescs d;
      cublasLtMatmulHeuristicResult_t check;
      ok = ok && MakeDescs(g, rows, &d).ok() &&
           cublasLtMatmulAlgoCheck(f.lt, d.op, d.a, d.b, d.c, d.c, &cand, &check) ==
               CUBLAS_STATUS_SUCCESS &&
           check.workspaceSize <= f.workspace_bytes;
    }
    // Forcing split-K off can turn two heuristic results into the same algorithm.
    for (const cublasLtMatmulAlgo_t& seen : out) {
      ok = ok && std::memcmp(&seen, &cand, sizeof(cand)) != 0;
    }
    if (ok) out.push_back(cand);
  }
  return out;
}

absl::Status LaunchLt(FixedAlgos& f, const LtGemm& g, int64_t m, const void* b, void* c,
                      const cublasLtMatmulAlgo_t& algo, cudaStream_t stream) {
  LtDescs d;
  VERIFYD_RETURN_IF_ERROR(MakeDescs(g, m, &d));
  VERIFYD_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(f.lt, d.op, &g.alpha, g.a, d.a, b, d.b, &g.beta, c,
                                                d.c, c, d.c, &algo, f.workspace, f.workspace_bytes,
                                                stream));
  return absl::OkStatus();
}

// Device scratch freed on scope exit (selection only: never inside a step's steady state).
struct Scratch {
  void* p = nullptr;
  ~Scratch() {
    if (p) cudaFree(p);
  }
};

// The row classes of a shape: for each class, the heuristic's split-K-free choices at the
// class's largest row count are timed at its smallest and largest (CUDA events; random rows,
// the real weights as A; the sum ranks them: an algorithm whose tiles fit only the largest
// count can be slow at the smallest), fastest first, and the first whose every output bit equals
// the reference's on random rows (up to 128 of them, a ragged tile included) serves the class; a
// class without such a candidate keeps the reference. Row-for-row equality with the reference
// algorithm, itself one algorithm for every m, is what makes a row's result independent of m.
absl::Status ChooseRowClasses(FixedAlgos& f, const LtGemm& g, cudaStream_t stream,
                              ShapeAlgos* out) {
  constexpr int64_t kBounds[] = {16,  32,   64,   128,  256,
                                 512, 1024, 2048, 4096, std::numeric_limits<int64_t>::max()};
  constexpr int kClasses = sizeof(kBounds) / sizeof(kBounds[0]);
  constexpr size_t kScratchBytes = size_t{96} << 20;
  constexpr int64_t kCheckRows = 125;  // rows of the bit-equality check (a ragged tile)
  const int64_t max_rows = std::max<int64_t>(f.max_rows, 1);
  const size_t bsz = DTypeBytes(g.a_type), csz = DTypeBytes(g.c_type);
  auto b_elems = [&](int64_t m) {
    return static_cast<size_t>((m - 1) * g.ldb + g.k + (g.batch - 1) * g.stride_b);
  };
  auto c_elems = [&](int64_t m) {
    return static_cast<size_t>((m - 1) * g.ldc + g.n + (g.batch - 1) * g.stride_c);
  };
  int64_t t_max = std::min<int64_t>(max_rows, 8192);  // the largest row count timed
  while (t_max > 1 && b_elems(t_max) * bsz + 2 * c_elems(t_max) * csz > kScratchBytes) {
    t_max = (t_max + 1) / 2;
  }
  const int64_t t_check = std::min(kCheckRows, t_max);
  Scratch sb, sc0, sc1;
  const size_t nb = b_elems(t_max) * bsz, nc = c_elems(t_max) * csz;
  const size_t nc_check = c_elems(t_check) * csz;
  const bool have_scratch = cudaMalloc(&sb.p, nb) == cudaSuccess &&
                            cudaMalloc(&sc0.p, nc) == cudaSuccess &&
                            cudaMalloc(&sc1.p, nc) == cudaSuccess;
  cudaGetLastError();  // a failed allocation leaves the reference for every class
  std::vector<uint8_t> hc, want, got;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  if (have_scratch) {
    // Random B (values in [-2, 2) in the input type) and C (for beta != 0).
    std::vector<uint8_t> hb(nb);
    hc.resize(nc_check);
    uint32_t state = 0x9e3779b9u ^ static_cast<uint32_t>(g.n * 31 + g.k);
    auto next = [&state] {
      state ^= state << 13;
      state ^= state >> 17;
      state ^= state << 5;
      return state;
    };
    auto fill = [&](std::vector<uint8_t>& h, size_t esz) {
      for (size_t i = 0; i < h.size() / esz; ++i) {
        const float v = (static_cast<float>(next() >> 8) / 16777216.f - 0.5f) * 4.f;
        uint32_t u;
        std::memcpy(&u, &v, 4);
        if (esz == 4) {
          std::memcpy(&h[i * 4], &u, 4);
        } else {
          const uint16_t b16 = static_cast<uint16_t>(u >> 16);
          std::memcpy(&h[i * 2], &b16, 2);
        }
      }
    };
    fill(hb, bsz);
    fill(hc, csz);
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpy(sb.p, hb.data(), nb, cudaMemcpyHostToDevice));
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e0));
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e1));
    want.resize(nc_check);
    got.resize(nc_check);
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpy(sc0.p, hc.data(), nc_check, cudaMemcpyHostToDevice));
    VERIFYD_RETURN_IF_ERROR(LaunchLt(f, g, t_check, sb.p, sc0.p, out->reference, stream));
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpy(want.data(), sc0.p, nc_check, cudaMemcpyDeviceToHost));
  }
  auto equal_to_reference = [&](const cublasLtMatmulAlgo_t& algo) {
    return cudaMemcpy(sc1.p, hc.data(), nc_check, cudaMemcpyHostToDevice) == cudaSuccess &&
           LaunchLt(f, g, t_check, sb.p, sc1.p, algo, stream).ok() &&
           cudaStreamSynchronize(stream) == cudaSuccess &&
           cudaMemcpy(got.data(), sc1.p, nc_check, cudaMemcpyDeviceToHost) == cudaSuccess &&
           std::memcmp(got.data(), want.data(), nc_check) == 0;
  };
  auto time_of = [&](const cublasLtMatmulAlgo_t& algo, int64_t t) -> double {
    float ms = std::numeric_limits<float>::infinity();
    for (int it = 0; it < 2; ++it) {  // the first run warms up
      if (cudaEventRecord(e0, stream) != cudaSuccess ||
          !LaunchLt(f, g, t, sb.p, sc1.p, algo, stream).ok() ||
          cudaEventRecord(e1, stream) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess ||
          cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) {
        return std::numeric_limits<double>::infinity();
      }
    }
    return ms;
  };
  int64_t lo = 1;
  for (int cls = 0; cls < kClasses && lo <= max_rows; ++cls) {
    const int64_t hi = std::min(kBounds[cls], max_rows);
    GemmRowClassChoice choice;
    choice.n = g.n;
    choice.k = g.k;
    choice.batch = g.batch;
    choice.max_m = cls == kClasses - 1 ? -1 : hi;
    cublasLtMatmulAlgo_t chosen = out->reference;
    if (have_scratch) {
      const int64_t t = std::min(hi, t_max);
      const int64_t t_lo = std::min(lo, t);
      std::vector<cublasLtMatmulAlgo_t> cands = Candidates(f, g, std::max(t, lo), lo, hi, 8);
      choice.tested_candidates = static_cast<int>(cands.size());
      choice.rows_tested = t;
      auto cost = [&](const cublasLtMatmulAlgo_t& algo) {
        return t_lo == t ? time_of(algo, t) : time_of(algo, t_lo) + time_of(algo, t);
      };
      choice.ms_reference = cost(out->reference);
      std::vector<std::pair<double, size_t>> by_time;
      for (size_t i = 0; i < cands.size(); ++i) by_time.emplace_back(cost(cands[i]), i);
      std::sort(by_time.begin(), by_time.end());
      choice.ms_chosen = choice.ms_reference;
      for (const auto& [ms, i] : by_time) {
        if (!(ms < choice.ms_reference)) break;  // the reference is faster from here on
        if (!equal_to_reference(cands[i])) continue;
        ++choice.equal_candidates;
        chosen = cands[i];
        choice.candidate = static_cast<int>(i) + 1;
        choice.ms_chosen = ms;
        break;
      }
    }
    out->classes.emplace_back(cls == kClasses - 1 ? std::numeric_limits<int64_t>::max() : hi,
                              chosen);
    f.log.push_back(choice);
    lo = hi + 1;
  }
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  return absl::OkStatus();
}

absl::Status RunFixed(FixedAlgos& f, void* cublas_handle, const LtGemm& g) {
  const FixedAlgos::Key key{static_cast<int>(g.ta),
                            g.n,
                            g.k,
                            g.lda,
                            g.ldb,
                            g.ldc,
                            g.stride_a,
                            g.stride_b,
                            g.stride_c,
                            g.batch,
                            static_cast<int>(g.a_type),
                            static_cast<int>(g.c_type),
                            static_cast<int>(g.compute)};
  cudaStream_t stream = nullptr;
  VERIFYD_CUBLAS_RETURN_IF_ERROR(
      cublasGetStream(static_cast<cublasHandle_t>(cublas_handle), &stream));
  cublasLtMatmulAlgo_t algo;
  {
    std::lock_guard<std::mutex> lock(f.mu);
    auto it = f.algos.find(key);
    if (it == f.algos.end()) {
      // The reference: the heuristic at 64 rows, split-K off, running at every row count.
      constexpr int64_t kReferenceRows = 64;
      const int64_t max_rows = std::max<int64_t>(f.max_rows, 1);
      std::vector<cublasLtMatmulAlgo_t> ref =
          Candidates(f, g, std::min(kReferenceRows, max_rows), 1, max_rows, 1);
      if (ref.empty()) {
        return absl::UnimplementedError(absl::StrCat(
            "batch-invariant gemm: no cuBLASLt algorithm without split-K serves every row count "
            "for n=",
            g.n, " k=", g.k));
      }
      ShapeAlgos sa;
      sa.reference = ref[0];
      if (f.row_classes) VERIFYD_RETURN_IF_ERROR(ChooseRowClasses(f, g, stream, &sa));
      it = f.algos.emplace(key, std::move(sa)).first;
    }
    algo = it->second.For(g.m);
  }
  return LaunchLt(f, g, g.m, g.b, g.c, algo, stream);
}

// GemmBf16's and GemmF32's checks up to the leading dims (`kind` names the GEMM in the shape
// message): the status to return at once (an error, or OK when there is no row), else none.
template <class Params>
std::optional<absl::Status> DenseGemmEarlyReturn(void* cublas_handle, const Params& p,
                                                 const char* kind) {
  if (!cublas_handle) return absl::InvalidArgumentError("cublas handle must be set");
  if (p.m < 0 || p.n <= 0 || p.k <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad ", kind, " shape m=", p.m, " n=", p.n, " k=", p.k));
  }
  if (p.m == 0) return absl::OkStatus();
  if (!p.x || !p.w || !p.y) return absl::InvalidArgumentError("x, w, y must be set");
  return std::nullopt;
}

// The packed GEMM of DenseLt (GemmBf16, GemmF32): through the handle's fixed algorithms when
// it has them, else one cublasGemmEx (operands of type a_type, output c_type).
absl::Status RunDense(void* cublas_handle, const LtGemm& g) {
  if (FixedAlgos* f = FixedFor(cublas_handle)) return RunFixed(*f, cublas_handle, g);
  VERIFYD_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(
      static_cast<cublasHandle_t>(cublas_handle), g.ta, CUBLAS_OP_N, static_cast<int>(g.n),
      static_cast<int>(g.m), static_cast<int>(g.k), &g.alpha, g.a, g.a_type,
      static_cast<int>(g.lda), g.b, g.a_type, static_cast<int>(g.ldb), &g.beta, g.c, g.c_type,
      static_cast<int>(g.ldc), g.compute, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

}  // namespace

absl::Status EnableFixedGemmAlgorithms(void* cublas_handle, void* workspace, size_t bytes,
                                       int64_t max_rows, bool row_classes) {
  if (cublas_handle == nullptr) return absl::InvalidArgumentError("cublas handle must be set");
  auto f = std::make_unique<FixedAlgos>();
  VERIFYD_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&f->lt));
  f->workspace = workspace;
  f->workspace_bytes = bytes;
  f->max_rows = max_rows;
  f->row_classes = row_classes;
  std::lock_guard<std::mutex> lock(g_fixed_mu);
  auto& slot = FixedRegistry()[cublas_handle];
  if (slot == nullptr) g_fixed_handles.fetch_add(1, std::memory_order_acq_rel);
  slot = std::move(f);
  return absl::OkStatus();
}

std::vector<GemmRowClassChoice> FixedGemmChoices(void* cublas_handle) {
  std::lock_guard<std::mutex> lock(g_fixed_mu);
  auto& r = FixedRegistry();
  auto it = r.find(cublas_handle);
  if (it == r.end()) return {};
  std::lock_guard<std::mutex> l2(it->second->mu);
  return it->second->log;
}

void DisableFixedGemmAlgorithms(void* cublas_handle) {
  std::unique_ptr<FixedAlgos> f;
  {
    std::lock_guard<std::mutex> lock(g_fixed_mu);
    auto& r = FixedRegistry();
    auto it = r.find(cublas_handle);
    if (it == r.end()) return;
    f = std::move(it->second);
    r.erase(it);
    g_fixed_handles.fetch_sub(1, std::memory_order_acq_rel);
  }
  if (f->lt != nullptr) cublasLtDestroy(f->lt);
}

absl::Status GemmBf16(void* cublas_handle, const GemmParams& p) {
  if (auto done = DenseGemmEarlyReturn(cublas_handle, p, "gemm")) return *done;
  if (p.ldx < p.k || p.ldw < p.k || p.ldy < p.n) {
    return absl::InvalidArgumentError(absl::StrCat("bad leading dims ldx=", p.ldx, " ldw=", p.ldw,
                                                   " ldy=", p.ldy, " for n=", p.n, " k=", p.k));
  }
  LtGemm g = DenseLt(p.m, p.n, p.k, p.w, p.ldw, p.x, p.ldx, p.y, p.ldy);
  g.c_type = p.y_dtype == DType::kFloat32 ? CUDA_R_32F : CUDA_R_16BF;
  g.alpha = p.alpha;
  g.beta = p.beta;
  return RunDense(cublas_handle, g);
}

absl::Status GemmBf16Batched(void* cublas_handle, const BatchedGemmParams& p) {
  if (!cublas_handle) return absl::InvalidArgumentError("cublas handle must be set");
  if (p.batch < 0 || p.m < 0 || p.n <= 0 || p.k <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad batched gemm shape batch=", p.batch, " m=", p.m, " n=", p.n, " k=", p.k));
  }
  if (p.batch == 0 || p.m == 0) return absl::OkStatus();
  if (!p.x || !p.w || !p.y) return absl::InvalidArgumentError("x, w, y must be set");
  if (p.ldx < p.k || p.ldy < p.n || p.ldw < (p.w_transposed ? p.k : p.n)) {
    return absl::InvalidArgumentError("bad leading dims in batched gemm");
  }
  const float alpha = 1.f, beta = 0.f;
  if (FixedAlgos* f = FixedFor(cublas_handle)) {
    LtGemm g;
    g.ta = p.w_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
    g.n = p.n;
    g.m = p.m;
    g.k = p.k;
    g.a = p.w;
    g.lda = p.ldw;
    g.stride_a = p.stride_w;
    g.b = p.x;
    g.ldb = p.ldx;
    g.stride_b = p.stride_x;
    g.c = p.y;
    g.c_type = CUDA_R_16BF;
    g.ldc = p.ldy;
    g.stride_c = p.stride_y;
    g.batch = p.batch;
    return RunFixed(*f, cublas_handle, g);
  }
  // w_transposed: w_b row-major [n, k] = column-major k x n -> op T gives n x k.
  // otherwise:    w_b row-major [k, n] = column-major n x k -> op N.
  VERIFYD_CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
      static_cast<cublasHandle_t>(cublas_handle), p.w_transposed ? CUBLAS_OP_T : CUBLAS_OP_N,
      CUBLAS_OP_N, static_cast<int>(p.n), static_cast<int>(p.m), static_cast<int>(p.k), &alpha, p.w,
      CUDA_R_16BF, static_cast<int>(p.ldw), p.stride_w, p.x, CUDA_R_16BF, static_cast<int>(p.ldx),
      p.stride_x, &beta, p.y, CUDA_R_16BF, static_cast<int>(p.ldy), p.stride_y, p.batch,
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

absl::Status GemmBf16Packed(void* cublas_handle, int64_t m, const bf16_bits* x, int64_t k,
                            const bf16_bits* w, int64_t n, void* y, DType y_dtype, float beta) {
  GemmParams p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.x = x;
  p.ldx = k;
  p.w = w;
  p.ldw = k;
  p.y = y;
  p.ldy = n;
  p.y_dtype = y_dtype;
  p.beta = beta;
  return GemmBf16(cublas_handle, p);
}

absl::Status GemmF32(void* cublas_handle, const GemmF32Params& p) {
  if (auto done = DenseGemmEarlyReturn(cublas_handle, p, "fp32 gemm")) return *done;
  if (p.ldx < p.k || p.ldw < p.k || p.ldy < p.n) {
    return absl::InvalidArgumentError("bad leading dims in fp32 gemm");
  }
  LtGemm g = DenseLt(p.m, p.n, p.k, p.w, p.ldw, p.x, p.ldx, p.y, p.ldy);
  g.a_type = CUDA_R_32F;
  g.compute = CUBLAS_COMPUTE_32F_PEDANTIC;
  return RunDense(cublas_handle, g);
}

}  // namespace verifyd::kernels::cuda
