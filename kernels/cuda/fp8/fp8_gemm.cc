// Block-scaled FP8 GEMMs through cuBLASLt (see fp8_gemm.h). Row-major y = x . w^T is the
// column-major product y^T (n x m) = w (as k x n, transposed) . x^T (k x m): w is operand A
// (BLK128x128 scales), x operand B (VEC128 scales), both K-major ("TN", what FP8 needs).
#include "kernels/cuda/fp8/fp8_gemm.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/status.h"

namespace verifyd::kernels::cuda {

struct Fp8BlockGemmLt::Algo {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Algo() {
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

namespace {

#define VERIFYD_LT_RETURN_IF_ERROR(expr)                                                \
  do {                                                                                  \
    const cublasStatus_t verifyd_lt_status = (expr);                                    \
    if (verifyd_lt_status != CUBLAS_STATUS_SUCCESS) {                                   \
      return absl::InternalError(absl::StrCat(                                          \
          "cuBLASLt: ", #expr, " failed: ", cublasGetStatusString(verifyd_lt_status))); \
    }                                                                                   \
  } while (0)

template <typename T>
absl::Status SetDesc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v) {
  VERIFYD_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Fp8BlockGemmLt>> Fp8BlockGemmLt::Create(size_t workspace_bytes) {
  std::unique_ptr<Fp8BlockGemmLt> g(new Fp8BlockGemmLt());
  cublasLtHandle_t h = nullptr;
  VERIFYD_LT_RETURN_IF_ERROR(cublasLtCreate(&h));
  g->lt_ = h;
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaMalloc(&g->workspace_, workspace_bytes));
  g->workspace_bytes_ = workspace_bytes;
  // The probe: an algorithm for a small problem, or this cuBLASLt / GPU has none.
  absl::StatusOr<const Algo*> probe = g->AlgoFor(16, 128, 128);
  if (!probe.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuBLASLt has no block-scaled FP8 GEMM here: ", probe.status().message()));
  }
  g->algos_.clear();
  return g;
}

Fp8BlockGemmLt::~Fp8BlockGemmLt() {
  algos_.clear();
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (lt_ != nullptr) cublasLtDestroy(static_cast<cublasLtHandle_t>(lt_));
}

absl::StatusOr<const Fp8BlockGemmLt::Algo*> Fp8BlockGemmLt::AlgoFor(int64_t m, int64_t n,
                                                                    int64_t k) {
  const auto key = std::make_tuple(m, n, k);
  if (auto it = algos_.find(key); it != algos_.end()) return it->second.get();
  auto a = std::make_unique<Algo>();
  VERIFYD_LT_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&a->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  VERIFYD_RETURN_IF_ERROR(SetDesc(a->desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T));
  VERIFYD_RETURN_IF_ERROR(SetDesc(a->desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N));
  VERIFYD_RETURN_IF_ERROR(SetDesc<int32_t>(a->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                                           CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F));
  VERIFYD_RETURN_IF_ERROR(SetDesc<int32_t>(a->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                                           CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F));
  // Placeholder scale pointers for the heuristic (Run sets the real ones).
  const void* none = workspace_;
  VERIFYD_RETURN_IF_ERROR(SetDesc(a->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, none));
  VERIFYD_RETURN_IF_ERROR(SetDesc(a->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, none));
  VERIFYD_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&a->a, CUDA_R_8F_E4M3, k, n, k));
  VERIFYD_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&a->b, CUDA_R_8F_E4M3, k, m, k));
  VERIFYD_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&a->d, CUDA_R_32F, n, m, n));
  cublasLtMatmulPreference_t pref = nullptr;
  VERIFYD_LT_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_, sizeof(workspace_bytes_));
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(lt_), a->desc, a->a, a->b,
                                        a->d, a->d, pref, 1, &result, &found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    return absl::UnimplementedError(
        absl::StrCat("no cuBLASLt block-scaled FP8 algorithm for m=", m, " n=", n, " k=", k, " (",
                     st == CUBLAS_STATUS_SUCCESS ? "none found" : cublasGetStatusString(st), ")"));
  }
  a->algo = result.algo;
  const Algo* out = a.get();
  algos_.emplace(key, std::move(a));
  return out;
}

absl::Status Fp8BlockGemmLt::Run(const Fp8BlockGemmArgs& p) {
  if (p.m < 0 || p.n <= 0 || p.k <= 0 || p.k % 128 != 0 || p.n % 16 != 0 || p.m > INT32_MAX ||
      p.n > INT32_MAX || p.k > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp8 block gemm: m >= 0, n a positive multiple of 16 and k of 128 needed (m=", p.m,
        " n=", p.n, " k=", p.k, ")"));
  }
  if (p.m == 0) return absl::OkStatus();
  auto misaligned = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15) != 0; };
  if (p.x == nullptr || p.x_scale == nullptr || p.w == nullptr || p.w_scale == nullptr ||
      p.y == nullptr || misaligned(p.x) || misaligned(p.w) || misaligned(p.y) ||
      misaligned(p.x_scale) || misaligned(p.w_scale)) {
    return absl::InvalidArgumentError(
        "fp8 block gemm: x, x_scale, w, w_scale and y must be set and 16-byte aligned");
  }
  VERIFYD_ASSIGN_OR_RETURN(const Algo* a, AlgoFor(Fp8LtRows(p.m), p.n, p.k));
  VERIFYD_RETURN_IF_ERROR(
      SetDesc(a->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(p.w_scale)));
  VERIFYD_RETURN_IF_ERROR(
      SetDesc(a->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(p.x_scale)));
  const float alpha = 1.f, beta = 0.f;
  VERIFYD_LT_RETURN_IF_ERROR(cublasLtMatmul(
      static_cast<cublasLtHandle_t>(lt_), a->desc, &alpha, p.w, a->a, p.x, a->b, &beta, p.y, a->d,
      p.y, a->d, &a->algo, workspace_, workspace_bytes_, static_cast<cudaStream_t>(p.stream)));
  return absl::OkStatus();
}

}  // namespace verifyd::kernels::cuda
