"""The examples run end to end against the live server."""

from __future__ import annotations

import re
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
    # vLLM's mean acceptance length, over drafts (rounds with a non-empty tree) only
    m = re.search(
        r"mean acceptance length=([0-9.]+) \(1 \+ (\d+) accepted draft tokens / (\d+) drafts\), "
        r"draft acceptance rate=[0-9.]+ \((\d+)/(\d+) draft tokens\), steps=(\d+)",
        p.stdout,
    )
    assert m, p.stdout
    mal, accepted, drafts, _, draft_tokens, steps = float(m[1]), *map(int, m.groups()[1:])
    assert 0 < drafts < steps  # the first rounds find no n-gram: plain steps, not drafts
    assert mal == round(1 + accepted / drafts, 2)
    server = re.search(
        r"server stats: rounds=(\d+) draft_tokens=(\d+) accepted_tokens=(\d+)", p.stdout
    )
    assert server and tuple(map(int, server.groups())) == (steps, draft_tokens, accepted)


def test_eagle_hidden_states_example(server) -> None:
    pytest.importorskip("numpy")
    p = _run("eagle_hidden_states.py", "--target", server.target, "--rounds", "6")
    if p.returncode == 3:
        pytest.skip(p.stdout.strip())
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("committed ") == 6
    assert "6 rounds (stand-in drafter): mean acceptance length=" in p.stdout
