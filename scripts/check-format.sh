#!/usr/bin/env bash
# Checks that C++ / CUDA sources follow .clang-format (Google base, 100 columns).
#   scripts/check-format.sh              every tracked source file (what CI runs)
#   scripts/check-format.sh BASE         only the files changed since git revision BASE
#   scripts/check-format.sh --fix [BASE] rewrite them in place instead of checking
# Exits 1 and lists the files (with a diff excerpt) that differ from their formatted form.
set -euo pipefail
cd "$(dirname "$0")/.."
fix=0
if [[ "${1:-}" == "--fix" ]]; then fix=1; shift; fi
clang_format=${CLANG_FORMAT:-clang-format}
command -v "$clang_format" >/dev/null || { echo "check-format: $clang_format not found" >&2; exit 2; }
pattern='\.(cc|h|cu|cuh)$'
if [[ $# -ge 1 ]]; then
  mapfile -t files < <( { git diff --name-only --diff-filter=ACMR "$1" --; \
                          git ls-files --others --exclude-standard; } | grep -E "$pattern" | sort -u)
else
  mapfile -t files < <(git ls-files --cached --others --exclude-standard | grep -E "$pattern" | sort -u)
fi
bad=0
for f in "${files[@]}"; do
  [[ -f "$f" ]] || continue
  if [[ $fix -eq 1 ]]; then "$clang_format" -i "$f"; continue; fi
  if ! diff -q <("$clang_format" "$f") "$f" >/dev/null; then
    echo "check-format: $f is not formatted (scripts/check-format.sh --fix to rewrite it):"
    diff -u "$f" <("$clang_format" "$f") | sed -n '3,14p' || true
    bad=1
  fi
done
[[ $fix -eq 1 ]] && { echo "check-format: formatted ${#files[@]} files"; exit 0; }
[[ $bad -eq 0 ]] && echo "check-format: ${#files[@]} files follow .clang-format"
exit $bad
