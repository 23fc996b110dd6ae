# CUDA kernel tests: the CUDA ops against the C++ reference (label gpu: their main() reports
# Skipped without a GPU), and the host-only checks of the CUDA launchers, which link the CUDA
# runtime but need no device (label cpu, so CI runs them). Built only with CUDA.
if(VERIFYD_WITH_CUDA)
  verifyd_add_test(gpu_verify_attention_test LABEL gpu TIMEOUT 900
    SOURCES gpu_verify_attention_test.cc
    LIBS verifyd_kernels_cuda verifyd_kernels_cuda_ops verifyd_kernels_ref CUDA::cudart)
  verifyd_add_test(gpu_tree_accept_test LABEL gpu
    SOURCES gpu_tree_accept_test.cc
    LIBS verifyd_kernels_cuda verifyd_kernels_ref CUDA::cudart)
  verifyd_add_test(gpu_moe_grouped_test LABEL gpu
    SOURCES gpu_moe_grouped_test.cc
    LIBS verifyd_kernels_cuda_ops CUDA::cudart)
  verifyd_add_test(kernels_verify_attention_launch_test LABEL cpu
    SOURCES kernels_verify_attention_launch_test.cc
    LIBS verifyd_kernels_cuda CUDA::cudart)
endif()
