#!/usr/bin/env bash
# The batch-invariant mode's checks and costs on a GPU machine, in one call:
#   scripts/gpu-invariance-check.sh [checks] [server] [sanitize] [kernel] [engine] [long]
#   (default: all six; about 20 minutes in all, so within the 10-minute limit of one device
#   command run `checks server sanitize`, then `kernel engine`, then `long`). Expects the binaries on PATH (gpu_verify_attention_test,
#   gpu_batch_invariance_test, gpu_engine_nccl_test, verifyd, verifyctl,
#   libverifyd_cuda_engine.so beside verifyd, verify_attention_bench, engine_bench,
#   batch_variance), e.g. from a device bundle: source .device/env.sh first.
#   checks    the positional kernel tests (against the reference; tree node == chain), the
#             engine's tree-node == plain-decoding test, the NCCL rank-order reduction;
#             batch_variance --batch_invariant (61 layers, 4k and 65k tokens)
#   server    verifyd --batch_invariant at TP 1 and loopback TP 2, 4, 8 (kimi-k2-attn, 4
#             layers) and at TP 1 and 2 on tests/data/checkpoints/moe_fp8_attn128 (the
#             fallback attention, every FP8 linear in FP8; run from the repository root):
#             verifyctl load --sessions=8, greedy and seeded at T 0.8; every run must report
#             lossless_mismatches=0
#   sanitize  compute-sanitizer memcheck on the positional kernel tests
#   kernel    verify_attention_bench --config=auto, then --positional --shared_context=false
#             (per-node plans), then --positional (shared-context plans, the default)
#   engine    engine_bench, default then --batch_invariant --shared_context=false then
#             --batch_invariant (61 layers; 4k/65k x trees 1/16/64 x batches 1/8/32)
#   long      engine_bench, default then --batch_invariant (per-node plans, then shared) at
#             185k x trees 1/64 x batches 1/8
# JSON goes to $OUT, logs packed into $OUT/logs.tgz (the device tool returns at most 8 files:
# keep the JSON of the steps you run within that).
# Env: VERIFYD_COMMIT (recorded in the JSON). Prints a summary last. Never changes clocks,
# power or MIG settings.
set -uo pipefail
OUT=${OUT:-/tmp/verifyd-invariance-out}
mkdir -p "$OUT"
LOGS=$(mktemp -d /tmp/verifyd-invariance.XXXXXX)
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(checks server sanitize kernel engine long)
commit=${VERIFYD_COMMIT:-unknown}
export NCCL_NVLS_ENABLE=0
summary=()
flags=(--layers=61 --warmup=1 --iters=2 --commit="$commit")  # engine_bench
# shellcheck disable=SC2054  # the commas separate values inside one flag
small=(--contexts=4096,65536 --trees=1,16,64 --batches=1,8,32)
# shellcheck disable=SC2054
long=(--contexts=185000 --trees=1,64 --batches=1,8)
pack() { tar czf "$OUT/logs.tgz" -C "$LOGS" . 2> /dev/null; }
run() {  # name, timeout seconds, command...: logs to $LOGS/name.log, one summary line
  local name=$1 limit=$2
  shift 2
  timeout "$limit" stdbuf -oL "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  summary+=("$name rc=$rc $(grep -E '^\[  (PASSED|FAILED) ' "$LOGS/$name.log" | tr '\n' ' ')")
  pack
  return $rc
}
for step in "${steps[@]}"; do
  case $step in
    checks)
      run positional_tests 300 gpu_verify_attention_test --gtest_filter='*Positional*'
      grep -E "differ from|rel_l2|Failure" "$LOGS/positional_tests.log" | tail -30
      run batch_invariance_test 120 gpu_batch_invariance_test
      grep -E "differ" "$LOGS/batch_invariance_test.log"
      run nccl_test 60 gpu_engine_nccl_test
      run batch_variance 300 batch_variance --layers=61 --batch_invariant --commit="$commit" \
        --json="$OUT/batch_variance.json"
      tail -14 "$LOGS/batch_variance.log"
      ;;
    server)
      # kimi-k2-attn (the verify kernel's positional plans) at TP 1 and loopback 2, 4, 8; a
      # transformers-made FP8 checkpoint (latent width 192: the fallback attention; FP8 linears)
      # at TP 1 and 2.
      port=50079
      for target in kimi:1 kimi:2 kimi:4 kimi:8 fp8:1 fp8:2; do
        tp=${target#*:}
        model=(--model=kimi-k2-attn --preset_layers=4)
        [ "${target%%:*}" = fp8 ] && model=(--model=tests/data/checkpoints/moe_fp8_attn128)
        name=${target/:/_tp}
        devices=$(yes 0 | head -"$tp" | paste -sd,)
        verifyd --backend=cuda "${model[@]}" --tp="$tp" --cuda_devices="$devices" \
          --batch_invariant --listen=127.0.0.1:$port --metrics_listen= \
          > "$LOGS/verifyd_$name.log" 2>&1 &
        pid=$!
        for _ in $(seq 1 240); do
          verifyctl --target=127.0.0.1:$port info > /dev/null 2>&1 && break
          sleep 0.5
        done
        for mode in greedy sampled; do
          extra=()
          [ "$mode" = sampled ] && extra=(--temperature=0.8 --seed=7)
          timeout 120 verifyctl --target=127.0.0.1:$port load --sessions=8 --rounds=64 \
            "${extra[@]}" > "$LOGS/load_${name}_$mode.txt" 2>&1
          line=$(grep -o "lossless_mismatches=[0-9]*" "$LOGS/load_${name}_$mode.txt")
          summary+=("server $name $mode: ${line:-no report}")
        done
        kill -TERM $pid
        wait $pid
      done
      pack
      ;;
    sanitize)
      run memcheck 600 compute-sanitizer --tool memcheck --error-exitcode 9 \
        gpu_verify_attention_test --gtest_filter='*PositionalTreeEqualsChain*'
      tail -2 "$LOGS/memcheck.log"
      ;;
    kernel)
      run kernel_auto 120 verify_attention_bench --iters=20 --warmup=5 --commit="$commit" \
        --json="$OUT/kernel_auto.json"
      run kernel_positional 120 verify_attention_bench --positional --shared_context=false \
        --iters=20 --warmup=5 \
        --commit="$commit" --json="$OUT/kernel_positional.json"
      run kernel_shared 120 verify_attention_bench --positional --iters=20 --warmup=5 \
        --commit="$commit" --json="$OUT/kernel_shared.json"
      ;;
    engine)
      run engine_default 300 engine_bench "${flags[@]}" "${small[@]}" \
        --json="$OUT/engine_default.json"
      run engine_invariant 400 engine_bench "${flags[@]}" "${small[@]}" --batch_invariant \
        --shared_context=false --json="$OUT/engine_invariant.json"
      run engine_shared 400 engine_bench "${flags[@]}" "${small[@]}" --batch_invariant \
        --json="$OUT/engine_shared.json"
      ;;
    long)
      run engine185_default 200 engine_bench "${flags[@]}" "${long[@]}" \
        --json="$OUT/engine185_default.json"
      run engine185_invariant 300 engine_bench "${flags[@]}" "${long[@]}" --batch_invariant \
        --shared_context=false --json="$OUT/engine185_invariant.json"
      run engine185_shared 300 engine_bench "${flags[@]}" "${long[@]}" --batch_invariant \
        --json="$OUT/engine185_shared.json"
      ;;
    *)
      echo "unknown step: $step" >&2
      exit 2
      ;;
  esac
done
pack
printf '%s\n' "${summary[@]}"
