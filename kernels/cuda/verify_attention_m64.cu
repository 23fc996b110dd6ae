// Explicit instantiation of the 64-row verify attention configuration (sm_90 class: needs
// ~200 KB of shared memory per block; its sm_120 body is empty and never launched).
#include "kernels/cuda/verify_attention_kernel.cuh"

namespace verifyd::kernels::cuda::detail {
template cudaError_t LaunchVerifyAttentionKernel<64, 32, 3>(const VerifyKernelArgs&, int,
                                                            cudaStream_t);
}  // namespace verifyd::kernels::cuda::detail
