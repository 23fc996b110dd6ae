"""One version source: the `project(verifyd VERSION x.y.z ...)` line of verifyd's top-level
CMakeLists.txt. setup.py reads it (from the source tree) or the _version.py it wrote (from an
sdist); the package's __version__ and metadata carry it."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

import verifyd
from conftest import REPO_ROOT

SETUP_PY = Path(__file__).resolve().parents[1] / "setup.py"


def cmake_version() -> str:
    text = (REPO_ROOT / "CMakeLists.txt").read_text()
    m = re.search(r"project\(\s*verifyd\s+VERSION\s+([0-9.]+)", text)
    assert m, "no project(verifyd VERSION ...) in CMakeLists.txt"
    return m.group(1)


def test_installed_package_has_the_cmake_version() -> None:
    assert verifyd.__version__ == cmake_version()
    assert importlib.metadata.version("verifyd-client") == cmake_version()


def run_setup(tree: Path) -> subprocess.CompletedProcess:
    """Runs a copy of setup.py in `tree`/client/python with a stand-in setuptools whose
    setup() prints the version it is given."""
    client = tree / "client" / "python"
    (client / "src" / "verifyd").mkdir(parents=True, exist_ok=True)
    shutil.copy(SETUP_PY, client / "setup.py")
    fake = tree / "fake"
    (fake / "setuptools").mkdir(parents=True, exist_ok=True)
    (fake / "setuptools" / "__init__.py").write_text(
        "def setup(**kw):\n    print('version=' + kw['version'])\n"
    )
    return subprocess.run(
        [sys.executable, "setup.py"],
        cwd=client,
        env={"PYTHONPATH": str(fake)},
        capture_output=True,
        text=True,
    )


def test_setup_reads_cmake_and_writes_version_py(tmp_path: Path) -> None:
    (tmp_path / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.22)\nproject(verifyd VERSION 9.8.7 LANGUAGES CXX)\n"
    )
    p = run_setup(tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "version=9.8.7"
    written = (tmp_path / "client/python/src/verifyd/_version.py").read_text()
    assert '__version__ = "9.8.7"' in written


def test_an_sdist_reads_its_version_py(tmp_path: Path) -> None:
    src = tmp_path / "client/python/src/verifyd"
    src.mkdir(parents=True)
    (src / "_version.py").write_text('"""x"""\n\n__version__ = "1.2.3"\n')
    p = run_setup(tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "version=1.2.3"


def test_no_version_source_is_a_clear_error(tmp_path: Path) -> None:
    p = run_setup(tmp_path)
    assert p.returncode != 0
    assert "CMakeLists.txt" in p.stderr and "_version.py" in p.stderr
    (tmp_path / "CMakeLists.txt").write_text("project(verifyd LANGUAGES CXX)\n")
    p = run_setup(tmp_path)
    assert p.returncode != 0 and "project(verifyd VERSION x.y.z" in p.stderr


def test_license_is_apache_2() -> None:
    text = (REPO_ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    meta = importlib.metadata.metadata("verifyd-client")
    assert meta["License-Expression"] == "Apache-2.0"
