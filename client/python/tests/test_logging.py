"""The client logs to the "verifyd" logger (never prints): retries at WARNING, calls that
fail after retries at ERROR, a single failure at WARNING for a server or connection fault
and at DEBUG for the request's own outcome, VerifyStream reconnects at INFO."""

from __future__ import annotations

import asyncio
import logging
import re
from typing import List

import grpc
import pytest

import verifyd
from conftest import PROMPT
from verifyd._base import Call
from test_retry import LostAnswer

FAST = verifyd.RetryPolicy(max_attempts=3, initial_backoff_s=0.001, max_backoff_s=0.001)
WHY = LostAnswer().details()


def failing(codes: List[grpc.StatusCode]):
    """A stub method that raises each of `codes` in turn, then answers."""
    calls = iter(codes)

    def fn(request, **kwargs):
        code = next(calls, None)
        if code is not None:
            raise LostAnswer(code)
        return "answer"

    return fn


def records(caplog) -> List[tuple]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "verifyd"]


@pytest.fixture
def offline_client():
    # Never connects: the calls go to the fake stub methods above.
    with verifyd.Client("127.0.0.1:1", retry=FAST) as c:
        yield c


def test_retries_are_warnings_and_giving_up_is_an_error(offline_client, caplog, capsys) -> None:
    caplog.set_level(logging.DEBUG, logger="verifyd")
    unavailable = grpc.StatusCode.UNAVAILABLE
    fn = failing([unavailable])
    assert offline_client._invoke(Call("GetInfo", fn, None, timeout=1, retry=FAST)) == "answer"
    ((level, msg),) = records(caplog)
    assert level == logging.WARNING
    assert re.fullmatch(
        rf"GetInfo failed with UNAVAILABLE \({WHY}\) on attempt 1 of 3; retrying in 0\.00[01] s",
        msg,
    )
    caplog.clear()

    with pytest.raises(verifyd.Unavailable):
        offline_client._invoke(
            Call("GetInfo", failing([unavailable] * 3), None, timeout=1, retry=FAST)
        )
    got = records(caplog)
    assert [lv for lv, _ in got] == [logging.WARNING, logging.WARNING, logging.ERROR]
    assert got[-1][1] == f"GetInfo failed with UNAVAILABLE ({WHY}) after 3 attempt(s)"
    assert capsys.readouterr() == ("", "")


def test_single_failures_by_code(offline_client, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="verifyd")
    with pytest.raises(verifyd.NotFound):
        offline_client._invoke(
            Call("Verify", failing([grpc.StatusCode.NOT_FOUND]), None, timeout=1, retry=FAST)
        )
    with pytest.raises(verifyd.Unavailable):
        offline_client._invoke(
            Call(
                "OpenSession",
                failing([grpc.StatusCode.UNAVAILABLE]),
                None,
                timeout=1,
                retry=verifyd.NO_RETRY,
            )
        )
    assert records(caplog) == [
        (logging.DEBUG, f"Verify failed with NOT_FOUND ({WHY}) after 1 attempt(s)"),
        (logging.WARNING, f"OpenSession failed with UNAVAILABLE ({WHY}) after 1 attempt(s)"),
    ]


def test_asyncio_client_logs_the_same(caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="verifyd")

    async def main() -> None:
        async with verifyd.AsyncClient("127.0.0.1:1", retry=FAST) as c:
            sync_fn = failing([grpc.StatusCode.UNAVAILABLE] * 3)

            async def fn(request, **kwargs):
                return sync_fn(request, **kwargs)

            with pytest.raises(verifyd.Unavailable):
                await c._invoke(Call("GetInfo", fn, None, timeout=1, retry=FAST))

    asyncio.run(main())
    assert [lv for lv, _ in records(caplog)] == [logging.WARNING, logging.WARNING, logging.ERROR]


def test_stream_reconnects_are_info(client: verifyd.Client, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="verifyd")
    with client.session(PROMPT) as s, client.verify_stream() as stream:
        with pytest.raises(verifyd.NotFound):
            stream.verify([verifyd.item("no-such-session")])
        stream.verify_sessions([s], [None])
    failed, reconnect = records(caplog)
    assert failed[0] == logging.DEBUG
    assert failed[1].startswith("VerifyStream failed with NOT_FOUND (")
    assert reconnect == (logging.INFO, f"VerifyStream: reconnecting to {client.target} (stream 2)")
