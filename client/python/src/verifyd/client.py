"""The synchronous verifyd client.

Thread-safety: a :class:`Client` may be shared by threads (gRPC channels and stubs are
thread-safe). A :class:`Session` or a :class:`VerifyStream` is for one thread at a time.
"""

from __future__ import annotations

import queue
import random
import time
from typing import Any, Callable, Iterator, List, Mapping, Optional, Sequence, Tuple, TypeVar

import grpc

from . import _common as c
from ._common import (
    ItemLike,
    Metadata,
    OnRetry,
    PemSource,
    RetryEvent,
    RetryPolicy,
    TreeLike,
)
from ._proto import verify_pb2 as pb
from ._proto import verify_pb2_grpc as pb_grpc
from .errors import NotFound, Unavailable, VerifydError, from_rpc_error

__all__ = ["Client", "Session", "VerifyStream"]

R = TypeVar("R")


class Client:
    """A connection to verifyd with one method per RPC, plus session and stream helpers.

    Args:
        target: ``host:port`` (any gRPC target string).
        tls: use TLS. Default: on when root certificates, a client certificate or a token
            are given, else plaintext. TLS without ``root_certificates`` trusts the system's
            roots.
        root_certificates: PEM (bytes, or a file path) of the CA that signed the server's
            certificate (the server's --tls_cert).
        client_certificate, client_key: PEM of this client's certificate and key, for a
            server started with --tls_client_ca (mutual TLS; sessions are bound to the
            certificate's subject).
        token: bearer token for a server started with --auth_token_file; sent as
            ``authorization: Bearer <token>`` (needs TLS).
        server_name_override: the name to check the server's certificate against, when it
            differs from the target's host.
        timeout: default deadline of each attempt of each call, in seconds (None: none; the
            server applies its --max_call_deadline_s).
        retry: the policy for calls that are safe to retry (default: ``RetryPolicy()``, 5
            attempts; see :class:`RetryPolicy`). ``NO_RETRY`` turns retries off.
        metadata: extra metadata sent with every call (e.g. a routing key for a
            session-affine load balancer).
        max_message_bytes: the largest message sent or received.
        channel_options: extra gRPC channel arguments.
        interceptors: gRPC client interceptors wrapped around the channel.
        channel: use this channel instead of creating one (the TLS options are then
            ignored; the channel is not closed by :meth:`close`).
        on_retry: called with a :class:`RetryEvent` before each retry's pause.
        wait_for_ready: queue calls while the channel connects instead of failing at once
            with UNAVAILABLE.
    """

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
        channel: Optional[grpc.Channel] = None,
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
        if channel is None:
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
            creds = cfg.credentials()
            opts = cfg.channel_options()
            channel = (
                grpc.secure_channel(target, creds, options=opts)
                if creds is not None
                else grpc.insecure_channel(target, options=opts)
            )
        self._base_channel = channel
        if interceptors:
            channel = grpc.intercept_channel(channel, *interceptors)
        self.channel: grpc.Channel = channel
        self._stub = pb_grpc.VerifyServiceStub(channel)
        self._health = c.health_check(channel)

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the channel (when the client created it)."""
        if self._owns_channel:
            self._base_channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the retry loop ----------------------------------------------------------------------

    def _invoke(
        self,
        name: str,
        fn: Callable[..., R],
        request: Any,
        *,
        timeout: Optional[float],
        retry: Optional[RetryPolicy],
        on_retry_not_found: Optional[Callable[[], R]] = None,
    ) -> R:
        loop = c.RetryLoop(
            retry if retry is not None else c.NO_RETRY,
            self.timeout if timeout is None else timeout,
            self._rng,
        )
        while True:
            attempt_timeout = loop.next_attempt_timeout()
            try:
                return fn(
                    request,
                    timeout=attempt_timeout,
                    metadata=self.metadata or None,
                    wait_for_ready=self.wait_for_ready,
                )
            except grpc.RpcError as e:
                code, details = e.code(), e.details() or ""
                if (
                    loop.attempt > 1
                    and on_retry_not_found is not None
                    and code == grpc.StatusCode.NOT_FOUND
                ):
                    return on_retry_not_found()
                delay = loop.pause_before_retry(code)
                if delay is None:
                    c.log_failure(name, code, details, loop.attempt)
                    raise from_rpc_error(e, method=name, attempts=loop.attempt) from e
                event = RetryEvent(name, loop.attempt, code, details, delay)
                c.log_retry(event, loop.policy.max_attempts)
                if self.on_retry is not None:
                    self.on_retry(event)
                time.sleep(delay)

    def _retry_for(self, safe: bool, retry: Optional[RetryPolicy]) -> RetryPolicy:
        if not safe:
            return c.NO_RETRY
        return self.retry if retry is None else retry

    # -- RPCs --------------------------------------------------------------------------------

    def get_info(
        self, *, timeout: Optional[float] = None, retry: Optional[RetryPolicy] = None
    ) -> pb.GetInfoResponse:
        """Model, parallelism and limits of the server (retried: read-only)."""
        return self._invoke(
            "GetInfo",
            self._stub.GetInfo,
            pb.GetInfoRequest(),
            timeout=timeout,
            retry=self._retry_for(True, retry),
        )

    def health(self, service: str = "", *, timeout: Optional[float] = None) -> str:
        """grpc.health.v1 status: "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN" or "UNKNOWN"."""
        return self._invoke(
            "Health.Check", self._health, service, timeout=timeout, retry=c.NO_RETRY
        )

    def wait_until_serving(self, timeout: float = 30.0, interval: float = 0.05) -> None:
        """Polls health until SERVING; raises the last error (or Unavailable) on timeout."""
        deadline = time.monotonic() + timeout
        last: Optional[BaseException] = None
        while time.monotonic() < deadline:
            try:
                if self.health(timeout=max(0.05, min(1.0, deadline - time.monotonic()))) == (
                    "SERVING"
                ):
                    return
                last = None
            except VerifydError as e:
                last = e
            time.sleep(interval)
        if last is not None:
            raise last
        raise Unavailable(f"{self.target} not SERVING after {timeout} s", method="Health.Check")

    def open_session(
        self,
        prompt_tokens: Sequence[int],
        *,
        prefix_session_id: Optional[str] = None,
        sampling: Any = None,
        top_logprobs: Optional[int] = None,
        hidden_states: Any = None,
        timeout: Optional[float] = None,
        **fields: Any,
    ) -> pb.OpenSessionResponse:
        """Creates a session and prefills ``prompt_tokens``. Never retried.

        Args:
            prompt_tokens: the prompt (non-empty).
            prefix_session_id: start from that session's committed tokens (shared KV).
            sampling: ``SamplingParams`` as a message or a dict (``temperature``, ``top_p``,
                ``top_k``, ``seed``); unset = greedy.
            top_logprobs: logprobs of the top tokens returned with every emitted token.
            hidden_states: ``HiddenStatesRequest`` as a message or dict (``layers``,
                ``include_prompt``, ``dtype``), or just a list of layers.
            **fields: any other OpenSessionRequest field by name.

        The optional fields exist only when the installed stubs' verify.proto has them;
        otherwise :class:`~verifyd.errors.UnsupportedField` is raised.
        """
        req = c.open_request(
            prompt_tokens, prefix_session_id, sampling, top_logprobs, hidden_states, fields
        )
        return self._invoke(
            "OpenSession", self._stub.OpenSession, req, timeout=timeout, retry=c.NO_RETRY
        )

    def verify(
        self,
        items: Sequence[ItemLike],
        *,
        timeout: Optional[float] = None,
        retry: Optional[RetryPolicy] = None,
    ) -> List[pb.VerifyResult]:
        """One Verify call: one draft tree per item (distinct sessions); results in order.

        Items are VerifyItem messages (see :func:`verifyd.item`) or dicts. The call is
        retried (same message) only when every item carries a ``request_id``.
        """
        req = items if isinstance(items, pb.VerifyRequest) else c.verify_request(items)
        resp = self._invoke(
            "Verify",
            self._stub.Verify,
            req,
            timeout=timeout,
            retry=self._retry_for(c.retry_safe(req), retry),
        )
        return list(resp.results)

    def verify_one(
        self,
        session_id: str,
        draft: TreeLike = None,
        *,
        request_id: Optional[str] = None,
        expected_committed_len: Optional[int] = None,
        timeout: Optional[float] = None,
        retry: Optional[RetryPolicy] = None,
        **fields: Any,
    ) -> pb.VerifyResult:
        """Verify with one item (see :func:`verifyd.item` for the arguments)."""
        it = c.item(
            session_id,
            draft,
            request_id=request_id,
            expected_committed_len=expected_committed_len,
            **fields,
        )
        return self.verify([it], timeout=timeout, retry=retry)[0]

    def close_session(
        self,
        session_id: str,
        *,
        timeout: Optional[float] = None,
        retry: Optional[RetryPolicy] = None,
    ) -> None:
        """Frees the session. Retried; a retry that finds the session gone counts as done."""
        self._invoke(
            "CloseSession",
            self._stub.CloseSession,
            pb.CloseSessionRequest(session_id=session_id),
            timeout=timeout,
            retry=self._retry_for(True, retry),
            on_retry_not_found=pb.CloseSessionResponse,
        )

    def truncate_session(
        self,
        session_id: str,
        committed_len: int,
        *,
        timeout: Optional[float] = None,
        retry: Optional[RetryPolicy] = None,
    ) -> pb.TruncateSessionResponse:
        """Rolls the session back to its first ``committed_len`` tokens (retried: the same
        truncation twice has the same result)."""
        return self._invoke(
            "TruncateSession",
            self._stub.TruncateSession,
            pb.TruncateSessionRequest(session_id=session_id, committed_len=committed_len),
            timeout=timeout,
            retry=self._retry_for(True, retry),
        )

    def fork_session(
        self, session_id: str, *, timeout: Optional[float] = None
    ) -> pb.ForkSessionResponse:
        """A new session continuing from the same point (shared KV). Never retried."""
        return self._invoke(
            "ForkSession",
            self._stub.ForkSession,
            pb.ForkSessionRequest(session_id=session_id),
            timeout=timeout,
            retry=c.NO_RETRY,
        )

    def verify_stream(
        self, *, timeout: Optional[float] = None, retry: Optional[RetryPolicy] = None
    ) -> "VerifyStream":
        """Opens a VerifyStream (one request, then its response, in lockstep).

        ``timeout`` bounds the whole stream (None: no deadline; the server bounds each
        message by its --max_call_deadline_s).
        """
        return VerifyStream(self, timeout=timeout, retry=retry)

    # -- sessions ----------------------------------------------------------------------------

    def session(
        self,
        prompt_tokens: Sequence[int],
        *,
        prefix: "Optional[Session | str]" = None,
        sampling: Any = None,
        top_logprobs: Optional[int] = None,
        hidden_states: Any = None,
        timeout: Optional[float] = None,
        **fields: Any,
    ) -> "Session":
        """Opens a session and returns a :class:`Session` that tracks its tokens and sends
        every Verify with a request_id and expected_committed_len (exactly-once retries).
        ``prefix``: a Session or session id to continue from (shared KV)."""
        prefix_id, prefix_tokens = c.known_prefix(prefix)
        resp = self.open_session(
            prompt_tokens,
            prefix_session_id=prefix_id,
            sampling=sampling,
            top_logprobs=top_logprobs,
            hidden_states=hidden_states,
            timeout=timeout,
            **fields,
        )
        state = c.SessionState(
            resp.session_id,
            prefix_tokens + list(prompt_tokens) + [resp.next_token],
            resp.committed_len,
        )
        return Session(self, state, resp)

    def verify_sessions(
        self,
        sessions: Sequence["Session"],
        drafts: Sequence[TreeLike],
        *,
        item_fields: Optional[Sequence[Mapping[str, Any]]] = None,
        timeout: Optional[float] = None,
        retry: Optional[RetryPolicy] = None,
    ) -> List[pb.VerifyResult]:
        """One Verify call for several sessions (one draft each); updates every Session."""
        req = _sessions_request(sessions, drafts, item_fields)
        results = self.verify(req, timeout=timeout, retry=retry)
        for s, r in zip(sessions, results):
            s._state.apply(r)
            s.last_result = r
        return results


def _sessions_request(
    sessions: Sequence[Any],
    drafts: Sequence[TreeLike],
    item_fields: Optional[Sequence[Mapping[str, Any]]],
) -> pb.VerifyRequest:
    if len(sessions) != len(drafts):
        raise ValueError("one draft per session")
    fields = item_fields if item_fields is not None else [{}] * len(sessions)
    return pb.VerifyRequest(
        items=[s._state.item(d, None, f) for s, d, f in zip(sessions, drafts, fields)]
    )


class Session:
    """One verifyd session seen from the client (returned by :meth:`Client.session`).

    ``history`` holds the tokens the client knows: the prompt (with the prefix session's
    tokens when opened on a Session), then every emitted token; its last token is the
    pending ``next_token``. Every :meth:`verify` carries a fresh request_id and the expected
    committed length, so it is retried safely; if it still fails (the server may or may not
    have applied it), :meth:`resync` rolls the server back to what this object knows.
    """

    def __init__(self, client: Client, state: c.SessionState, opened: Any) -> None:
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

    def verify(
        self,
        draft: TreeLike = None,
        *,
        request_id: Optional[str] = None,
        timeout: Optional[float] = None,
        retry: Optional[RetryPolicy] = None,
        **fields: Any,
    ) -> pb.VerifyResult:
        """Verifies one draft tree; returns the result and records its emitted tokens."""
        it = self._state.item(draft, request_id, fields)
        r = self.client.verify([it], timeout=timeout, retry=retry)[0]
        self._state.apply(r)
        self.last_result = r
        return r

    def truncate(
        self, committed_len: int, *, timeout: Optional[float] = None
    ) -> pb.TruncateSessionResponse:
        """Rolls the session back to its first ``committed_len`` tokens."""
        r = self.client.truncate_session(self.session_id, committed_len, timeout=timeout)
        self._state.apply_truncate(r.committed_len, r.next_token)
        return r

    def resync(self, *, timeout: Optional[float] = None) -> None:
        """After a failed verify: rolls the server back to this object's committed length
        (a no-op on the server when nothing was applied)."""
        self.truncate(self.committed_len, timeout=timeout)

    def fork(self, *, timeout: Optional[float] = None) -> "Session":
        """A new Session continuing from the same point (shared KV)."""
        r = self.client.fork_session(self.session_id, timeout=timeout)
        return Session(self.client, self._state.fork_state(r.session_id), r)

    def close(self, *, timeout: Optional[float] = None) -> None:
        """Frees the session (a session already gone counts as closed)."""
        if self._state.closed:
            return
        try:
            self.client.close_session(self.session_id, timeout=timeout)
        except NotFound:
            pass
        self._state.closed = True

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Session({self.session_id!r}, committed_len={self.committed_len}, "
            f"next_token={self.next_token})"
        )


class VerifyStream:
    """One VerifyStream: :meth:`verify` writes a request and reads its response.

    A failed request ends the stream with its status. When every item of the failed
    request carries a request_id and the code is retryable, the request is resent on a new
    stream (the server deduplicates it); otherwise the error is raised and the next call
    opens a new stream.
    """

    _END: Any = object()

    def __init__(
        self,
        client: Client,
        *,
        timeout: Optional[float] = None,
        retry: Optional[RetryPolicy] = None,
    ) -> None:
        self._client = client
        self._timeout = timeout
        self._retry = retry
        self._queue: Optional["queue.SimpleQueue[Any]"] = None
        self._call: Any = None
        self.streams_opened = 0

    def _open(self) -> None:
        q: "queue.SimpleQueue[Any]" = queue.SimpleQueue()

        def requests() -> Iterator[pb.VerifyRequest]:
            while True:
                r = q.get()
                if r is VerifyStream._END:
                    return
                yield r

        if self.streams_opened:
            c.log.info(
                "VerifyStream: reconnecting to %s (stream %d)",
                self._client.target,
                self.streams_opened + 1,
            )
        self._queue = q
        self._call = self._client._stub.VerifyStream(
            requests(),
            timeout=self._timeout,
            metadata=self._client.metadata or None,
            wait_for_ready=self._client.wait_for_ready,
        )
        self.streams_opened += 1

    def _drop(self) -> None:
        if self._queue is not None:
            self._queue.put(VerifyStream._END)  # lets the request iterator finish
        if self._call is not None:
            self._call.cancel()
        self._queue = None
        self._call = None

    def send(self, request: pb.VerifyRequest) -> pb.VerifyResponse:
        """One request, one response (retried as described in the class doc)."""
        policy = self._client._retry_for(c.retry_safe(request), self._retry)
        attempt = 0
        while True:
            attempt += 1
            if self._call is None:
                self._open()
            assert self._queue is not None
            self._queue.put(request)
            try:
                return next(self._call)
            except StopIteration:
                self._drop()
                code, details = grpc.StatusCode.UNAVAILABLE, "stream ended without a response"
                err: Optional[grpc.RpcError] = None
            except grpc.RpcError as e:
                self._drop()
                code, details, err = e.code(), e.details() or "", e
            if attempt >= policy.max_attempts or code not in policy.retryable_codes:
                c.log_failure("VerifyStream", code, details, attempt)
                if err is not None:
                    raise from_rpc_error(err, method="VerifyStream", attempts=attempt) from err
                raise Unavailable(details, method="VerifyStream", attempts=attempt)
            delay = policy.backoff_s(attempt, self._client._rng)
            event = RetryEvent("VerifyStream", attempt, code, details, delay)
            c.log_retry(event, policy.max_attempts)
            if self._client.on_retry is not None:
                self._client.on_retry(event)
            time.sleep(delay)

    def verify(self, items: Sequence[ItemLike]) -> List[pb.VerifyResult]:
        """Like :meth:`Client.verify`, over the stream."""
        req = items if isinstance(items, pb.VerifyRequest) else c.verify_request(items)
        return list(self.send(req).results)

    def verify_sessions(
        self,
        sessions: Sequence[Session],
        drafts: Sequence[TreeLike],
        *,
        item_fields: Optional[Sequence[Mapping[str, Any]]] = None,
    ) -> List[pb.VerifyResult]:
        """Like :meth:`Client.verify_sessions`, over the stream."""
        results = list(self.send(_sessions_request(sessions, drafts, item_fields)).results)
        for s, r in zip(sessions, results):
            s._state.apply(r)
            s.last_result = r
        return results

    def close(self) -> None:
        """Half-closes the stream and waits for the server to end it."""
        if self._call is None:
            return
        call, q = self._call, self._queue
        self._call = self._queue = None
        assert q is not None
        q.put(VerifyStream._END)
        try:
            for _ in call:
                pass
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                raise from_rpc_error(e, method="VerifyStream") from e

    def __enter__(self) -> "VerifyStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc and exc[0] is not None:
            self._drop()
        else:
            self.close()
