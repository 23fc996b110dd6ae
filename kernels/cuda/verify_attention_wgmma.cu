// Explicit instantiation of the wgmma verify attention kernel (64 rows, 32-key tiles,
// 3 stages, ~201 KB shared memory). Has a body only in the sm_90a build.
#include "kernels/cuda/verify_attention_wgmma.cuh"

namespace verifyd::kernels::cuda::detail {
template cudaError_t LaunchVerifyAttentionWgmma<32, 3>(const VerifyKernelArgs&, int, cudaStream_t);
}  // namespace verifyd::kernels::cuda::detail
