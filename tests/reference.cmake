# Comparison with Hugging Face transformers: the CPU engine on the tiny reference checkpoints of
# tests/data/checkpoints against the outputs in tests/data/references (both written by
# tests/data/make_reference_checkpoints.py).
verifyd_add_test(tp_reference_checkpoint_test LABEL cpu SOURCES tp_reference_checkpoint_test.cc
                 LIBS verifyd_tp verifyd_kernels_ref nlohmann_json::nlohmann_json)
target_compile_definitions(tp_reference_checkpoint_test
                           PRIVATE VERIFYD_TEST_DATA_DIR="${CMAKE_SOURCE_DIR}/tests/data")
