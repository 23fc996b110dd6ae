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
# The per-GPU memory plan: weight parts by hand, Kimi-K2 / DeepSeek-V3 at TP 8, KV tokens, errors.
verifyd_add_test(tp_memory_plan_test LABEL cpu SOURCES tp_memory_plan_test.cc LIBS ${VERIFYD_TP_TEST_LIBS})
verifyd_add_test(tp_weight_source_test LABEL cpu SOURCES tp_weight_source_test.cc LIBS ${VERIFYD_TP_TEST_LIBS})
# Checkpoint loading through the streaming reader: the heap of a TP 4 load, same logits however
# the weights come in, bad checkpoints failing Create naming file and tensor.
verifyd_add_test(tp_checkpoint_load_test LABEL cpu
  SOURCES tp_checkpoint_load_test.cc LIBS ${VERIFYD_TP_TEST_LIBS})
# The real verifyd binary on a bad checkpoint: non-zero exit before serving, naming the tensor.
if(TARGET verifyd)
  verifyd_add_test(tp_bad_checkpoint_cli_test LABEL cpu
    SOURCES tp_bad_checkpoint_cli_test.cc
    LIBS ${VERIFYD_TP_TEST_LIBS} verifyd_test_process absl::time
    BINARIES verifyd)
endif()
# Sampled verification on the CPU engine: draws against the target distribution (chi-square),
# logprobs against the logits, hidden states against the residual stream, the reference sampler.
verifyd_add_test(tp_sampling_test LABEL cpu SOURCES tp_sampling_test.cc LIBS ${VERIFYD_TP_TEST_LIBS})
# The modeled time of an 8-GPU NVLink collective (reports of a single rank run alone): the
# bus-bandwidth formulas by hand, latency floor, world 1, the sum, validation.
verifyd_add_test(tp_comm_model_test LABEL cpu SOURCES tp_comm_model_test.cc LIBS ${VERIFYD_TP_TEST_LIBS})
verifyd_add_test(tp_step_test LABEL cpu SOURCES tp_step_test.cc LIBS ${VERIFYD_TP_TEST_LIBS})
