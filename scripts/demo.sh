#!/usr/bin/env bash
# The README's first command: installs the dependencies, builds, starts verifyd on its
# embedded default (the `tiny` preset; CUDA backend when a GPU is visible, else CPU), runs the
# demo drafter against it over gRPC (prints accepted length and tokens/s), then stops the
# server with SIGTERM (it drains and exits 0).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${VERIFYD_BUILD_DIR:-$root/build}
port=${VERIFYD_DEMO_PORT:-50051}
metrics_port=${VERIFYD_DEMO_METRICS_PORT:-9400}

"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"

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
