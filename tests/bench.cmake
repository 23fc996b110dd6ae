# Benchmark record (label cpu): the tables of docs/PERF.md are generated from the raw JSON
# under bench/results/ by bench/perf_report.py; this test fails when they drift apart. And the
# seesaw kernel's protocol model (host only).
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME perf_report_check
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/bench/perf_report.py --check)
  set_tests_properties(perf_report_check PROPERTIES LABELS cpu TIMEOUT 60)
  # Its table kinds on small synthetic JSON (tests/perf_report_test.py; engine_slice).
  add_test(NAME perf_report_unit_test
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/perf_report_test.py)
  set_tests_properties(perf_report_unit_test PROPERTIES LABELS cpu TIMEOUT 60)
  # The seesaw kernel's barrier protocol (bf16 and FP8 instances), replayed by the host model
  # in random interleavings; it also checks that removing any of the FP8 conversion waits is
  # caught. Mirror kernel barrier changes in bench/seesaw_schedule_model.py.
  add_test(NAME seesaw_protocol_model
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/bench/seesaw_schedule_model.py protocol)
  set_tests_properties(seesaw_protocol_model PROPERTIES LABELS cpu TIMEOUT 300)
endif()
