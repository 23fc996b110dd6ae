#!/usr/bin/env bash
# Fetches the CUTLASS C++ headers (the MoE layer's grouped expert GEMMs on Hopper) from the
# nvidia-cutlass wheel on PyPI into .deps/cutlass/include (git-ignored). Pinned version and
# SHA-256; idempotent. Only the headers are used: nothing of the wheel's Python is installed.
# CMake picks them up from there (or from -DVERIFYD_CUTLASS_INCLUDE=DIR); without them the
# build falls back to per-expert cuBLAS GEMMs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=4.2.0.0
sha256=f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6
dest=$root/.deps/cutlass
if [ -f "$dest/VERSION" ] && [ "$(cat "$dest/VERSION")" = "$version" ]; then
  echo "fetch-cutlass: CUTLASS $version headers present"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "nvidia-cutlass==$version"
wheel=$(ls "$tmp"/nvidia_cutlass-"$version"-*.whl)
echo "$sha256  $wheel" | sha256sum -c --quiet
rm -rf "$dest"
mkdir -p "$dest"
python3 - "$wheel" "$dest" <<'PY'
import sys, zipfile, os
wheel, dest = sys.argv[1], sys.argv[2]
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            out = os.path.join(dest, "include", name[len(prefix):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(name) as src, open(out, "wb") as dst:
                dst.write(src.read())
PY
echo "$version" >"$dest/VERSION"
echo "fetch-cutlass: CUTLASS $version headers in $dest/include"
