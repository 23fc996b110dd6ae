#!/usr/bin/env bash
# The installed layout: `cmake --install BUILD_DIR --prefix <a temporary directory>`, then
#   - bin/verifyd, bin/verifyctl, share/verifyd/ (systemd unit and environment file, Prometheus
#     rules, Grafana dashboard, Kubernetes manifests, container build) are there, and with CUDA
#     lib/verifyd/ holds the CUDA engine module;
#   - the installed verifyd finds that module: `--backend=cuda` either serves (a GPU is
#     visible) or fails with "no CUDA device is visible", never "the CUDA engine module is not
#     available" (what a binary copied without its module says); without CUDA it names that;
#   - every library the installed binaries and module link resolves.
#   check_install.sh BUILD_DIR WITH_CUDA(ON|OFF)
set -uo pipefail
build=$1
with_cuda=$2
prefix=$(mktemp -d /tmp/verifyd-install.XXXXXX)
trap 'rm -rf "$prefix"' EXIT
fail=0
bad() { echo "check_install: $*" >&2; fail=1; }
cmake --install "$build" --prefix "$prefix" > "$prefix.log" 2>&1 || {
  cat "$prefix.log" >&2
  rm -f "$prefix.log"
  echo "check_install: cmake --install failed" >&2
  exit 1
}
rm -f "$prefix.log"
for f in bin/verifyd bin/verifyctl share/verifyd/systemd/verifyd.service \
  share/verifyd/systemd/verifyd.env share/verifyd/prometheus/verifyd-rules.yml \
  share/verifyd/grafana/verifyd-dashboard.json share/verifyd/container/Dockerfile \
  share/verifyd/OPERATIONS.md; do
  [ -e "$prefix/$f" ] || bad "missing $f"
done
[ -d "$prefix/share/verifyd/k8s/base" ] || bad "missing share/verifyd/k8s/base"
module=$prefix/lib/verifyd/libverifyd_cuda_engine.so
if [ "$with_cuda" = ON ]; then
  [ -e "$module" ] || bad "missing lib/verifyd/libverifyd_cuda_engine.so (the CUDA engine module)"
else
  [ -e "$module" ] && bad "a CUDA engine module in a build without CUDA"
fi
out=$(timeout 60 "$prefix/bin/verifyd" --backend=cuda --model=tiny --listen=127.0.0.1:0 \
  --metrics_listen= 2>&1 &
  pid=$!
  # A GPU machine serves: stop it once it logged that it listens.
  for _ in $(seq 1 100); do
    kill -0 $pid 2> /dev/null || break
    sleep 0.3
  done
  kill -TERM $pid 2> /dev/null
  wait $pid)
if [ "$with_cuda" = ON ]; then
  if grep -q "module is not available" <<< "$out"; then
    bad "the installed verifyd did not find its CUDA engine module: $out"
  elif ! grep -q -E "no CUDA device is visible|serving|listening" <<< "$out"; then
    bad "unexpected output of the installed verifyd --backend=cuda: $out"
  fi
else
  grep -q "this build may lack CUDA" <<< "$out" || bad "unexpected output without CUDA: $out"
fi
for f in "$prefix"/bin/* "$prefix"/lib/verifyd/*.so; do
  [ -e "$f" ] || continue
  missing=$(ldd "$f" 2>&1 | grep "not found" | grep -v -E "libcuda\.so|libnvidia")
  [ -z "$missing" ] || bad "$f: $missing"
done
[ $fail = 0 ] && echo "check_install: the installed tree under a temporary prefix is complete and its verifyd finds the CUDA engine module (CUDA=$with_cuda)"
exit $fail
