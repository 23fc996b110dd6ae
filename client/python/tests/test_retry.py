"""Exactly-once retries: a Verify that carries a request_id is resent after a lost answer
or a passed deadline and the server applies it once; calls without one are not resent."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, List

import grpc
import grpc.aio
import pytest

import verifyd
from conftest import PROMPT

FAST = verifyd.RetryPolicy(max_attempts=4, initial_backoff_s=0.01, max_backoff_s=0.05)
# Enough attempts to outlast a slow engine step.
SLOW_STEP_RETRY = verifyd.RetryPolicy(max_attempts=20, initial_backoff_s=0.05, max_backoff_s=0.1)


def _answers(value: Any) -> Callable[..., Any]:
    """A method that takes any arguments and returns `value`."""
    return lambda self, *args, **kwargs: value


class LostAnswer(grpc.RpcError, grpc.Call, grpc.Future):
    """What the client sees when the call reached the server but its answer did not (an
    RpcError that is also a finished call, like gRPC's own)."""

    def __init__(self, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        super().__init__()
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "injected: answer lost after the server ran the call"

    # Finished, with nothing more to tell: no metadata, no time left, nothing to cancel.
    initial_metadata = trailing_metadata = _answers(())
    time_remaining = traceback = _answers(None)
    is_active = cancel = add_callback = cancelled = running = _answers(False)
    done = _answers(True)

    def result(self, timeout: Any = None) -> Any:
        raise self

    def exception(self, timeout: Any = None) -> Any:
        return self

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        fn(self)


class DropAnswers(grpc.UnaryUnaryClientInterceptor):
    """Sends each call for real, then replaces the answers of the first `drops` calls to
    `method` with an error (the server did the work; the client never hears of it)."""

    def __init__(self, method: str, drops: int, code=grpc.StatusCode.UNAVAILABLE) -> None:
        self.method, self.drops, self.code = method, drops, code
        self.calls = 0

    def intercept_unary_unary(self, continuation, details, request):
        call = continuation(details, request)
        if details.method.endswith("/" + self.method):
            self.calls += 1
            call.result()  # the server answered
            if self.calls <= self.drops:
                raise LostAnswer(self.code)
        return call


@pytest.mark.parametrize(
    "code",
    [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED],
)
def test_lost_answers_are_retried_and_applied_once(server, reference, code) -> None:
    ref = reference(PROMPT, 20)
    drop = DropAnswers("Verify", drops=2, code=code)
    events: List[verifyd.RetryEvent] = []
    with verifyd.Client(
        server.target, retry=FAST, interceptors=[drop], on_retry=events.append
    ) as c:
        with c.session(PROMPT) as s:
            # the right next 3 tokens: all accepted, so applying twice would skip tokens
            r = s.verify((ref[1:4], None))
            assert drop.calls == 3 and [e.code for e in events] == [code, code]
            assert list(r.accepted_tokens) == ref[1:4] and r.bonus_token == ref[4]
            assert s.committed_len == len(PROMPT) + 4
            # every Session.verify sends expected_committed_len: ABORTED had it run twice
            for _ in range(3):
                s.verify()
            assert s.history[len(PROMPT) :] == ref[:8]


def test_without_request_id_a_lost_answer_is_not_retried(server) -> None:
    drop = DropAnswers("Verify", drops=1)
    with verifyd.Client(server.target, retry=FAST, interceptors=[drop]) as c:
        with c.session(PROMPT) as s:
            with pytest.raises(verifyd.Unavailable) as e:
                c.verify_one(s.session_id)  # no request_id
            assert drop.calls == 1 and e.value.attempts == 1
            # ...and the server did apply it (why a retry needs a request_id): the session's
            # next verify expects the old length and is refused
            with pytest.raises(verifyd.Aborted):
                s.verify()
            s.resync()
            s.verify()


def test_a_failed_session_verify_can_be_resynced(server, reference) -> None:
    ref = reference(PROMPT, 10)
    drop = DropAnswers("Verify", drops=10)
    with verifyd.Client(server.target, retry=FAST, interceptors=[drop]) as c:
        with c.session(PROMPT) as s:
            with pytest.raises(verifyd.Unavailable) as e:
                s.verify((ref[1:3], None))
            assert e.value.attempts == FAST.max_attempts
            s.resync()  # the server applied it; roll it back to what the client knows
            drop.drops = 0
            s.verify()
            assert s.history[len(PROMPT) :] == ref[:2]


def test_open_and_fork_are_never_retried(server) -> None:
    drop = DropAnswers("OpenSession", drops=1)
    with verifyd.Client(server.target, retry=FAST, interceptors=[drop]) as c:
        with pytest.raises(verifyd.Unavailable) as e:
            c.open_session(PROMPT)
        assert drop.calls == 1 and e.value.attempts == 1
    drop = DropAnswers("ForkSession", drops=1)
    with verifyd.Client(server.target, retry=FAST, interceptors=[drop]) as c:
        with c.session(PROMPT) as s:
            with pytest.raises(verifyd.Unavailable):
                s.fork()
            assert drop.calls == 1


def test_close_and_truncate_are_retried(server, reference) -> None:
    ref = reference(PROMPT, 6)
    drop_close = DropAnswers("CloseSession", drops=1)
    drop_trunc = DropAnswers("TruncateSession", drops=1)
    with verifyd.Client(server.target, retry=FAST, interceptors=[drop_close, drop_trunc]) as c:
        s = c.session(PROMPT)
        for _ in range(4):
            s.verify()
        r = s.truncate(len(PROMPT) + 1)
        assert drop_trunc.calls == 2 and r.next_token == ref[1]
        # the first close ran; its retry finds the session gone and counts as closed
        c.close_session(s.session_id)
        assert drop_close.calls == 2
        with pytest.raises(verifyd.NotFound):
            c.verify_one(s.session_id)


def test_deadline_passing_mid_step_is_retried_exactly_once(slow_server, reference) -> None:
    """Each engine step sleeps 400 ms: a 150 ms deadline passes while the step runs, the
    step is still applied, and the retries (same request_id) get its stored result."""
    ref = reference(PROMPT, 10)
    events: List[verifyd.RetryEvent] = []
    with verifyd.Client(slow_server.target, timeout=30) as patient:
        s = patient.session(PROMPT)
        with verifyd.Client(
            slow_server.target, timeout=0.15, retry=SLOW_STEP_RETRY, on_retry=events.append
        ) as hasty:
            s.client = hasty
            r = s.verify((ref[1:3], None))
            assert events and events[0].code == grpc.StatusCode.DEADLINE_EXCEEDED
            assert list(r.accepted_tokens) == ref[1:3] and r.bonus_token == ref[3]
            s.client = patient
            s.verify()  # expected_committed_len: ABORTED had the first call run twice
            assert s.history[len(PROMPT) :] == ref[:5]
            # without a request_id the same deadline is an error, not a retry
            with pytest.raises(verifyd.DeadlineExceeded) as e:
                hasty.verify_one(s.session_id)
            assert e.value.attempts == 1
        patient.close_session(s.session_id)


class AioDropAnswers(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, method: str, drops: int) -> None:
        self.method, self.drops, self.calls = method, drops, 0

    async def intercept_unary_unary(self, continuation, details, request):
        call = await continuation(details, request)
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        if method.endswith("/" + self.method):
            self.calls += 1
            await call  # the server answered
            if self.calls <= self.drops:
                raise grpc.aio.AioRpcError(
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.aio.Metadata(),
                    grpc.aio.Metadata(),
                    details="injected: answer lost",
                )
        return call


def test_asyncio_retry_is_exactly_once(server, reference) -> None:
    ref = reference(PROMPT, 10)

    async def main() -> None:
        drop = AioDropAnswers("Verify", drops=2)
        async with verifyd.AsyncClient(server.target, retry=FAST, interceptors=[drop]) as c:
            s = await c.session(PROMPT)
            r = await s.verify((ref[1:4], None))
            assert drop.calls == 3
            assert list(r.accepted_tokens) == ref[1:4] and r.bonus_token == ref[4]
            await c.verify_one(s.session_id, expected_committed_len=len(PROMPT) + 4)
            await s.close()
        drop = AioDropAnswers("OpenSession", drops=1)
        async with verifyd.AsyncClient(server.target, retry=FAST, interceptors=[drop]) as c:
            with pytest.raises(verifyd.Unavailable) as e:
                await c.open_session(PROMPT)
            assert drop.calls == 1 and e.value.attempts == 1

    asyncio.run(main())


def test_stream_deadline_mid_step_is_retried_on_a_new_stream(slow_server, reference) -> None:
    ref = reference(PROMPT, 10)
    events: List[verifyd.RetryEvent] = []
    with verifyd.Client(slow_server.target, retry=SLOW_STEP_RETRY, on_retry=events.append) as c:
        s = c.session(PROMPT)
        with c.verify_stream(timeout=0.15) as stream:
            (r,) = stream.verify_sessions([s], [(ref[1:3], None)])
            assert stream.streams_opened >= 2
        assert events and all(e.method == "VerifyStream" for e in events)
        assert list(r.accepted_tokens) == ref[1:3] and r.bonus_token == ref[3]
    with verifyd.Client(slow_server.target, timeout=30) as c2:
        s.client = c2
        s.verify()  # expected_committed_len: ABORTED had the first message run twice
        assert s.history[len(PROMPT) :] == ref[:5]
        s.close()


def test_asyncio_stream_deadline_mid_step_is_retried(slow_server, reference) -> None:
    ref = reference(PROMPT, 10)

    async def main() -> None:
        async with verifyd.AsyncClient(slow_server.target, retry=SLOW_STEP_RETRY) as c:
            s = await c.session(PROMPT)
            async with c.verify_stream(timeout=0.15) as stream:
                (r,) = await stream.verify_sessions([s], [(ref[1:3], None)])
                assert stream.streams_opened >= 2
            assert list(r.accepted_tokens) == ref[1:3] and r.bonus_token == ref[3]
        async with verifyd.AsyncClient(slow_server.target, timeout=30) as c2:
            s.client = c2
            await s.verify()
            assert s.history[len(PROMPT) :] == ref[:5]
            await s.close()

    asyncio.run(main())
