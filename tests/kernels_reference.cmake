# Tests of the plain C++ kernel code, label cpu: the reference ops (kernels/reference) and the
# CUDA verify attention's planner (kernels/cuda/verify_attention/plan.cc, built without CUDA).
verifyd_add_test(kernels_ops_test LABEL cpu
  SOURCES kernels_ops_test.cc
  LIBS verifyd_kernels_ref)
verifyd_add_test(kernels_verify_attention_ref_test LABEL cpu
  SOURCES kernels_verify_attention_ref_test.cc
  LIBS verifyd_kernels_ref)
verifyd_add_test(tree_accept_test LABEL cpu
  SOURCES tree_accept_test.cc
  LIBS verifyd_kernels_ref)
verifyd_add_test(kernels_verify_attention_plan_test LABEL cpu
  SOURCES kernels_verify_attention_plan_test.cc
  LIBS verifyd_verify_attention_plan)
verifyd_add_test(kernels_moe_test LABEL cpu
  SOURCES kernels_moe_test.cc
  LIBS verifyd_kernels_ref)
verifyd_add_test(kernels_kv_fp8_test LABEL cpu
  SOURCES kernels_kv_fp8_test.cc
  LIBS verifyd_kernels_ref)
