"""Fixtures: live CPU verifyd processes on the embedded `tiny` preset.

The binary is $VERIFYD_BIN, else build/server/verifyd under the repository root (the
directory three levels above this file). A missing binary fails the live tests: it is
never a silent skip.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

import pytest

import verifyd

REPO_ROOT = Path(__file__).resolve().parents[3]
PROMPT = [11, 22, 33, 44, 55, 66, 77, 88]


def verifyd_binary() -> Path:
    env = os.environ.get("VERIFYD_BIN")
    path = Path(env) if env else REPO_ROOT / "build" / "server" / "verifyd"
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.fail(
            f"verifyd binary not found at {path}: build it (scripts/build.sh) or set VERIFYD_BIN",
            pytrace=False,
        )
    return path


class VerifydProcess:
    """A verifyd child process on 127.0.0.1 with a port the kernel picked."""

    def __init__(self, args: Sequence[str], workdir: Path) -> None:
        self.log_path = workdir / f"verifyd-{os.getpid()}-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "wb")
        cmd = [
            str(verifyd_binary()),
            "--backend=cpu",
            "--model=tiny",
            "--kv_slots=16384",
            "--listen=127.0.0.1:0",
            "--metrics_listen=",
            *args,
        ]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        self.port = self._wait_port(timeout=60.0)
        self.target = f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _wait_port(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(r"level=info serving .*? port=(\d+)", self.log())
            if m:
                return int(m.group(1))
            if self.proc.poll() is not None:
                raise RuntimeError(f"verifyd exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"verifyd did not start within {timeout} s:\n{self.log()}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.fixture(scope="session")
def workdir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="verifyd-pytest-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _serve(workdir: Path, args: Sequence[str]) -> Iterator[VerifydProcess]:
    p = VerifydProcess(args, workdir)
    try:
        with verifyd.Client(p.target) as c:
            c.wait_until_serving(timeout=30)
        yield p
    finally:
        code = p.stop()
        assert code == 0, f"verifyd exited with {code}:\n{p.log()}"


@pytest.fixture(scope="session")
def server(workdir: Path) -> Iterator[VerifydProcess]:
    """A plain tiny CPU server shared by the tests."""
    yield from _serve(workdir, [])


@pytest.fixture(scope="session")
def slow_server(workdir: Path) -> Iterator[VerifydProcess]:
    """Every engine step sleeps 400 ms first (test fault injection): a short call deadline
    passes while its step runs, which is the case the request_id retry recipe is for."""
    yield from _serve(workdir, ["--testing_fault=slow:400"])


@pytest.fixture
def client(server: VerifydProcess) -> Iterator[verifyd.Client]:
    with verifyd.Client(server.target, timeout=30) as c:
        yield c


_REFERENCE: Dict[tuple, List[int]] = {}


def greedy_reference(target: str, prompt: Sequence[int], n: int) -> List[int]:
    """The first n tokens of plain greedy decoding (empty trees only): next_token, then one
    bonus token per round."""
    key = (tuple(prompt), n)
    if key not in _REFERENCE:
        with verifyd.Client(target) as c:
            opened = c.open_session(prompt)
            out = [opened.next_token]
            try:
                while len(out) < n:
                    r = c.verify_one(opened.session_id)
                    assert list(r.accepted_tokens) == []
                    out.append(r.bonus_token)
            finally:
                c.close_session(opened.session_id)
        _REFERENCE[key] = out
    return list(_REFERENCE[key])


@pytest.fixture
def reference(server: VerifydProcess):
    return lambda prompt, n: greedy_reference(server.target, prompt, n)


def openssl() -> Optional[str]:
    return shutil.which("openssl")
