#!/usr/bin/env bash
# The README's first command: installs the dependencies, builds what the demo runs (verifyd
# and verifyctl; with a GPU visible, in ./build with the CUDA engine module; without one, a
# CPU-only build in ./build-demo, minutes instead of the full CUDA build that the test command
# makes), starts verifyd on its embedded default (the `tiny` preset; CUDA backend when a GPU is
# visible, else CPU), runs the demo drafter against it over gRPC (prints accepted length and
# tokens/s), then stops the server with SIGTERM (it drains and exits 0).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
port=${VERIFYD_DEMO_PORT:-50051}
metrics_port=${VERIFYD_DEMO_METRICS_PORT:-9400}

"$root/scripts/install-deps.sh"
if nvidia-smi -L > /dev/null 2>&1; then
  build=${VERIFYD_BUILD_DIR:-$root/build}
  cmake -S "$root" -B "$build" -G Ninja
  cmake --build "$build" --target verifyd verifyctl -j "${VERIFYD_JOBS:-$(nproc)}"
else
  echo "demo: no GPU visible: a CPU-only build of verifyd and verifyctl in build-demo/"
  build=${VERIFYD_BUILD_DIR:-$root/build-demo}
  cmake -S "$root" -B "$build" -G Ninja -DVERIFYD_CUDA=OFF -DVERIFYD_BUILD_TESTS=OFF \
    -DVERIFYD_BUILD_BENCH=OFF
  cmake --build "$build" --target verifyd verifyctl -j "${VERIFYD_JOBS:-$(nproc)}"
fi

"$build/server/verifyd" --model tiny --backend auto --listen "127.0.0.1:$port" \
  --metrics_listen "127.0.0.1:$metrics_port" &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT

for _ in $(seq 1 100); do
  "$build/client/verifyctl" --target "127.0.0.1:$port" info >/dev/null 2>&1 && break
  kill -0 $server 2>/dev/null || { echo "demo: verifyd exited early" >&2; exit 1; }
  sleep 0.1
done
"$build/client/verifyctl" --target "127.0.0.1:$port" info
"$build/client/verifyctl" --target "127.0.0.1:$port" demo "$@"
echo "demo: metrics at http://127.0.0.1:$metrics_port/metrics (sample):"
curl -s "http://127.0.0.1:$metrics_port/metrics" | grep -E '^verifyd_(emitted|accepted|draft)_tokens_total' || true
kill -TERM $server
wait $server
trap - EXIT
echo "demo: verifyd drained and exited 0"
