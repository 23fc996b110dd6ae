"""The examples run end to end against the live server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_ngram_drafter_example(server) -> None:
    p = _run("ngram_drafter.py", "--target", server.target, "--tokens", "150")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "lossless: 150 tokens equal greedy decoding" in p.stdout
    assert "mean accepted length=" in p.stdout


def test_eagle_hidden_states_example(server) -> None:
    pytest.importorskip("numpy")
    p = _run("eagle_hidden_states.py", "--target", server.target, "--rounds", "6")
    if p.returncode == 3:
        pytest.skip(p.stdout.strip())
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("committed ") == 6
    assert "6 rounds" in p.stdout
