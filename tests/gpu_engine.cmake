# GPU engine tests (label gpu): the dense CUDA ops against the C++ reference, the NCCL
# communicator, and the CUDA engine against the CPU engine (logits, greedy tokens, lossless
# speculative decoding, KV slot accounting). Built only with CUDA; each test skips with a
# message when no GPU is visible.
if(VERIFYD_WITH_CUDA)
  verifyd_add_test(gpu_engine_dense_test LABEL gpu
    SOURCES gpu_engine_dense_test.cc
    LIBS verifyd_kernels_cuda_dense verifyd_tp verifyd_kernels_ref CUDA::cudart CUDA::cublas)
  verifyd_add_test(gpu_engine_test LABEL gpu TIMEOUT 900
    SOURCES gpu_engine_test.cc
    LIBS verifyd_tp_cuda verifyd_tp verifyd_kernels_ref)
  verifyd_add_test(gpu_loopback_test LABEL gpu
    SOURCES gpu_loopback_test.cc
    LIBS verifyd_tp_cuda CUDA::cudart)
  if(VERIFYD_WITH_NCCL)
    verifyd_add_test(gpu_engine_nccl_test LABEL gpu
      SOURCES gpu_engine_nccl_test.cc
      LIBS verifyd_tp_cuda CUDA::cudart)
  endif()
endif()
