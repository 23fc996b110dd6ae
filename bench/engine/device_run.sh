#!/usr/bin/env bash
# Runs the GPU engine's tests, the engine benchmark and a gRPC round trip on a GPU machine,
# from a bundle made on the build machine:
#   device-bundle BUNDLE gpu_engine_*_test engine_bench [verifyd verifyctl]
#   (drop BUNDLE/lib/libcublas*: the GPU machine has its own cuBLAS 13)
#   bench/engine/device_run.sh BUNDLE OUTDIR [bench flags...]
# Logs and JSON are packed into OUTDIR/engine_results.tgz (the device tool returns at most 8
# files), engine_bench.json is copied too; a short summary is printed last.
# Env: SKIP_TESTS=1 skips the tests; SANITIZE=1 runs the dense-op test under compute-sanitizer memcheck; SKIP_BENCH=1,
# SKIP_GRPC=1 skip those parts; BENCH_TIMEOUT (s); GRPC_MODEL (preset for verifyd).
set -u
bundle=$1
final_out=$2
shift 2
out=$(mktemp -d /tmp/engine-run.XXXXXX)
pack() {  # after every phase, so a run stopped at its time limit still returns its logs
  tar czf "$final_out/engine_results.tgz" -C "$out" .
  [ -f "$out/engine_bench.json" ] && cp "$out/engine_bench.json" "$final_out/"
  return 0
}
source "$bundle/env.sh"
export NCCL_NVLS_ENABLE=0
# cuBLAS 13 of the machine (CUDA toolkit, or the Python wheel).
cublas_dir=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -e "$d/libcublasLt.so.13" ] && cublas_dir=$d && break
done
if [ -z "$cublas_dir" ]; then
  f=$(find / -xdev -name 'libcublasLt.so.13' 2>/dev/null | head -1)
  [ -n "$f" ] && cublas_dir=$(dirname "$f")
fi
export LD_LIBRARY_PATH="$LD_LIBRARY_PATH${cublas_dir:+:$cublas_dir}"
echo "cublas from: ${cublas_dir:-none}"
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader || true

summary=()
for t in gpu_engine_dense_test gpu_engine_nccl_test gpu_engine_test; do
  if [ -x "$bundle/bin/$t" ] && [ "${SKIP_TESTS:-0}" != 1 ]; then
    timeout "${TEST_TIMEOUT:-300}" "$bundle/bin/$t" > "$out/$t.log" 2>&1
    rc=$?
    summary+=("$t rc=$rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$t.log" | tr '\n' ' ')")
    pack
  fi
done
grep -hE 'logits rel L2|lossless on GPU|FAILED|Failure|error' "$out"/gpu_engine_*.log | head -40
if [ "${SANITIZE:-0}" = 1 ] && command -v compute-sanitizer > /dev/null; then
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$bundle/bin/gpu_engine_dense_test" > "$out/sanitize_dense.log" 2>&1
  summary+=("memcheck gpu_engine_dense_test rc=$?")
  tail -4 "$out/sanitize_dense.log"
fi

if [ -x "$bundle/bin/engine_bench" ] && [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout "${BENCH_TIMEOUT:-240}" "$bundle/bin/engine_bench" --json="$out/engine_bench.json" "$@" \
    > "$out/engine_bench.log" 2> "$out/engine_bench.err"
  summary+=("engine_bench rc=$?")
  pack
  cat "$out/engine_bench.log"
  tail -3 "$out/engine_bench.err"
fi

if [ -x "$bundle/bin/verifyd" ] && [ -x "$bundle/bin/verifyctl" ] && [ "${SKIP_GRPC:-0}" != 1 ]; then
  start_verifyd() {  # $1: metrics address ("" = no metrics endpoint)
    "$bundle/bin/verifyd" --backend=cuda --model="${GRPC_MODEL:-kimi-k2-attn}" --kv_slots=65536 \
      --listen=127.0.0.1:50051 --metrics_listen="$1" >> "$out/verifyd.log" 2>&1 &
    pid=$!
    for i in $(seq 1 120); do
      "$bundle/bin/verifyctl" --target=127.0.0.1:50051 info > "$out/info.log" 2>&1 && return 0
      kill -0 $pid 2> /dev/null || return 1  # verifyd exited (see verifyd.log)
      sleep 1
    done
    return 1
  }
  metrics=127.0.0.1:9400
  start_verifyd "$metrics" || { metrics=""; start_verifyd ""; }
  "$bundle/bin/verifyctl" --target=127.0.0.1:50051 demo --quiet --rounds=32 > "$out/demo.log" 2>&1
  summary+=("verifyctl demo rc=$?")
  "$bundle/bin/verifyctl" --target=127.0.0.1:50051 load --sessions=8 --rounds=64 > "$out/load.log" 2>&1
  summary+=("verifyctl load rc=$?")
  [ -n "$metrics" ] && python3 -c "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:9400/metrics').read().decode())" \
    > "$out/metrics.txt" 2>&1
  kill -TERM $pid
  for i in $(seq 1 30); do kill -0 $pid 2> /dev/null || break; sleep 0.5; done
  kill -0 $pid 2> /dev/null && kill -KILL $pid
  wait $pid
  summary+=("verifyd exit=$? (after SIGTERM)")
  cat "$out/info.log" "$out/demo.log" "$out/load.log" | tail -30
  [ -f "$out/metrics.txt" ] && grep -E '^verifyd_(verify|engine_step)[a-z_]*_(sum|count)' "$out/metrics.txt"
fi
pack
printf '%s\n' "${summary[@]}"
