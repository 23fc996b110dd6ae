#!/usr/bin/env bash
# The README's test command: installs the dependencies, builds, and runs the CPU test suite
# (CTest label `cpu`: every test that needs no GPU) and the Python client's tests, then the
# GPU suites (label `gpu`), which run on a machine with a GPU and report Skipped (exit 77) on
# one without.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh" "$@"
build=${VERIFYD_BUILD_DIR:-$root/build}
ctest --test-dir "$build" -L cpu --output-on-failure -j "${VERIFYD_TEST_JOBS:-2}"
# The Python client (client/python): installed from this tree, with what its examples need,
# into a virtual environment in the build directory; then its pytest suite runs against the
# verifyd just built (tests/test_stubs.py checks the shipped stubs against proto/ with protoc).
venv="$build/python-client-venv"
"$venv/bin/python" -c '' 2>/dev/null || "${VERIFYD_PYTHON:-python3}" -m venv --clear "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
  "$root/client/python[examples,test]"
VERIFYD_BIN="$build/server/verifyd" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  "$root/client/python/tests"
# (grep -c reads all of ctest's listing: grep -q would stop early and, under pipefail, the
# listing's broken pipe would read as "no GPU suites".)
gpu_suites=$(ctest --test-dir "$build" -N -L gpu | grep -c "Test *#" || true)
if [ "${gpu_suites:-0}" -gt 0 ]; then
  ctest --test-dir "$build" -L gpu --output-on-failure
fi
