# tp/ tests: model config, presets and weights, safetensors, the streaming checkpoint reader
# (weight sources), sharding, the in-process communicator, the rank-thread group, absorbed MLA,
# batch planning, and the CPU engine (TP=N vs TP=1, lossless speculative decoding).
set(VERIFYD_TP_TEST_LIBS verifyd_tp verifyd_kernels_ref)
verifyd_add_test(tp_config_test LABEL cpu SOURCES tp_config_test.cc LIBS ${VERIFYD_TP_TEST_LIBS})
verifyd_add_test(tp_weights_test LABEL cpu SOURCES tp_weights_test.cc LIBS ${VERIFYD_TP_TEST_LIBS})
verifyd_add_test(tp_sharding_test LABEL cpu SOURCES tp_sharding_test.cc LIBS ${VERIFYD_TP_TEST_LIBS})
verifyd_add_test(tp_communicator_test LABEL cpu SOURCES tp_communicator_test.cc LIBS ${VERIFYD_TP_TEST_LIBS})
verifyd_add_test(tp_rank_group_test LABEL cpu SOURCES tp_rank_group_test.cc LIBS ${VERIFYD_TP_TEST_LIBS})
verifyd_add_test(tp_mla_test LABEL cpu SOURCES tp_mla_test.cc LIBS ${VERIFYD_TP_TEST_LIBS})
verifyd_add_test(tp_engine_test LABEL cpu SOURCES tp_engine_test.cc LIBS ${VERIFYD_TP_TEST_LIBS})
verifyd_add_test(tp_batch_plan_test LABEL cpu SOURCES tp_batch_plan_test.cc LIBS ${VERIFYD_TP_TEST_LIBS})
verifyd_add_test(tp_weight_source_test LABEL cpu SOURCES tp_weight_source_test.cc LIBS ${VERIFYD_TP_TEST_LIBS})
