#!/usr/bin/env bash
# Regenerates the Python stubs shipped in client/python/src/verifyd/_proto/ with the pinned
# generator below: verify_pb2*.py(i) from the repository's proto/verify/v1/verify.proto and
# health_pb2.py(i) from client/python/proto/verifyd_client/health.proto. Run it after every
# change to either and commit the result (tests/test_stubs.py fails until the shipped stubs
# match the protos).
#
# The generator is pinned, not taken from the environment: the code protoc writes decides which
# runtimes can import it. grpcio-tools 1.51.3 (protoc 3.21.6) writes code that calls no runtime
# version check, so the stubs import with protobuf 4.21 and every later major the package
# allows, and a gRPC module without a GRPC_GENERATED_VERSION check or `_registered_method`
# arguments, so grpcio 1.51 and later run it. Newer generators raise those floors.
#
# Needs network access to PyPI and a Python that grpcio-tools 1.51.3 has wheels for (3.7 to
# 3.11): set PYTHON=python3.11 when the default python3 is newer.
set -euo pipefail
GRPCIO_TOOLS_VERSION=1.51.3
here=$(cd "$(dirname "$0")/.." && pwd)
root=$(cd "$here/../.." && pwd)
out="$here/src/verifyd/_proto"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"${PYTHON:-python3}" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check \
  "grpcio-tools==$GRPCIO_TOOLS_VERSION"
"$tmp/venv/bin/python" -m grpc_tools.protoc -I"$root/proto" --python_out="$tmp" \
  --pyi_out="$tmp" --grpc_python_out="$tmp" "$root/proto/verify/v1/verify.proto"
"$tmp/venv/bin/python" -m grpc_tools.protoc -I"$here/proto" --python_out="$tmp" \
  --pyi_out="$tmp" "$here/proto/verifyd_client/health.proto"

# The gRPC module imports its messages as the top-level package `verify.v1`; inside the
# package they live in verifyd._proto, so it imports them relatively.
grpc_py="$tmp/verify/v1/verify_pb2_grpc.py"
if ! grep -q '^from verify\.v1 import verify_pb2 as' "$grpc_py"; then
  echo "regen_stubs.sh: unexpected import line in the generated verify_pb2_grpc.py" >&2
  exit 1
fi
sed -i 's/^from verify\.v1 import verify_pb2 as/from . import verify_pb2 as/' "$grpc_py"
for f in verify_pb2.py verify_pb2.pyi verify_pb2_grpc.py; do
  cp "$tmp/verify/v1/$f" "$out/$f"
done
for f in health_pb2.py health_pb2.pyi; do
  cp "$tmp/verifyd_client/$f" "$out/$f"
done
echo "regenerated $out (grpcio-tools $GRPCIO_TOOLS_VERSION)"
