"""The transport-free half of the sync (:mod:`verifyd.client`) and asyncio (:mod:`verifyd.aio`)
clients, written once: the constructor, each RPC's request and retry policy, what a response
becomes, the retry decisions of unary calls and of VerifyStream, the health wait's deadline,
and the session bookkeeping. The two modules keep only the transport: a blocking call and
``time.sleep`` in the one, an ``await`` and ``asyncio.sleep`` in the other.

Thread-safety: as the classes built on these (see :mod:`verifyd.client`).
"""

from __future__ import annotations

import random
import time
from typing import (
    Any,
    Callable,
    Dict,
    Generic,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
)

import grpc

from . import _common as c
from ._common import Metadata, OnRetry, PemSource, RetryEvent, RetryPolicy, TreeLike
from ._proto import verify_pb2 as pb
from ._proto import verify_pb2_grpc as pb_grpc
from .errors import Unavailable, from_rpc_error

ChannelT = TypeVar("ChannelT")
ClientT = TypeVar("ClientT")


def _same(response: Any) -> Any:
    return response


def _results(response: pb.VerifyResponse) -> List[pb.VerifyResult]:
    return list(response.results)


class Call(NamedTuple):
    """One unary RPC as a client method makes it, what the client's ``_invoke`` takes: the
    stub method ``fn`` (it blocks or returns an awaitable), its request, the deadline of each
    attempt and the retry policy, the answer of a retry that finds the session gone (None:
    that is an error like any other), and what the response becomes."""

    name: str
    fn: Callable[..., Any]
    request: Any
    timeout: Optional[float]
    retry: RetryPolicy
    on_retry_not_found: Optional[Callable[[], Any]] = None
    result: Callable[[Any], Any] = _same


class ClientBase(Generic[ChannelT]):
    """What :class:`verifyd.Client` and :class:`verifyd.AsyncClient` share (their class
    docstrings say what the arguments mean). A subclass provides ``_channel``, which makes
    (or wraps) the channel, and the calls: ``_invoke``, ``_call`` and the public methods."""

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        tls: Optional[bool] = None,
        root_certificates: Optional[PemSource] = None,
        client_certificate: Optional[PemSource] = None,
        client_key: Optional[PemSource] = None,
        token: Optional[str] = None,
        server_name_override: Optional[str] = None,
        timeout: Optional[float] = 60.0,
        retry: Optional[RetryPolicy] = None,
        metadata: Metadata = (),
        max_message_bytes: int = c.DEFAULT_MAX_MESSAGE_BYTES,
        channel_options: Sequence[Tuple[str, Any]] = (),
        interceptors: Sequence[Any] = (),
        channel: Optional[ChannelT] = None,
        on_retry: Optional[OnRetry] = None,
        wait_for_ready: bool = False,
    ) -> None:
        self.target = target
        self.timeout = timeout
        self.retry = retry if retry is not None else RetryPolicy()
        self.metadata = list(metadata)
        self.on_retry = on_retry
        self.wait_for_ready = wait_for_ready
        self._rng = random.Random()
        self._owns_channel = channel is None
        cfg = c.ChannelConfig(
            target=target,
            tls=tls,
            root_certificates=root_certificates,
            client_certificate=client_certificate,
            client_key=client_key,
            token=token,
            server_name_override=server_name_override,
            max_message_bytes=max_message_bytes,
            options=channel_options,
        )
        self.channel: ChannelT = self._channel(channel, cfg, interceptors)
        self._stub = pb_grpc.VerifyServiceStub(self.channel)
        self._health = c.health_check(self.channel)

    def _channel(
        self, given: Optional[ChannelT], cfg: c.ChannelConfig, interceptors: Sequence[Any]
    ) -> ChannelT:
        """The channel the calls use: ``given``, or a new one made from ``cfg`` (whose
        credentials are checked only then), with the interceptors."""
        raise NotImplementedError

    # -- retries -----------------------------------------------------------------------------

    def _retry_for(self, safe: bool, retry: Optional[RetryPolicy]) -> RetryPolicy:
        if not safe:
            return c.NO_RETRY
        return self.retry if retry is None else retry

    def _attempts(self, call: Call) -> "CallAttempts":
        done_when_gone = call.on_retry_not_found is not None
        return CallAttempts(self, call.name, call.timeout, call.retry, done_when_gone)

    def _retrying(
        self,
        name: str,
        attempt: int,
        code: grpc.StatusCode,
        details: str,
        delay: float,
        max_attempts: int,
    ) -> None:
        """Logs a retry and calls the on_retry hook, before the pause."""
        event = RetryEvent(name, attempt, code, details, delay)
        c.log_retry(event, max_attempts)
        if self.on_retry is not None:
            self.on_retry(event)

    # -- each RPC: its name, request, retry policy and result --------------------------------

    def _get_info_call(self, timeout: Optional[float], retry: Optional[RetryPolicy]) -> Call:
        return Call(
            "GetInfo",
            self._stub.GetInfo,
            pb.GetInfoRequest(),
            timeout,
            self._retry_for(True, retry),
        )

    def _health_call(self, service: str, timeout: Optional[float]) -> Call:
        return Call("Health.Check", self._health, service, timeout, c.NO_RETRY)

    def _open_session_call(
        self,
        prompt_tokens: Sequence[int],
        prefix_session_id: Optional[str],
        sampling: Any,
        top_logprobs: Optional[int],
        hidden_states: Any,
        timeout: Optional[float],
        fields: Mapping[str, Any],
    ) -> Call:
        req = c.open_request(
            prompt_tokens, prefix_session_id, sampling, top_logprobs, hidden_states, fields
        )
        return Call("OpenSession", self._stub.OpenSession, req, timeout, c.NO_RETRY)

    def _verify_call(
        self, items: Any, timeout: Optional[float], retry: Optional[RetryPolicy]
    ) -> Call:
        req = as_verify_request(items)
        policy = self._retry_for(c.retry_safe(req), retry)
        return Call("Verify", self._stub.Verify, req, timeout, policy, result=_results)

    def _close_session_call(
        self, session_id: str, timeout: Optional[float], retry: Optional[RetryPolicy]
    ) -> Call:
        return Call(
            "CloseSession",
            self._stub.CloseSession,
            pb.CloseSessionRequest(session_id=session_id),
            timeout,
            self._retry_for(True, retry),
            on_retry_not_found=pb.CloseSessionResponse,
            result=lambda _: None,
        )

    def _truncate_session_call(
        self,
        session_id: str,
        committed_len: int,
        timeout: Optional[float],
        retry: Optional[RetryPolicy],
    ) -> Call:
        req = pb.TruncateSessionRequest(session_id=session_id, committed_len=committed_len)
        return Call(
            "TruncateSession",
            self._stub.TruncateSession,
            req,
            timeout,
            self._retry_for(True, retry),
        )

    def _fork_session_call(self, session_id: str, timeout: Optional[float]) -> Call:
        req = pb.ForkSessionRequest(session_id=session_id)
        return Call("ForkSession", self._stub.ForkSession, req, timeout, c.NO_RETRY)

    def _session_state(
        self, known_prefix: List[int], prompt_tokens: Sequence[int], opened: Any
    ) -> c.SessionState:
        """The state of a session opened with ``opened`` (an OpenSessionResponse) on a prefix
        whose tokens the client knows (``known_prefix``, see :func:`_common.known_prefix`)."""
        return c.SessionState(
            opened.session_id,
            known_prefix + list(prompt_tokens) + [opened.next_token],
            opened.committed_len,
        )


class CallAttempts:
    """The retry decisions of one unary call: each attempt's call options, and after a
    failure whether the call counts as done, fails now (raising its error) or pauses."""

    def __init__(
        self,
        client: ClientBase[Any],
        name: str,
        timeout: Optional[float],
        retry: Optional[RetryPolicy],
        done_when_gone: bool,
    ) -> None:
        self.client = client
        self.name = name
        self.loop = c.RetryLoop(
            retry if retry is not None else c.NO_RETRY,
            client.timeout if timeout is None else timeout,
            client._rng,
        )
        self.done_when_gone = done_when_gone

    def options(self) -> Dict[str, Any]:
        """Starts an attempt: the stub method's keyword arguments."""
        return {
            "timeout": self.loop.next_attempt_timeout(),
            "metadata": self.client.metadata or None,
            "wait_for_ready": self.client.wait_for_ready,
        }

    def failed(self, e: grpc.RpcError) -> Optional[float]:
        """After attempt failed with ``e`` (call it in the ``except`` clause): None when the
        call counts as done (a retry that finds the session gone), else the pause before the
        next attempt; raises the call's VerifydError when there is none."""
        code, details = e.code(), e.details() or ""
        if self.loop.attempt > 1 and self.done_when_gone and code == grpc.StatusCode.NOT_FOUND:
            return None
        delay = self.loop.pause_before_retry(code)
        if delay is None:
            c.log_failure(self.name, code, details, self.loop.attempt)
            raise from_rpc_error(e, method=self.name, attempts=self.loop.attempt) from e
        self.client._retrying(
            self.name, self.loop.attempt, code, details, delay, self.loop.policy.max_attempts
        )
        return delay


class ServingWait:
    """The deadline of ``wait_until_serving`` and the error it raises when it passes."""

    def __init__(self, target: str, timeout: float) -> None:
        self.target = target
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.last: Optional[BaseException] = None

    def pending(self) -> bool:
        return time.monotonic() < self.deadline

    def probe_timeout(self) -> float:
        """The deadline of the next health check."""
        return max(0.05, min(1.0, self.deadline - time.monotonic()))

    def give_up(self) -> None:
        """Raises the last check's error, or Unavailable when the server answered but was
        not SERVING."""
        if self.last is not None:
            raise self.last
        raise Unavailable(
            f"{self.target} not SERVING after {self.timeout} s", method="Health.Check"
        )


# ---------------------------------------------------------------------------------------------
# Sessions


class SessionBase(Generic[ClientT]):
    """What :class:`verifyd.Session` and :class:`verifyd.AsyncSession` share."""

    _kind = "Session"  # the class name in repr

    def __init__(self, client: ClientT, state: c.SessionState, opened: Any) -> None:
        self.client = client
        self._state = state
        self.opened = opened  # the OpenSessionResponse (or ForkSessionResponse)
        self.last_result: Optional[pb.VerifyResult] = None

    @property
    def session_id(self) -> str:
        return self._state.session_id

    @property
    def next_token(self) -> int:
        """The pending token (emitted; its KV is computed by the next Verify)."""
        return self._state.next_token

    @property
    def committed_len(self) -> int:
        return self._state.committed_len

    @property
    def history(self) -> List[int]:
        """Known tokens up to and including the pending token (a copy)."""
        return list(self._state.history)

    def _record(self, result: pb.VerifyResult) -> pb.VerifyResult:
        """Records a Verify result of this session."""
        self._state.apply(result)
        self.last_result = result
        return result

    def _truncated(self, response: Any) -> Any:
        """Records a TruncateSessionResponse."""
        self._state.apply_truncate(response.committed_len, response.next_token)
        return response

    def __repr__(self) -> str:
        return (
            f"{self._kind}({self.session_id!r}, committed_len={self.committed_len}, "
            f"next_token={self.next_token})"
        )


def record_all(sessions: Sequence[Any], results: List[pb.VerifyResult]) -> List[pb.VerifyResult]:
    """Records each session's result (in order); returns the results."""
    for s, r in zip(sessions, results):
        s._state.apply(r)
        s.last_result = r
    return results


def sessions_request(
    sessions: Sequence[Any],
    drafts: Sequence[TreeLike],
    item_fields: Optional[Sequence[Mapping[str, Any]]],
) -> pb.VerifyRequest:
    """One VerifyRequest with one item per session (each with a fresh request_id and the
    session's committed length)."""
    if len(sessions) != len(drafts):
        raise ValueError("one draft per session")
    fields = item_fields if item_fields is not None else [{}] * len(sessions)
    return pb.VerifyRequest(
        items=[s._state.item(d, None, f) for s, d, f in zip(sessions, drafts, fields)]
    )


def one_item(
    session_id: str,
    draft: TreeLike,
    request_id: Optional[str],
    expected_committed_len: Optional[int],
    fields: Mapping[str, Any],
) -> pb.VerifyItem:
    """The item of ``verify_one`` (see :func:`verifyd.item`)."""
    return c.item(
        session_id,
        draft,
        request_id=request_id,
        expected_committed_len=expected_committed_len,
        **fields,
    )


def as_verify_request(items: Any) -> pb.VerifyRequest:
    """A VerifyRequest as given, or one made of items (VerifyItem messages or dicts)."""
    return items if isinstance(items, pb.VerifyRequest) else c.verify_request(items)


# ---------------------------------------------------------------------------------------------
# VerifyStream


class Status:
    """A (code, details) pair shaped like an RpcError for from_rpc_error."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class StreamBase(Generic[ClientT]):
    """What :class:`verifyd.VerifyStream` and :class:`verifyd.AsyncVerifyStream` share: the
    stream's options, its reconnect log line and the retry decisions of ``send``."""

    def __init__(
        self,
        client: ClientT,
        *,
        timeout: Optional[float] = None,
        retry: Optional[RetryPolicy] = None,
    ) -> None:
        self._client = client
        self._timeout = timeout
        self._retry = retry
        self._call: Any = None
        self.streams_opened = 0

    def _stream_options(self) -> Dict[str, Any]:
        """Before opening a stream (logs a reconnect): the stub method's keyword arguments."""
        client: Any = self._client
        if self.streams_opened:
            c.log.info(
                "VerifyStream: reconnecting to %s (stream %d)",
                client.target,
                self.streams_opened + 1,
            )
        return {
            "timeout": self._timeout,
            "metadata": client.metadata or None,
            "wait_for_ready": client.wait_for_ready,
        }

    def _attempts(self, request: pb.VerifyRequest) -> "StreamAttempts":
        return StreamAttempts(self._client, self._retry, request)


class StreamAttempts:
    """The retry decisions of one VerifyStream request: resent on a new stream only when
    every item carries a request_id and the code is retryable."""

    def __init__(self, client: Any, retry: Optional[RetryPolicy], request: pb.VerifyRequest):
        self.client: ClientBase[Any] = client
        self.policy = client._retry_for(c.retry_safe(request), retry)
        self.attempt = 0

    def start(self) -> None:
        """Starts an attempt."""
        self.attempt += 1

    def failed(self, code: grpc.StatusCode, details: str, err: Optional[grpc.RpcError]) -> float:
        """After the current attempt failed with ``code`` (``err``: the RpcError, when there
        was one): the pause before the next attempt; raises the VerifydError when there is
        none."""
        if self.attempt >= self.policy.max_attempts or code not in self.policy.retryable_codes:
            c.log_failure("VerifyStream", code, details, self.attempt)
            if err is not None:
                raise from_rpc_error(err, method="VerifyStream", attempts=self.attempt) from err
            raise from_rpc_error(
                Status(code, details), method="VerifyStream", attempts=self.attempt
            )
        delay = self.policy.backoff_s(self.attempt, self.client._rng)
        self.client._retrying(
            "VerifyStream", self.attempt, code, details, delay, self.policy.max_attempts
        )
        return delay
