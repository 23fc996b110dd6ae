// Builds without the CUTLASS headers: no grouped expert GEMMs (see grouped_gemm.h); the MoE
// layer runs its per-expert cuBLAS GEMMs instead.
#include "kernels/cuda/moe/grouped_gemm.h"

namespace verifyd::kernels::cuda {

std::string GroupedGemmKindName(GroupedGemmKind kind) {
  return kind == GroupedGemmKind::kBf16 ? "bf16" : "fp8-block128";
}

bool GroupedGemmAvailable(int /*device*/) { return false; }

absl::StatusOr<std::unique_ptr<GroupedGemm>> GroupedGemm::Create(const GroupedGemmShape&) {
  return absl::FailedPreconditionError(
      "grouped gemm: this build has no CUTLASS headers (scripts/fetch-cutlass.sh)");
}

}  // namespace verifyd::kernels::cuda
