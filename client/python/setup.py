"""Build hook of verifyd-client: the package version.

The version has one source, the `project(verifyd VERSION x.y.z ...)` line of the verifyd
repository's top-level CMakeLists.txt. A build from the source tree reads it there and
writes it into src/verifyd/_version.py (not committed), which sdists carry; a build from an
sdist, where that CMakeLists.txt is absent, reads the carried _version.py.

The protobuf / gRPC stubs are not generated here: they are shipped in src/verifyd/_proto/,
made by scripts/regen_stubs.sh with a pinned generator.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
CMAKE_LISTS = HERE.parent.parent / "CMakeLists.txt"
VERSION_PY = HERE / "src" / "verifyd" / "_version.py"
CMAKE_VERSION = re.compile(r"^\s*project\(\s*verifyd\s+VERSION\s+([0-9]+\.[0-9]+\.[0-9]+)\b", re.M)
PY_VERSION = re.compile(r'^__version__ = "([^"]+)"$', re.M)


def read_version() -> str:
    if CMAKE_LISTS.is_file():
        m = CMAKE_VERSION.search(CMAKE_LISTS.read_text())
        if m is None:
            sys.exit(f"verifyd-client: no 'project(verifyd VERSION x.y.z' line in {CMAKE_LISTS}")
        version = m.group(1)
        text = (
            '"""The package version, written by setup.py from the project(... VERSION) line of '
            'verifyd\'s CMakeLists.txt."""\n\n'
            f'__version__ = "{version}"\n'
        )
        if not VERSION_PY.is_file() or VERSION_PY.read_text() != text:
            VERSION_PY.write_text(text)
        return version
    if VERSION_PY.is_file():
        m = PY_VERSION.search(VERSION_PY.read_text())
        if m is not None:
            return m.group(1)
    sys.exit(
        f"verifyd-client: no version: neither {CMAKE_LISTS} (a verifyd source tree) nor "
        f"{VERSION_PY} (an sdist) is there"
    )


setup(version=read_version())
