#!/usr/bin/env bash
# Exactness (batch-invariant steps, the CUDA backend's default) checked and its cost measured
# on a GPU machine:
#   scripts/gpu-invariance-check.sh [checks] [server] [sanitize] [kernel] [engine] [long]
#   (default: all six; about 25 minutes in all, so within the 10-minute limit of one device
#   command run `checks server`, then `sanitize kernel`, then `engine`, then `long`). Expects
#   the binaries on PATH (gpu_verify_attention_test, gpu_batch_invariance_test,
#   gpu_engine_nccl_test, verifyd, verifyctl, libverifyd_cuda_engine.so beside verifyd,
#   verify_attention_bench, engine_bench, batch_variance), e.g. from a device bundle: source
#   .device/env.sh first; run from the repository root (the test checkpoints).
#   checks    the positional kernel tests (against the reference; tree node == chain, split
#             groups == single splits), the engine's tree-node == plain-decoding and probe
#             tests (presets and the Kimi-K2-geometry FP8 MoE checkpoint), the NCCL rank-order
#             reduction; batch_variance (61 layers, 4k and 65k tokens)
#   server    verifyd with default flags: kimi-k2-attn (4 layers) at TP 1 and loopback TP 2 and
#             8; tests/data/checkpoints/kimi_fp8_moe (Kimi-K2 geometry, FP8 MoE) at TP 1 and 2;
#             tests/data/checkpoints/mla576 (dense) at TP 1. Per server, at once: greedy
#             sessions with short, medium and long prompts (their prefills run beside the
#             others' verifies) and seeded sampled sessions (T 0.8); every run must report
#             lossless_mismatches=0. Then a control: kimi-k2-attn TP 1 with
#             --batch_invariant=false (batch-adaptive steps), whose mismatches are reported
#   sanitize  compute-sanitizer memcheck on the positional kernel tests
#   kernel    verify_attention_bench --config=auto, then --positional (the default steps' plans)
#   engine    engine_bench, --batch_invariant=false (the old default) then the default (61
#             layers; 4k/16k/65k x trees 1/8/16/64 x batches 1/8/32)
#   long      the same at 185k x trees 1/8/16/64 x batches 1/8/32
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
small=(--contexts=4096,16384,65536 --trees=1,8,16,64 --batches=1,8,32 --standalone=false)
# shellcheck disable=SC2054
long=(--contexts=185000 --trees=1,8,16,64 --batches=1,8,32 --standalone=false)
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
      VERIFYD_TEST_DATA_DIR=$PWD/tests/data run batch_invariance_test 400 gpu_batch_invariance_test
      grep -E "differ" "$LOGS/batch_invariance_test.log"
      run nccl_test 60 gpu_engine_nccl_test
      run batch_variance 300 batch_variance --layers=61 --commit="$commit" \
        --json="$OUT/batch_variance.json"
      tail -14 "$LOGS/batch_variance.log"
      ;;
    server)
      port=50079
      for target in kimi:1 kimi:8 fp8moe:1 fp8moe:2 mla576:1 adaptive:1; do
        tp=${target#*:}
        kind=${target%%:*}
        model=(--model=kimi-k2-attn --preset_layers=4)
        lens=(4 300 2000)
        case $kind in
          fp8moe) model=(--model=tests/data/checkpoints/kimi_fp8_moe) lens=(4 100 600) ;;
          mla576) model=(--model=tests/data/checkpoints/mla576) lens=(4 30 150) ;;
          adaptive) model+=(--batch_invariant=false) ;;
        esac
        name=${target/:/_tp}
        devices=$(yes 0 | head -"$tp" | paste -sd,)
        verifyd --backend=cuda "${model[@]}" --tp="$tp" --cuda_devices="$devices" \
          --listen=127.0.0.1:$port --metrics_listen= > "$LOGS/verifyd_$name.log" 2>&1 &
        pid=$!
        for _ in $(seq 1 240); do
          verifyctl --target=127.0.0.1:$port info > /dev/null 2>&1 && break
          sleep 0.5
        done
        verifyctl --target=127.0.0.1:$port info > "$LOGS/info_$name.txt" 2>&1
        loads=()
        for len in "${lens[@]}"; do
          timeout 180 verifyctl --target=127.0.0.1:$port load --sessions=6 --rounds=30 \
            --prompt_len="$len" --seed="$len" > "$LOGS/load_${name}_greedy_$len.txt" 2>&1 &
          loads+=($!)
        done
        timeout 180 verifyctl --target=127.0.0.1:$port load --sessions=6 --rounds=30 \
          --prompt_len="${lens[1]}" --temperature=0.8 --seed=7 \
          > "$LOGS/load_${name}_sampled.txt" 2>&1 &
        loads+=($!)
        wait "${loads[@]}"
        for f in "$LOGS"/load_"${name}"_*.txt; do
          line=$(grep -o "lossless_mismatches=[0-9]*" "$f")
          summary+=("server $(basename "$f" .txt): ${line:-no report}")
        done
        summary+=("server $name: $(grep -o 'exact_lossless[^,]*' "$LOGS/info_$name.txt" | head -1)")
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
      run kernel_positional 120 verify_attention_bench --positional --iters=20 --warmup=5 \
        --commit="$commit" --json="$OUT/kernel_positional.json"
      ;;
    engine)
      run engine_adaptive 300 engine_bench "${flags[@]}" "${small[@]}" --batch_invariant=false \
        --json="$OUT/engine_adaptive.json"
      run engine_default 300 engine_bench "${flags[@]}" "${small[@]}" \
        --json="$OUT/engine_default.json"
      ;;
    long)
      run engine185_adaptive 300 engine_bench "${flags[@]}" "${long[@]}" \
        --batch_invariant=false --json="$OUT/engine185_adaptive.json"
      run engine185_default 300 engine_bench "${flags[@]}" "${long[@]}" \
        --json="$OUT/engine185_default.json"
      ;;
    *)
      echo "unknown step: $step" >&2
      exit 2
      ;;
  esac
done
pack
printf '%s\n' "${summary[@]}"
