#!/usr/bin/env bash
# Runs the CUDA kernel tests and benchmarks on a GPU machine and leaves logs/JSON in $OUT.
#   scripts/gpu-kernels-run.sh [tests] [sanitize] [bench] [flashinfer] [flashmla] [probe] [torch]
#   [tune] [profile]
#   (default: tests bench flashinfer). Logs and JSON go to a work folder, packed into
#   $OUT/results.tgz (the device tool returns at most 8 files); verifyd.json and
#   flashinfer.json / flashmla.json (the same run's peers, bench/peers/) are copied too.
# Expects the binaries on PATH (gpu_verify_attention_test, gpu_tree_accept_test,
# verify_attention_bench), e.g. from a device bundle: source .device/env.sh first.
# Env: VERIFYD_COMMIT (recorded in the JSON), FLASHINFER_PATH (a folder holding the
# flashinfer package laid out for JIT use, put on PYTHONPATH; see docs/PERF.md), FLASHMLA_PATH
# (the output folder of bench/peers/build_flashmla.sh).
# Prints a short summary last. Never changes clocks, power or MIG settings.
set -uo pipefail
OUT=${OUT:-/tmp/verifyd-gpu-out}
mkdir -p "$OUT"
FINAL_OUT=$OUT
OUT=$(mktemp -d /tmp/verifyd-gpu.XXXXXX)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests bench flashinfer)
commit=${VERIFYD_COMMIT:-unknown}
# The tests' C++ reference (long contexts) on every core of the GPU host (results unchanged).
export VERIFYD_REF_THREADS=${VERIFYD_REF_THREADS:-$(nproc)}
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
rc=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
for step in "${steps[@]}"; do
  case $step in
    tests)
      gpu_tree_accept_test 2>&1 | tee "$OUT/tests.log" | tail -3 || rc=1
      gpu_verify_attention_test 2>&1 | tee -a "$OUT/tests.log" | grep -E "^\[ *(OK|FAILED|PASSED|SKIPPED) |rel_l2|Failure|Expected|Which|actual" | tail -120 || true
      grep -q "FAILED" "$OUT/tests.log" && rc=1
      ;;
    sanitize)
      timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 gpu_verify_attention_test \
        --gtest_filter="${SANITIZE_FILTER:-*RowsThatSeeNothing*:*HeadsAndNodesGrid*}" > "$OUT/sanitize.log" 2>&1
      echo "compute-sanitizer memcheck rc=$?"; tail -5 "$OUT/sanitize.log"
      ;;
    bench)
      for cfg in ${BENCH_CONFIGS:-auto}; do
        verify_attention_bench --config=$cfg --commit="$commit" --json "$OUT/bench_$cfg.json" \
          > "$OUT/bench_$cfg.log" 2>&1 || rc=1
      done
      ;;
    flashinfer)
      # Same shapes, inputs and timing method as verify_attention_bench, in the same run.
      PYTHONPATH="${FLASHINFER_PATH:-}${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 \
        FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a} \
        timeout "${FLASHINFER_TIMEOUT:-420}" python3 "$here/bench/peers/flashinfer_mla.py" \
        --commit="$commit" --nvidia-driver="$driver" --json "$OUT/flashinfer.json" \
        > "$OUT/flashinfer.log" 2>&1 || rc=1
      ;;
    flashmla)
      # FlashMLA's dense decode, same shapes, inputs and timing; FLASHMLA_PATH: the folder
      # bench/peers/build_flashmla.sh made (holding flash_mla/).
      PYTHONPATH="${FLASHMLA_PATH:?FLASHMLA_PATH: the build_flashmla.sh output}${PYTHONPATH:+:$PYTHONPATH}" \
        PYTHONUNBUFFERED=1 timeout "${FLASHMLA_TIMEOUT:-300}" python3 "$here/bench/peers/flashmla_mla.py" \
        --commit="$commit" --nvidia-driver="$driver" --json "$OUT/flashmla.json" \
        > "$OUT/flashmla.log" 2>&1 || rc=1
      ;;
    probe)
      # e4m3 wgmma precision and rate, and the FP8 -> f16 conversion rate (bench/fp8_wgmma_probe).
      fp8_wgmma_probe --json "$OUT/fp8_wgmma_probe.json" > "$OUT/fp8_wgmma_probe.log" 2>&1 || rc=1
      cat "$OUT/fp8_wgmma_probe.log"
      ;;
    tune)
      # Planner / configuration sweep: one bench run per (config, split overhead), then a
      # compact matrix of median times per shape.
      for spec in ${TUNE_SPEC:-auto:256 m16:256 s64:256}; do
        cfg=${spec%%:*}; ov=${spec##*:}
        verify_attention_bench --config=$cfg --split_overhead=$ov --iters=30 \
          --json "$OUT/tune_${cfg}_ov${ov}.json" > "$OUT/tune_${cfg}_ov${ov}.log" 2>&1 || rc=1
      done
      python3 - "$OUT" <<'PY'
import glob, json, os, sys
runs = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "tune_*.json"))):
    runs[os.path.basename(f)[5:-5]] = {
        (r["B"], r["H"], r["q"], r["ctx"]): r for r in json.load(open(f))["results"]}
names = list(runs)
print("| B/H/q/ctx | " + " | ".join(names) + " |")
for shape in next(iter(runs.values())):
    row = [f"{runs[n][shape]['ms']:.4f}" for n in names]
    print("| " + "/".join(map(str, shape)) + " | " + " | ".join(row) + " |")
PY
      ;;
    profile)
      for shape in ${PROFILE_SHAPES:-B1_H8_q1_ctx185000 B8_H16_q16_ctx16384}; do
        timeout 200 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
          --section WarpStateStats \
          --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
          -k regex:VerifyAttention --launch-skip 12 \
          --launch-count 1 verify_attention_bench --only=$shape --iters=3 --warmup=12 --gather_ceiling=false \
          --json=/dev/null > "$OUT/ncu_$shape.log" 2>&1
        echo "ncu $shape rc=$?"
      done
      ;;
    torch)
      PYTHONUNBUFFERED=1 python3 "$here/bench/torch_verify_attention.py" --json "$OUT/torch.json" \
        > "$OUT/torch.log" 2>&1 || rc=1
      ;;
  esac
done
for f in "$OUT"/bench_*.log "$OUT/flashinfer.log" "$OUT/flashmla.log" "$OUT/torch.log"; do
  [ -f "$f" ] && { echo "== $(basename "$f")"; grep -E "^\||^ *[0-9]|device|sanity|rror" "$f" | tail -40; }
done
if [ -f "$OUT/bench_auto.json" ]; then  # verifyd and its same-run peer side by side
  echo "== same run"
  python3 "$here/bench/perf_report.py" --print-run "$OUT/bench_auto.json" \
    $([ -f "$OUT/flashinfer.json" ] && echo "$OUT/flashinfer.json") \
    $([ -f "$OUT/flashmla.json" ] && echo "$OUT/flashmla.json") || rc=1
fi
tar czf "$FINAL_OUT/results.tgz" -C "$OUT" .
[ -f "$OUT/bench_auto.json" ] && cp "$OUT/bench_auto.json" "$FINAL_OUT/verifyd.json"
[ -f "$OUT/flashinfer.json" ] && cp "$OUT/flashinfer.json" "$FINAL_OUT/flashinfer.json"
[ -f "$OUT/flashmla.json" ] && cp "$OUT/flashmla.json" "$FINAL_OUT/flashmla.json"
cp "$OUT/gpu.txt" "$FINAL_OUT/nvidia-smi.csv"
exit $rc
