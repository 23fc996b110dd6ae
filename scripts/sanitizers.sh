#!/usr/bin/env bash
# Sanitizer stage: builds and runs
#   1. the CPU tests with AddressSanitizer + UndefinedBehaviorSanitizer (clang), including the
#      libFuzzer harnesses (rel_fuzz_*, VERIFYD_FUZZ_SECONDS each, under ASan+UBSan);
#   2. the server/client/reliability tests with ThreadSanitizer (clang).
# Each in its own build directory, CPU only (-DVERIFYD_CUDA=OFF), Release-with-debug-info.
# Any sanitizer report fails the test that produced it (halt_on_error / abort), so the stage
# fails. Budget: ~25 min on a 2-core CI machine (prints the time of each phase).
#
#   scripts/sanitizers.sh [asan|tsan|all]      (default all)
# Environment: VERIFYD_SAN_DIR (build dirs: <prefix>-asan, <prefix>-tsan; default ./build-san), VERIFYD_JOBS,
#              VERIFYD_FUZZ_SECONDS (default 30), CC/CXX (default clang/clang++).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
what=${1:-all}
prefix=${VERIFYD_SAN_DIR:-$root/build-san}
jobs=${VERIFYD_JOBS:-$(nproc)}
fuzz_seconds=${VERIFYD_FUZZ_SECONDS:-30}
cc=${CC:-clang}
cxx=${CXX:-clang++}
supp=$root/tests/sanitizers
if ! command -v "$cxx" >/dev/null; then
  echo "sanitizers: $cxx not found (scripts/install-deps.sh installs clang)" >&2
  exit 1
fi

t0=$(date +%s)
phase() { echo "== sanitizers: $1 ($(( $(date +%s) - t0 )) s elapsed)"; }

configure() {  # <dir> <sanitizer flags> [extra executable link flags]
  cmake -S "$root" -B "$1" -G Ninja -DVERIFYD_CUDA=OFF -DVERIFYD_BUILD_BENCH=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
    -DCMAKE_CXX_FLAGS="$2 -fno-omit-frame-pointer" -DCMAKE_C_FLAGS="$2 -fno-omit-frame-pointer" \
    -DCMAKE_EXE_LINKER_FLAGS="$2 ${3:-}" -DVERIFYD_FUZZ_SECONDS="$fuzz_seconds" >/dev/null
}

run_asan() {
  local dir=$prefix-asan
  phase "ASan+UBSan configure + build ($dir)"
  configure "$dir" "-fsanitize=address,undefined -fno-sanitize-recover=all" || return 1
  cmake --build "$dir" -j "$jobs" || return 1
  phase "ASan+UBSan tests"
  # Operations script tests check deploy/ files, not C++ memory: they run in the main stage.
  local rc=0
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1" \
  LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp" \
    ctest --test-dir "$dir" -L cpu -E '^ops_' --output-on-failure -j "$jobs" || rc=$?
  grep -h -E '^(fuzz [a-z_]+|soak): ' "$dir"/Testing/Temporary/LastTest.log || true
  return $rc
}

run_tsan() {
  local dir=$prefix-tsan
  phase "TSan configure + build ($dir)"
  # Debian's Abseil is not TSan-instrumented: every executable links a shim that annotates
  # absl::Mutex / CondVar / Notification for TSan (see the file's header).
  # The object's name carries the source's hash: a changed shim changes the link flags, so
  # every executable is relinked.
  mkdir -p "$dir"
  local shim
  shim="$dir/absl_tsan_shim-$(sha256sum "$supp/absl_tsan_shim.cc" | cut -c1-12).o"
  [ -f "$shim" ] || "$cxx" -std=c++17 -O1 -g -fsanitize=thread -fPIC \
    -c "$supp/absl_tsan_shim.cc" -o "$shim" || return 1
  configure "$dir" "-fsanitize=thread" "$shim -ldl" || return 1
  # Only what the server-side tests need.
  local targets
  targets=$(cd "$root/tests" && ls server_*_test.cc client_*_test.cc rel_*_test.cc 2>/dev/null |
            sed 's/\.cc$//' | tr '\n' ' ')
  # shellcheck disable=SC2086
  cmake --build "$dir" -j "$jobs" --target verifyd verifyctl $targets || return 1
  phase "TSan tests"
  local regex rc=0
  regex="^($(echo $targets | tr ' ' '|'))\$"
  # A test that fails is run once more: Debian's gRPC is not TSan-instrumented, and its
  # internal hand-offs (tsan.supp) occasionally surface as reports in new places. A report
  # that goes away on the rerun stays in the log ("TSan: rerun needed" below) to be triaged.
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp" \
    ctest --test-dir "$dir" -L cpu -R "$regex" --output-on-failure -j "$jobs" \
      --repeat until-pass:2 || rc=$?
  if grep -q "WARNING: ThreadSanitizer" "$dir"/Testing/Temporary/LastTest.log; then
    echo "TSan: rerun needed: a report appeared (see $dir/Testing/Temporary/LastTest.log)"
    grep -h -A3 "WARNING: ThreadSanitizer" "$dir"/Testing/Temporary/LastTest.log | head -20
  fi
  grep -h -E '^soak: ' "$dir"/Testing/Temporary/LastTest.log || true
  return $rc
}

# Both stages run even when the first fails; the exit status is non-zero if either failed.
failed=()
case "$what" in
  asan) run_asan || failed+=(asan) ;;
  tsan) run_tsan || failed+=(tsan) ;;
  all) run_asan || failed+=(asan); run_tsan || failed+=(tsan) ;;
  *) echo "usage: $0 [asan|tsan|all]" >&2; exit 2 ;;
esac
if [ ${#failed[@]} -gt 0 ]; then
  phase "FAILED: ${failed[*]}"
  exit 1
fi
phase "done"
