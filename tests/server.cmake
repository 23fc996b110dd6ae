# server/ and client/ tests (label cpu): units (slot allocator, validation, demo drafter) and
# loopback gRPC tests against an in-process server (toy engine for speed; the real CPU
# engine for the lossless test at TP 1, 2, 4 and for the truncate / fork / chunked-prefill
# token checks of the sessions test).
verifyd_add_test(server_slot_allocator_test LABEL cpu
  SOURCES server_slot_allocator_test.cc LIBS verifyd_server_lib)
verifyd_add_test(server_validation_test LABEL cpu
  SOURCES server_validation_test.cc LIBS verifyd_server_lib)
verifyd_add_test(server_service_test LABEL cpu
  SOURCES server_service_test.cc LIBS verifyd_server_testing)
verifyd_add_test(server_sessions_test LABEL cpu
  SOURCES server_sessions_test.cc LIBS verifyd_server_testing verifyd_tp)
verifyd_add_test(server_sampling_test LABEL cpu
  SOURCES server_sampling_test.cc LIBS verifyd_server_testing verifyd_tp)
verifyd_add_test(server_lossless_test LABEL cpu
  SOURCES server_lossless_test.cc LIBS verifyd_server_testing verifyd_tp)
verifyd_add_test(server_main_test LABEL cpu
  SOURCES server_main_test.cc LIBS verifyd_server_testing verifyd_test_process
  BINARIES verifyd verifyctl)
target_compile_definitions(server_main_test PRIVATE VERIFYD_SOURCE_ROOT="${CMAKE_SOURCE_DIR}")
if(TARGET PkgConfig::SYSTEMD)
  target_compile_definitions(server_main_test PRIVATE VERIFYD_WITH_SYSTEMD=1)
endif()
# verifyd --print_memory_plan through the binary (the per-GPU plan, nothing loaded).
verifyd_add_test(server_memory_plan_test LABEL cpu
  SOURCES server_memory_plan_test.cc LIBS verifyd_tp verifyd_test_process absl::time
  BINARIES verifyd)
verifyd_add_test(client_demo_test LABEL cpu
  SOURCES client_demo_test.cc LIBS verifyd_server_testing)
verifyd_add_test(server_metrics_test LABEL cpu
  SOURCES server_metrics_test.cc LIBS verifyd_server_lib)
verifyd_add_test(client_verifyctl_test LABEL cpu
  SOURCES client_verifyctl_test.cc LIBS verifyd_server_testing verifyd_test_process
  BINARIES verifyd verifyctl)
target_compile_definitions(client_verifyctl_test PRIVATE VERIFYD_SOURCE_ROOT="${CMAKE_SOURCE_DIR}")
