"""Build hook of verifyd-client: generates the Python stubs of verify.proto at build time.

The proto lives at the repository root (proto/verify/v1/verify.proto), outside this package.
A build from the source tree reads it there; `python -m build --sdist` copies it into the
sdist (proto/verify/v1/verify.proto next to this file), so a build from the sdist reads that
copy. The stubs are never committed: every build generates them with the grpcio-tools of the
build environment, and the package's grpcio / protobuf lower bounds are read from the
generated code (a runtime older than the generator refuses to import it).
"""

from __future__ import annotations

import atexit
import functools
import re
import shutil
import sys
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
PROTO = Path("verify", "v1", "verify.proto")
# Where the proto is looked for: the copy inside an sdist first, then the repository root.
PROTO_ROOTS = (HERE / "proto", HERE.parent.parent / "proto")
# The generated modules' package, relative to the build or source root.
STUB_PACKAGE = Path("verifyd", "_proto")
STUB_FILES = ("verify_pb2.py", "verify_pb2.pyi", "verify_pb2_grpc.py")


def proto_root() -> Path:
    for root in PROTO_ROOTS:
        if (root / PROTO).is_file():
            return root
    sys.exit(
        "verifyd-client: cannot find verify/v1/verify.proto (looked in "
        + ", ".join(str(r) for r in PROTO_ROOTS)
        + "); build from the verifyd source tree or from its sdist"
    )


@functools.lru_cache(maxsize=None)
def generated() -> tuple[Path, str, str]:
    """Runs protoc once per build process: (directory of STUB_FILES, grpc, protobuf versions)."""
    import grpc_tools
    from grpc_tools import protoc

    root = proto_root()
    out = Path(tempfile.mkdtemp(prefix="verifyd-stubs-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    well_known = Path(grpc_tools.__file__).resolve().parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{root}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        str(root / PROTO),
    ]
    if protoc.main(args) != 0:
        sys.exit(f"verifyd-client: protoc failed on {root / PROTO}")
    gen = out / PROTO.parent
    # The gRPC module imports its messages as the top-level package `verify.v1`; inside
    # verifyd they live in verifyd._proto, so import them relatively.
    grpc_py = gen / "verify_pb2_grpc.py"
    text = grpc_py.read_text()
    text, n = re.subn(
        r"^from verify\.v1 import verify_pb2 as", "from . import verify_pb2 as", text, flags=re.M
    )
    if n != 1:
        sys.exit("verifyd-client: unexpected import line in the generated verify_pb2_grpc.py")
    grpc_py.write_text(text)

    grpc_version = "1.56.0"  # generators before 1.63 write no version check
    m = re.search(r"GRPC_GENERATED_VERSION = '([0-9.]+)'", text)
    if m:
        grpc_version = m.group(1)
    protobuf_version = "4.21.0"  # generators before protobuf 5.26 write no version check
    m = re.search(
        r"ValidateProtobufRuntimeVersion\(\s*[\w.]+,\s*(\d+),\s*(\d+),\s*(\d+),",
        (gen / "verify_pb2.py").read_text(),
    )
    if m:
        protobuf_version = ".".join(m.groups())
    return gen, grpc_version, protobuf_version


def copy_stubs(dest_root: Path) -> None:
    gen = generated()[0]
    dest = dest_root / STUB_PACKAGE
    dest.mkdir(parents=True, exist_ok=True)
    for name in STUB_FILES:
        shutil.copyfile(gen / name, dest / name)


class BuildPyWithStubs(build_py):
    """build_py that also writes the generated stubs (into the source tree when editable)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            copy_stubs(HERE / "src")
        else:
            copy_stubs(Path(self.build_lib))


class SdistWithProto(sdist):
    """sdist that carries verify.proto, so the sdist builds without the repository."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        dest = Path(base_dir, "proto", PROTO)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(proto_root() / PROTO, dest)


_, GRPC_VERSION, PROTOBUF_VERSION = generated()

setup(
    install_requires=[f"grpcio>={GRPC_VERSION}", f"protobuf>={PROTOBUF_VERSION}"],
    cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProto},
)
