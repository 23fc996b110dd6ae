"""The shipped stubs (src/verifyd/_proto/) match the protos and come from the pinned generator.

A change to proto/verify/v1/verify.proto (or proto/verifyd_client/health.proto) without
running scripts/regen_stubs.sh fails here: the FileDescriptorProto embedded in the shipped
module is compared with the one protoc builds from the proto now ($PROTOC, else `protoc` on
the PATH, else grpcio-tools' protoc when installed).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
from google.protobuf import descriptor_pb2

import verifyd
from verifyd._proto import health_pb2

from conftest import REPO_ROOT

CLIENT_ROOT = Path(__file__).resolve().parents[1]
VERIFY_PROTO = (REPO_ROOT / "proto", "verify/v1/verify.proto")
HEALTH_PROTO = (CLIENT_ROOT / "proto", "verifyd_client/health.proto")
STUB_DIR = Path(verifyd.pb.__file__).resolve().parent


def protoc_command() -> List[str]:
    env = os.environ.get("PROTOC")
    if env:
        return [env]
    found = shutil.which("protoc")
    if found:
        return [found]
    if importlib.util.find_spec("grpc_tools") is not None:
        return [sys.executable, "-m", "grpc_tools.protoc"]
    pytest.fail(
        "no protoc to check the shipped stubs with: install protobuf-compiler, set PROTOC, "
        "or pip install grpcio-tools",
        pytrace=False,
    )


def without_json_names(
    fd: descriptor_pb2.FileDescriptorProto,
) -> descriptor_pb2.FileDescriptorProto:
    """protoc's descriptor sets carry each field's json_name, generated Python code does not
    (the runtime derives it): compare without them."""

    def strip(messages) -> None:
        for m in messages:
            for f in list(m.field) + list(m.extension):
                f.ClearField("json_name")
            strip(m.nested_type)

    strip(fd.message_type)
    for f in fd.extension:
        f.ClearField("json_name")
    return fd


def compiled(include: Path, proto: str, tmp: Path) -> descriptor_pb2.FileDescriptorProto:
    out = tmp / "set.pb"
    subprocess.run(
        [*protoc_command(), f"-I{include}", f"--descriptor_set_out={out}", str(include / proto)],
        check=True,
    )
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    assert [f.name for f in files] == [proto]
    return without_json_names(files[0])


def shipped(module) -> descriptor_pb2.FileDescriptorProto:
    return without_json_names(
        descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
    )


@pytest.mark.parametrize(
    "module,proto",
    [(verifyd.pb, VERIFY_PROTO), (health_pb2, HEALTH_PROTO)],
    ids=["verify", "health"],
)
def test_shipped_stubs_match_the_proto(module, proto, tmp_path: Path) -> None:
    want = compiled(*proto, tmp_path)
    assert shipped(module) == want, (
        f"{proto[1]} changed since the stubs were generated: run "
        "client/python/scripts/regen_stubs.sh and commit src/verifyd/_proto/"
    )


def test_a_proto_change_is_caught(tmp_path: Path) -> None:
    """The comparison above sees a new field (so it can fail)."""
    include, proto = VERIFY_PROTO
    copy = tmp_path / "proto"
    shutil.copytree(include, copy)
    path = copy / proto
    text = path.read_text()
    assert "message GetInfoRequest {}" in text
    path.write_text(
        text.replace("message GetInfoRequest {}", "message GetInfoRequest { int32 x = 1; }")
    )
    assert shipped(verifyd.pb) != compiled(copy, proto, tmp_path)


def test_stubs_come_from_the_pinned_generator() -> None:
    """The regeneration script's generator writes no runtime version checks (protobuf's
    ValidateProtobufRuntimeVersion, gRPC's GRPC_GENERATED_VERSION) and no arguments that
    grpcio 1.51 lacks: a stub made by a newer grpcio-tools would raise the floors the
    package's dependency ranges promise."""
    script = (CLIENT_ROOT / "scripts" / "regen_stubs.sh").read_text()
    assert "GRPCIO_TOOLS_VERSION=1.51.3" in script
    for name in ("verify_pb2.py", "verify_pb2_grpc.py", "health_pb2.py"):
        text = (STUB_DIR / name).read_text()
        for marker in (
            "ValidateProtobufRuntimeVersion",
            "GRPC_GENERATED_VERSION",
            "_registered_method",
        ):
            assert (
                marker not in text
            ), f"{name} has {marker}: regenerate with scripts/regen_stubs.sh"
    grpc_text = (STUB_DIR / "verify_pb2_grpc.py").read_text()
    assert "from . import verify_pb2 as" in grpc_text  # relative import inside verifyd._proto
