#!/usr/bin/env bash
# The README's test command: installs the dependencies, builds, and runs the CPU test suite
# (CTest label `cpu`). GPU tests (label `gpu`) run on a machine with a GPU:
#   ctest --test-dir build -L gpu --output-on-failure
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh" "$@"
build=${VERIFYD_BUILD_DIR:-$root/build}
ctest --test-dir "$build" -L cpu --output-on-failure -j "${VERIFYD_TEST_JOBS:-2}"
