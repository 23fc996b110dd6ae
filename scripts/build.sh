#!/usr/bin/env bash
# Configures and builds verifyd into ./build (or $VERIFYD_BUILD_DIR). CUDA kernels are built
# when the CUDA toolkit is found (for sm_90a and sm_120; they compile without a GPU).
# Extra CMake arguments are passed through, e.g. scripts/build.sh -DVERIFYD_CUDA=OFF
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${VERIFYD_BUILD_DIR:-$root/build}
jobs=${VERIFYD_JOBS:-$(nproc)}
cmake -S "$root" -B "$build" -G Ninja "$@"
cmake --build "$build" -j "$jobs"
