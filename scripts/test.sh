#!/usr/bin/env bash
# The README's test command: installs the dependencies, builds, and runs the CPU test suite
# (CTest label `cpu`: every test that needs no GPU), then the GPU suites (label `gpu`), which
# run on a machine with a GPU and report Skipped (exit 77) on one without.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh" "$@"
build=${VERIFYD_BUILD_DIR:-$root/build}
ctest --test-dir "$build" -L cpu --output-on-failure -j "${VERIFYD_TEST_JOBS:-2}"
if ctest --test-dir "$build" -N -L gpu | grep -q "Test *#"; then
  ctest --test-dir "$build" -L gpu --output-on-failure
fi
