# Tests of the plain C++ reference ops (kernels/reference): label cpu.
verifyd_add_test(kernels_ops_test LABEL cpu
  SOURCES kernels_ops_test.cc
  LIBS verifyd_kernels_ref)
verifyd_add_test(kernels_verify_attention_ref_test LABEL cpu
  SOURCES kernels_verify_attention_ref_test.cc
  LIBS verifyd_kernels_ref)
verifyd_add_test(tree_accept_test LABEL cpu
  SOURCES tree_accept_test.cc
  LIBS verifyd_kernels_ref)
