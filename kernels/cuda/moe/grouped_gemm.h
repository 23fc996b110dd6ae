// Grouped expert GEMMs for the MoE layer on Hopper: one launch computes, for every expert
// (group) g = 0..groups-1,
//
//     d[o_g : o_{g+1}, 0:n] = a[o_g : o_{g+1}, 0:k] . b_g[n, k]^T        (fp32 out)
//
// where o = offsets[0..groups] lives in device memory (the MoE permutation writes it). The
// row counts never go to the host: a small setup kernel turns the offsets into the per-group
// problem sizes and pointers, then one CUTLASS 3 grouped (ptr-array) warp-specialized kernel
// with device-side problem shapes runs every group (empty groups cost nothing). The launch
// sequence does not depend on the data, so it is CUDA-graph safe, and there is no host sync.
//
// Kinds:
//   kBf16:        a, b bf16; fp32 accumulation.
//   kFp8Block128: a, b float8_e4m3fn with DeepSeek-V3's block scales: a_scale[row][k / 128]
//                 (one fp32 per row and 128 columns: the activations, quantized per token
//                 group by MoeGatherQuantFp8Cuda / SwiGluQuantFp8Cuda in moe.h) and
//                 b_scale[g][n / 128][k / 128] (the checkpoint's `weight_scale_inv`, one per
//                 128 x 128 weight block). The scales are applied to the fp32 partial sums of
//                 every 128-deep k block (CUTLASS's blockwise-scaled FP8 mainloop), i.e.
//                 d = sum_kb a_scale * b_scale * (fp8 a . fp8 b over the block).
//                 Needs n % 128 == 0 and k % 128 == 0.
//
// Availability: sm_90 (Hopper) GPUs and a build with the CUTLASS headers (scripts/
// install-deps.sh fetches them from the nvidia-cutlass wheel). GroupedGemmAvailable() says
// whether this build and device can run it; callers fall back to per-expert cuBLAS GEMMs
// (dense/gemm.h) otherwise.
//
// Host header (no CUDA code). Thread-safety: a GroupedGemm is used by one thread (a rank) at
// a time; Run is asynchronous on the given stream.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace verifyd::kernels::cuda {

enum class GroupedGemmKind { kBf16, kFp8Block128 };

std::string GroupedGemmKindName(GroupedGemmKind kind);

// True when this build has the CUTLASS grouped kernels and `device` is an sm_90 GPU.
bool GroupedGemmAvailable(int device);

struct GroupedGemmShape {
  GroupedGemmKind kind = GroupedGemmKind::kBf16;
  int groups = 0;    // experts on this rank
  int64_t n = 0;     // output columns per group
  int64_t k = 0;     // reduction depth
  int device = 0;    // CUDA device the kernels run on
  int tile_m = 128;  // rows per tile: 128, or 64 (fp8 only: fewer idle MMA rows when the
                     // groups are small)
};

struct GroupedGemmArgs {
  const int32_t* offsets = nullptr;  // [groups + 1] device, offsets[0] = 0, non-decreasing
  const void* a = nullptr;           // [offsets[groups], k] row-major (bf16 or fp8)
  const float* a_scale = nullptr;    // fp8: [offsets[groups], k / 128]
  const void* b = nullptr;           // [groups, n, k] row-major (bf16 or fp8)
  const float* b_scale = nullptr;    // fp8: [groups, n / 128, k / 128]
  float* d = nullptr;                // [offsets[groups], n] row-major fp32
  void* stream = nullptr;            // cudaStream_t
};

class GroupedGemm {
 public:
  // Allocates the per-group argument arrays and CUTLASS's workspace on shape.device (the
  // current device must be shape.device). FailedPrecondition when !GroupedGemmAvailable;
  // InvalidArgument naming the field for a bad shape.
  static absl::StatusOr<std::unique_ptr<GroupedGemm>> Create(const GroupedGemmShape& shape);
  virtual ~GroupedGemm() = default;

  // Enqueues the setup kernel and the grouped GEMM on args.stream. Pointers must be 16-byte
  // aligned (InvalidArgument otherwise); rows are at most 2^31 - 1.
  virtual absl::Status Run(const GroupedGemmArgs& args) = 0;
  virtual const GroupedGemmShape& shape() const = 0;
  // Device memory this object holds (argument arrays + workspace), bytes.
  virtual size_t device_bytes() const = 0;
};

}  // namespace verifyd::kernels::cuda
