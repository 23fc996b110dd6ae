// Explicit instantiations of the 16-row (memory-bound) verify attention configuration:
// 5 stages for sm_90 (227 KB shared memory: four tiles in flight), 2 stages for sm_120 / sm_80 (<= 99 KB), and a
// 2-stage, 2-CTAs-per-SM variant for sm_90.
#include "kernels/cuda/verify_attention_kernel.cuh"

namespace verifyd::kernels::cuda::detail {
template cudaError_t LaunchVerifyAttentionKernel<16, 32, 5>(const VerifyKernelArgs&, int,
                                                            cudaStream_t);
template cudaError_t LaunchVerifyAttentionKernel<16, 32, 2>(const VerifyKernelArgs&, int,
                                                            cudaStream_t);
// sm_90: two CTAs per SM (Q read from shared memory, <= 128 registers).
template cudaError_t LaunchVerifyAttentionKernel<16, 32, 2, 2>(const VerifyKernelArgs&, int,
                                                               cudaStream_t);
}  // namespace verifyd::kernels::cuda::detail
