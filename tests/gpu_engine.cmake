# GPU engine tests (label gpu): the dense CUDA ops against the C++ reference, the NCCL
# communicator, and the CUDA engine against the CPU engine (logits, greedy tokens, lossless
# speculative decoding, KV slot accounting), and the CUDA engine against transformers on the
# reference checkpoints of tests/data (dense, MoE + YaRN, FP8; TP 1 and loopback TP 2 / 4).
# Built only with CUDA; each test skips with a message when no GPU is visible.
if(VERIFYD_WITH_CUDA)
  verifyd_add_test(gpu_engine_dense_test LABEL gpu
    SOURCES gpu_engine_dense_test.cc
    LIBS verifyd_kernels_cuda_ops verifyd_tp verifyd_kernels_ref CUDA::cudart CUDA::cublas)
  verifyd_add_test(gpu_engine_test LABEL gpu TIMEOUT 900
    SOURCES gpu_engine_test.cc
    LIBS verifyd_tp_cuda verifyd_tp verifyd_kernels_ref)
  verifyd_add_test(gpu_reference_checkpoint_test LABEL gpu TIMEOUT 900
    SOURCES gpu_reference_checkpoint_test.cc
    LIBS verifyd_tp_cuda verifyd_tp verifyd_kernels_cuda_ops verifyd_kernels_ref
         nlohmann_json::nlohmann_json CUDA::cudart)
  target_compile_definitions(gpu_reference_checkpoint_test
                             PRIVATE VERIFYD_TEST_DATA_DIR="${CMAKE_SOURCE_DIR}/tests/data")
  # Sampling, logprobs and hidden states: the GPU draws against the reference sampler on the
  # GPU's own logits, logprobs and hidden states against the CPU engine, seeded speculative
  # decoding against seeded plain decoding (TP 1 and loopback TP 2).
  verifyd_add_test(gpu_sampling_test LABEL gpu
    SOURCES gpu_sampling_test.cc
    LIBS verifyd_tp_cuda verifyd_tp verifyd_kernels_ref)
  verifyd_add_test(gpu_batch_invariance_test LABEL gpu TIMEOUT 900
    SOURCES gpu_batch_invariance_test.cc
    LIBS verifyd_tp_cuda verifyd_tp nlohmann_json::nlohmann_json)
  target_compile_definitions(gpu_batch_invariance_test
                             PRIVATE VERIFYD_TEST_DATA_DIR="${CMAKE_SOURCE_DIR}/tests/data")
  verifyd_add_test(gpu_loopback_test LABEL gpu
    SOURCES gpu_loopback_test.cc
    LIBS verifyd_tp_cuda CUDA::cudart)
  if(VERIFYD_WITH_NCCL)
    verifyd_add_test(gpu_engine_nccl_test LABEL gpu
      SOURCES gpu_engine_nccl_test.cc
      LIBS verifyd_tp_cuda CUDA::cudart)
  endif()
endif()
