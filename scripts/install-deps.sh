#!/usr/bin/env bash
# Installs the Debian packages verifyd's build, tests and tools need. Idempotent: packages
# already present are skipped. Needs root (or sudo). The CUDA toolkit (nvcc, cuBLAS, NCCL) is
# not a Debian package here: it is used from /usr/local/cuda when present, else the build is
# CPU-only.
set -euo pipefail

packages=(
  # build
  build-essential cmake ninja-build pkg-config git
  # gRPC, protobuf, abseil
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  # metrics, logging, JSON, systemd notify
  prometheus-cpp-dev libspdlog-dev nlohmann-json3-dev libsystemd-dev
  # tests and micro-benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  # tools the tests use
  curl python3
)
# Area-specific additions (operations tooling, fuzzing, ...) list their packages here.
for extra in "$(dirname "$0")"/deps.d/*.list; do
  [ -e "$extra" ] || continue
  while read -r p _; do
    [[ -z "$p" || "$p" == \#* ]] && continue
    packages+=("$p")
  done <"$extra"
done

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# With the CUDA toolkit: the CUTLASS headers of the grouped expert GEMMs (pinned wheel, after
# the packages: it needs python3-pip).
# Not fatal: without the headers the build leaves the grouped GEMMs out (per-expert cuBLAS).
fetch_cutlass() {
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    "$(dirname "$0")/fetch-cutlass.sh" ||
      echo "install-deps: CUTLASS headers not fetched; building without the grouped expert GEMMs"
  fi
}
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  fetch_cutlass
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fetch_cutlass
