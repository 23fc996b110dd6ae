# shellcheck shell=bash
# Helpers for the operations test scripts (sourced). A test that cannot run because a tool is
# missing exits 77, which tests/ops.cmake registers as SKIP_RETURN_CODE: CTest then reports it
# as skipped, never as passed.
set -euo pipefail
# shellcheck disable=SC2034  # used by the scripts that source this file
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

# need TOOL PACKAGE: skip (exit 77) with a message naming the Debian package when TOOL is absent.
need() {
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "SKIP: '$1' not found (Debian package '$2'; scripts/install-deps.sh installs it)"
    exit 77
  fi
}

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
