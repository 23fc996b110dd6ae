# Benchmark record (label cpu): the tables of docs/PERF.md are generated from the raw JSON
# under bench/results/ by bench/perf_report.py; this test fails when they drift apart.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME perf_report_check
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/bench/perf_report.py --check)
  set_tests_properties(perf_report_check PROPERTIES LABELS cpu TIMEOUT 60)
endif()
