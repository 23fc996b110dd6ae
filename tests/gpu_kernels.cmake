# GPU kernel tests (label gpu): the CUDA ops against the C++ reference. Built only with CUDA;
# each test skips with a message when no GPU is visible.
if(VERIFYD_WITH_CUDA)
  verifyd_add_test(gpu_verify_attention_test LABEL gpu TIMEOUT 900
    SOURCES gpu_verify_attention_test.cc
    LIBS verifyd_kernels_cuda verifyd_kernels_ref CUDA::cudart)
  verifyd_add_test(gpu_tree_accept_test LABEL gpu
    SOURCES gpu_tree_accept_test.cc
    LIBS verifyd_kernels_cuda verifyd_kernels_ref CUDA::cudart)
endif()
