#!/usr/bin/env bash
# Runs one libFuzzer harness for a bounded time (CTest: rel_fuzz_<harness>).
#   run_fuzz.sh <fuzzer binary> <harness name> <seconds> <tests/fuzz dir> [artifact dir]
# First replays the checked-in seed corpus and regression inputs
# (tests/fuzz/{corpus,regressions}/<harness>/), then fuzzes for <seconds> starting from a
# scratch copy of the corpus (the checked-in corpus is never modified). A crash leaves its
# input in <artifact dir> (default: ./fuzz-artifacts) and fails; add it to
# tests/fuzz/regressions/<harness>/ once fixed, so rel_fuzz_replay_<harness> keeps checking it.
# Prints the executions, corpus size and peak RSS libFuzzer reports.
set -euo pipefail
fuzzer=$1 harness=$2 seconds=$3 fuzzdir=$4
artifacts=${5:-$PWD/fuzz-artifacts}
corpus=$fuzzdir/corpus/$harness
regress=$fuzzdir/regressions/$harness
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus" "$artifacts"
cp "$corpus"/* "$work/corpus/"
inputs=("$corpus")
[ -d "$regress" ] && [ -n "$(ls -A "$regress")" ] && inputs+=("$regress")

common=(-max_len=4096 -timeout=20 -rss_limit_mb=2048 -artifact_prefix="$artifacts/$harness-")
echo "== $harness: replaying ${inputs[*]}"
"$fuzzer" "${common[@]}" -runs=0 "${inputs[@]}" 2>"$work/replay.log" || {
  cat "$work/replay.log"; echo "FAILED: $harness replay"; exit 1; }
echo "== $harness: fuzzing for ${seconds}s"
if ! "$fuzzer" "${common[@]}" -max_total_time="$seconds" -print_final_stats=1 \
    "$work/corpus" 2>"$work/fuzz.log"; then
  tail -n 60 "$work/fuzz.log"
  echo "FAILED: $harness found a crash; input saved under $artifacts/ (add it to $regress/)"
  exit 1
fi
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/fuzz.log")
rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$work/fuzz.log")
cov=$(grep -E '^#[0-9]+' "$work/fuzz.log" | tail -n 1 | sed -n 's/.*cov: \([0-9]*\).*/\1/p')
echo "fuzz $harness: seconds=$seconds execs=${execs:-?} corpus=$(ls "$work/corpus" | wc -l) cov=${cov:-?} peak_rss_mb=${rss:-?}"
