# Reliability and security tests (label cpu): security building blocks, limits,
# overload, faults, soak, and fuzzing. See docs/RELIABILITY.md for the promise each checks.
#
# Fuzzing: three harnesses in tests/fuzz/ (validation, sessions, kernels_params).
#   rel_fuzz_replay_<h>  every build: the checked-in seed corpus and the regression inputs
#                        of crashes found earlier, replayed through the harness (any compiler).
#   rel_fuzz_<h>         libFuzzer for VERIFYD_FUZZ_SECONDS per harness: built when the C++
#                        compiler is clang with libFuzzer (scripts/sanitizers.sh's ASan+UBSan
#                        build is one); otherwise the test reports SKIPPED (return code 77).

# --- Security (server/security.h, wired into verifyd_server_lib) --------------------------
add_library(verifyd_rel_testutil STATIC rel_util.cc)
target_link_libraries(verifyd_rel_testutil PUBLIC gRPC::grpc++ absl::status absl::statusor
  absl::strings absl::time verifyd_test_process)

verifyd_add_test(rel_security_test LABEL cpu TIMEOUT 120
  SOURCES rel_security_test.cc
  LIBS verifyd_server_lib verifyd_rel_testutil verifyd_client verifyd_proto
  BINARIES verifyd verifyctl)

# --- Fuzzing ------------------------------------------------------------------------------
set(VERIFYD_FUZZ_SECONDS 30 CACHE STRING "Seconds each libFuzzer harness runs in rel_fuzz_*")
set(_rel_fuzz_dir ${CMAKE_CURRENT_SOURCE_DIR}/fuzz)

set(VERIFYD_HAVE_LIBFUZZER OFF)
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  include(CheckCXXSourceCompiles)
  set(CMAKE_REQUIRED_FLAGS "-fsanitize=fuzzer")
  set(CMAKE_REQUIRED_LINK_OPTIONS "-fsanitize=fuzzer")
  check_cxx_source_compiles(
    "#include <cstddef>\n#include <cstdint>\nextern \"C\" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }"
    VERIFYD_LIBFUZZER_LINKS)
  unset(CMAKE_REQUIRED_FLAGS)
  unset(CMAKE_REQUIRED_LINK_OPTIONS)
  if(VERIFYD_LIBFUZZER_LINKS)
    set(VERIFYD_HAVE_LIBFUZZER ON)
  endif()
endif()
message(STATUS "verifyd: libFuzzer harnesses ${VERIFYD_HAVE_LIBFUZZER}")

# verifyd_rel_fuzz(<harness> SOURCES <code under test> LIBS <its dependencies>
#                  REPLAY_LIBS <libraries that hold the code under test>)
# The libFuzzer binary compiles the code under test itself with coverage instrumentation
# (-fsanitize=fuzzer-no-link); the replay binary links the ordinary libraries.
function(verifyd_rel_fuzz harness)
  cmake_parse_arguments(F "" "" "SOURCES;LIBS;REPLAY_LIBS" ${ARGN})
  set(main ${_rel_fuzz_dir}/${harness}_fuzz.cc)
  add_executable(rel_fuzz_replay_${harness} ${main} ${_rel_fuzz_dir}/replay_main.cc)
  target_link_libraries(rel_fuzz_replay_${harness} PRIVATE ${F_REPLAY_LIBS} ${F_LIBS})
  set(inputs ${_rel_fuzz_dir}/corpus/${harness})
  if(IS_DIRECTORY ${_rel_fuzz_dir}/regressions/${harness})
    list(APPEND inputs ${_rel_fuzz_dir}/regressions/${harness})
  endif()
  add_test(NAME rel_fuzz_replay_${harness} COMMAND rel_fuzz_replay_${harness} ${inputs})
  set_tests_properties(rel_fuzz_replay_${harness} PROPERTIES LABELS cpu TIMEOUT 300)

  if(VERIFYD_HAVE_LIBFUZZER)
    add_executable(fuzz_${harness} ${main} ${F_SOURCES})
    target_compile_options(fuzz_${harness} PRIVATE -fsanitize=fuzzer-no-link)
    target_link_options(fuzz_${harness} PRIVATE -fsanitize=fuzzer)
    target_link_libraries(fuzz_${harness} PRIVATE ${F_LIBS})
    add_test(NAME rel_fuzz_${harness}
      COMMAND ${_rel_fuzz_dir}/run_fuzz.sh $<TARGET_FILE:fuzz_${harness}> ${harness}
              ${VERIFYD_FUZZ_SECONDS} ${_rel_fuzz_dir} ${CMAKE_BINARY_DIR}/fuzz-artifacts)
    math(EXPR timeout "${VERIFYD_FUZZ_SECONDS} * 2 + 120")
    set_tests_properties(rel_fuzz_${harness} PROPERTIES LABELS cpu TIMEOUT ${timeout})
  else()
    add_test(NAME rel_fuzz_${harness}
      COMMAND sh -c "echo 'SKIPPED: rel_fuzz_${harness} needs clang with libFuzzer (build with CXX=clang++, e.g. scripts/sanitizers.sh)'; exit 77")
    set_tests_properties(rel_fuzz_${harness} PROPERTIES LABELS cpu SKIP_RETURN_CODE 77)
  endif()
endfunction()

set(_rel_src ${PROJECT_SOURCE_DIR})
verifyd_rel_fuzz(validation
  SOURCES ${_rel_src}/server/validation.cc ${_rel_src}/kernels/reference/tree_accept_ref.cc
  LIBS verifyd_proto absl::status absl::strings absl::flat_hash_set
  REPLAY_LIBS verifyd_server_lib verifyd_kernels_ref)
verifyd_rel_fuzz(sessions
  SOURCES ${_rel_src}/server/session_manager.cc ${_rel_src}/server/slot_allocator.cc
          ${_rel_src}/server/scheduler.cc ${_rel_src}/server/validation.cc
          ${_rel_src}/server/metrics.cc ${_rel_src}/server/toy_engine.cc ${_rel_src}/tp/step.cc
  LIBS verifyd_proto prometheus-cpp::core spdlog::spdlog absl::status absl::statusor
       absl::synchronization absl::time absl::strings absl::str_format absl::flat_hash_map
       absl::flat_hash_set absl::random_random Threads::Threads
  REPLAY_LIBS verifyd_server_lib)
verifyd_rel_fuzz(kernels_params
  SOURCES ${_rel_src}/kernels/reference/tree_accept_ref.cc
          ${_rel_src}/kernels/reference/verify_attention_ref.cc
          ${_rel_src}/kernels/reference/ops.cc
  LIBS absl::status absl::statusor absl::strings Threads::Threads
  REPLAY_LIBS verifyd_kernels_ref)

# --- Limits, overload, faults, soak -------------------------------------------------------
verifyd_add_test(rel_limits_test LABEL cpu TIMEOUT 120
  SOURCES rel_limits_test.cc LIBS verifyd_server_testing)
verifyd_add_test(rel_faults_test LABEL cpu TIMEOUT 300
  SOURCES rel_faults_test.cc LIBS verifyd_server_testing verifyd_rel_testutil verifyd_tp
  BINARIES verifyd verifyctl)
verifyd_add_test(rel_soak_test LABEL cpu TIMEOUT 300
  SOURCES rel_soak_test.cc LIBS verifyd_server_testing verifyd_rel_testutil verifyd_tp
  BINARIES verifyd)
