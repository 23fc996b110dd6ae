// Block-scaled FP8 GEMMs through cuBLASLt: DeepSeek-V3's W8A8 scheme (activations quantized
// per row and 128 columns, weights with one scale per 128 x 128 block) as one cuBLASLt matmul
// with CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F / BLK128x128_32F scales (cuBLAS >= 12.9 on
// sm_90):
//
//   y[r, j] = sum over k blocks kb of x_scale[r][kb] * w_scale[j / 128][kb] *
//             (fp8 x[r, kb*128 : +128] . fp8 w[j, kb*128 : +128])          (fp32 y)
//
// in cuBLASLt's layouts (measured on an H200 with cuBLAS 13.1: the other layouts give wrong
// products, and row counts that are not multiples of 4 have no algorithm), with m4 =
// Fp8LtRows(m) = m rounded up to a multiple of 4:
//   x        [m4, k] e4m3 row-major (rows m..m4-1 readable; their results land in y's pad rows)
//   x_scale  [k / 128, m4] fp32: scales by column group, x_scale[kb * m4 + r] (the quantizers'
//            scale_ld_rows = m4: MoeGatherQuantFp8Cuda / SwiGluQuantFp8Cuda in moe/moe.h)
//   w        [n, k] e4m3 row-major (the checkpoint's layout)
//   w_scale  [ceil(n / 128), Fp8LtScaleLd(k)] fp32 row-major: the checkpoint's
//            `weight_scale_inv` with each row padded to a multiple of 4 entries
//   y        [m4, n] fp32 row-major, overwritten (rows m..m4-1 too)
//
// The same product as the grouped kernel's one-group GEMM (moe/grouped_gemm.h kFp8Block128), but
// cuBLASLt picks the algorithm per (m, n, k) (split-K and stream-K included), which keeps the
// GPU busy when m is small and n / 128 tiles are fewer than the SMs (the weight-bound verify
// steps). A row's result may therefore depend on m: batch-invariant steps use the grouped
// kernel instead. Algorithms are cached per (m, n, k).
//
// Host header (no CUDA code). Thread-safety: one thread per object (a rank's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace verifyd::kernels::cuda {

// The rows a GEMM of m rows computes (m rounded up to a multiple of 4).
inline int64_t Fp8LtRows(int64_t m) { return (m + 3) / 4 * 4; }
// The row stride of a weight's scales for depth k (k / 128 rounded up to a multiple of 4).
inline int64_t Fp8LtScaleLd(int64_t k) { return (k / 128 + 3) / 4 * 4; }

struct Fp8BlockGemmArgs {
  int64_t m = 0, n = 0, k = 0;  // k % 128 == 0; n % 16 == 0
  const uint8_t* x = nullptr;
  const float* x_scale = nullptr;
  const uint8_t* w = nullptr;
  const float* w_scale = nullptr;
  float* y = nullptr;
  void* stream = nullptr;  // cudaStream_t
};

class Fp8BlockGemmLt {
 public:
  // A cuBLASLt handle and a workspace of `workspace_bytes` on the current device.
  // FailedPrecondition when this cuBLASLt has no block-scaled FP8 algorithm for the current
  // device (probed with a small problem): callers then use the grouped kernel.
  static absl::StatusOr<std::unique_ptr<Fp8BlockGemmLt>> Create(size_t workspace_bytes = 32 << 20);
  ~Fp8BlockGemmLt();
  Fp8BlockGemmLt(const Fp8BlockGemmLt&) = delete;
  Fp8BlockGemmLt& operator=(const Fp8BlockGemmLt&) = delete;

  // Enqueues y = x . w^T on args.stream. InvalidArgument naming the problem for bad shapes or
  // null / misaligned (16-byte) pointers; m == 0 enqueues nothing.
  absl::Status Run(const Fp8BlockGemmArgs& args);
  size_t device_bytes() const { return workspace_bytes_; }

 private:
  Fp8BlockGemmLt() = default;
  struct Algo;
  absl::StatusOr<const Algo*> AlgoFor(int64_t m, int64_t n, int64_t k);

  void* lt_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::unique_ptr<Algo>> algos_;
};

}  // namespace verifyd::kernels::cuda
