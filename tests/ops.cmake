# Operations tests: deploy/ checked by the real tools (promtool, Prometheus,
# systemd-analyze, yamllint, kubectl kustomize), the sd_notify protocol, and a live integration
# test of verifyd + Prometheus. All labelled `cpu`. Script tests exit 77 when a tool is missing:
# CTest reports them as skipped (SKIP_RETURN_CODE), never as passed. The Debian packages they
# need are listed in scripts/deps.d/ops.list.
set(VERIFYD_OPS_DIR ${CMAKE_CURRENT_SOURCE_DIR}/ops)
# Debian's python3 carries python3-yaml; prefer it over a python3 that happens to be first on
# PATH (pyenv, venv) without PyYAML.
find_program(VERIFYD_OPS_PYTHON NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(NOT VERIFYD_OPS_PYTHON)
  find_program(VERIFYD_OPS_PYTHON NAMES python3 REQUIRED)
endif()

function(verifyd_ops_script_test name)
  add_test(NAME ${name} COMMAND ${ARGN})
  set_tests_properties(${name} PROPERTIES LABELS cpu TIMEOUT 120 SKIP_RETURN_CODE 77)
endfunction()

verifyd_ops_script_test(ops_yamllint bash ${VERIFYD_OPS_DIR}/check_yaml.sh)
verifyd_ops_script_test(ops_prometheus_rules bash ${VERIFYD_OPS_DIR}/check_prometheus.sh)
verifyd_ops_script_test(ops_grafana_dashboard
  ${VERIFYD_OPS_PYTHON} ${VERIFYD_OPS_DIR}/check_grafana.py)
verifyd_ops_script_test(ops_container ${VERIFYD_OPS_PYTHON} ${VERIFYD_OPS_DIR}/check_container.py)

# With the verifyd binary, the unit's and the manifests' flags are also checked against it.
if(TARGET verifyd)
  verifyd_ops_script_test(ops_systemd_unit
    bash ${VERIFYD_OPS_DIR}/check_systemd.sh $<TARGET_FILE:verifyd>)
  verifyd_ops_script_test(ops_k8s_manifests
    ${VERIFYD_OPS_PYTHON} ${VERIFYD_OPS_DIR}/check_k8s.py --verifyd $<TARGET_FILE:verifyd>)
else()
  verifyd_ops_script_test(ops_systemd_unit bash ${VERIFYD_OPS_DIR}/check_systemd.sh)
  verifyd_ops_script_test(ops_k8s_manifests ${VERIFYD_OPS_PYTHON} ${VERIFYD_OPS_DIR}/check_k8s.py)
endif()

if(TARGET verifyd AND TARGET verifyctl)
  # `cmake --install` into a temporary prefix: the installed tree, and the installed verifyd
  # finds its CUDA engine module (the binaries must be built first: CTest runs after the build).
  verifyd_ops_script_test(ops_install_layout
    bash ${VERIFYD_OPS_DIR}/check_install.sh ${CMAKE_BINARY_DIR} ${VERIFYD_WITH_CUDA})
  # verifyd (tiny, CPU) + a real Prometheus scraping it on loopback; ~20 s.
  verifyd_ops_script_test(ops_live_prometheus
    ${VERIFYD_OPS_PYTHON} ${VERIFYD_OPS_DIR}/live_integration.py
    --verifyd $<TARGET_FILE:verifyd> --verifyctl $<TARGET_FILE:verifyctl>)
  set_tests_properties(ops_live_prometheus PROPERTIES RUN_SERIAL TRUE)
endif()

# sd_notify protocol: SystemdNotifier against a datagram socket the test binds. Compiles the
# class directly (it depends on libsystemd and Abseil only), independent of verifyd_server_lib.
if(TARGET PkgConfig::SYSTEMD)
  verifyd_add_test(systemd_notify_test LABEL cpu TIMEOUT 60
    SOURCES ${VERIFYD_OPS_DIR}/systemd_notify_test.cc ${CMAKE_SOURCE_DIR}/server/systemd_notify.cc
    LIBS PkgConfig::SYSTEMD spdlog::spdlog absl::status absl::strings absl::synchronization
         absl::time Threads::Threads)
endif()
