"""The synchronous verifyd client.

Thread-safety: a :class:`Client` may be shared by threads (gRPC channels and stubs are
thread-safe). A :class:`Session` or a :class:`VerifyStream` is for one thread at a time.
"""

from __future__ import annotations

import contextlib
import queue
import time
from typing import Any, Iterator, List, Mapping, Optional, Sequence

import grpc

from . import _base
from . import _common as c
from ._common import ItemLike, RetryPolicy, TreeLike
from ._proto import verify_pb2 as pb
from .errors import NotFound, VerifydError, from_rpc_error

__all__ = ["Client", "Session", "VerifyStream"]


class Client(_base.ClientBase[grpc.Channel]):
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

    def _channel(
        self, given: Optional[grpc.Channel], cfg: c.ChannelConfig, interceptors: Sequence[Any]
    ) -> grpc.Channel:
        channel = given
        if channel is None:
            channel = cfg.make_channel(grpc.secure_channel, grpc.insecure_channel)
        self._base_channel = channel
        if interceptors:
            channel = grpc.intercept_channel(channel, *interceptors)
        return channel

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the channel (when the client created it)."""
        if self._owns_channel:
            self._base_channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the retry loop (the decisions are _base.CallAttempts') ------------------------------

    def _invoke(self, call: _base.Call) -> Any:
        """The response of ``call`` (before ``call.result``), retried as its policy says."""
        attempts = self._attempts(call)
        while True:
            try:
                return call.fn(call.request, **attempts.options())
            except grpc.RpcError as e:
                pause = attempts.failed(e)
            if pause is None:  # a retry found the session gone: done
                assert call.on_retry_not_found is not None
                return call.on_retry_not_found()
            time.sleep(pause)

    def _call(self, call: _base.Call) -> Any:
        return call.result(self._invoke(call))

    # -- RPCs --------------------------------------------------------------------------------

    def get_info(
        self, *, timeout: Optional[float] = None, retry: Optional[RetryPolicy] = None
    ) -> pb.GetInfoResponse:
        """Model, parallelism and limits of the server (retried: read-only)."""
        return self._call(self._get_info_call(timeout, retry))

    def health(self, service: str = "", *, timeout: Optional[float] = None) -> str:
        """grpc.health.v1 status: "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN" or "UNKNOWN"."""
        return self._call(self._health_call(service, timeout))

    def wait_until_serving(self, timeout: float = 30.0, interval: float = 0.05) -> None:
        """Polls health until SERVING; raises the last error (or Unavailable) on timeout."""
        wait = _base.ServingWait(self.target, timeout)
        while wait.pending():
            try:
                if self.health(timeout=wait.probe_timeout()) == "SERVING":
                    return
                wait.last = None
            except VerifydError as e:
                wait.last = e
            time.sleep(interval)
        wait.give_up()

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
        call = self._open_session_call(
            prompt_tokens, prefix_session_id, sampling, top_logprobs, hidden_states, timeout, fields
        )
        return self._call(call)

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
        return self._call(self._verify_call(items, timeout, retry))

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
        it = _base.one_item(session_id, draft, request_id, expected_committed_len, fields)
        return self.verify([it], timeout=timeout, retry=retry)[0]

    def close_session(
        self,
        session_id: str,
        *,
        timeout: Optional[float] = None,
        retry: Optional[RetryPolicy] = None,
    ) -> None:
        """Frees the session. Retried; a retry that finds the session gone counts as done."""
        self._call(self._close_session_call(session_id, timeout, retry))

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
        return self._call(self._truncate_session_call(session_id, committed_len, timeout, retry))

    def fork_session(
        self, session_id: str, *, timeout: Optional[float] = None
    ) -> pb.ForkSessionResponse:
        """A new session continuing from the same point (shared KV). Never retried."""
        return self._call(self._fork_session_call(session_id, timeout))

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
        prefix_id, known = c.known_prefix(prefix)
        opts = dict(sampling=sampling, top_logprobs=top_logprobs, hidden_states=hidden_states)
        resp = self.open_session(
            prompt_tokens, prefix_session_id=prefix_id, timeout=timeout, **opts, **fields
        )
        return Session(self, self._session_state(known, prompt_tokens, resp), resp)

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
        req = _base.sessions_request(sessions, drafts, item_fields)
        return _base.record_all(sessions, self.verify(req, timeout=timeout, retry=retry))


class Session(_base.SessionBase[Client]):
    """One verifyd session seen from the client (returned by :meth:`Client.session`).

    ``history`` holds the tokens the client knows: the prompt (with the prefix session's
    tokens when opened on a Session), then every emitted token; its last token is the
    pending ``next_token``. Every :meth:`verify` carries a fresh request_id and the expected
    committed length, so it is retried safely; if it still fails (the server may or may not
    have applied it), :meth:`resync` rolls the server back to what this object knows.
    """

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
        return self._record(self.client.verify([it], timeout=timeout, retry=retry)[0])

    def truncate(
        self, committed_len: int, *, timeout: Optional[float] = None
    ) -> pb.TruncateSessionResponse:
        """Rolls the session back to its first ``committed_len`` tokens."""
        r = self.client.truncate_session(self.session_id, committed_len, timeout=timeout)
        return self._truncated(r)

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
        if not self._state.closed:
            with contextlib.suppress(NotFound):
                self.client.close_session(self.session_id, timeout=timeout)
            self._state.closed = True

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class VerifyStream(_base.StreamBase[Client]):
    """One VerifyStream: :meth:`verify` writes a request and reads its response.

    A failed request ends the stream with its status. When every item of the failed
    request carries a request_id and the code is retryable, the request is resent on a new
    stream (the server deduplicates it); otherwise the error is raised and the next call
    opens a new stream.
    """

    _END: Any = object()
    _queue: Optional["queue.SimpleQueue[Any]"] = None

    def _open(self) -> None:
        q: "queue.SimpleQueue[Any]" = queue.SimpleQueue()

        def requests() -> Iterator[pb.VerifyRequest]:
            while True:
                r = q.get()
                if r is VerifyStream._END:
                    return
                yield r

        options = self._stream_options()
        self._queue = q
        self._call = self._client._stub.VerifyStream(requests(), **options)
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
        attempts = self._attempts(request)
        while True:
            attempts.start()
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
            time.sleep(attempts.failed(code, details, err))

    def verify(self, items: Sequence[ItemLike]) -> List[pb.VerifyResult]:
        """Like :meth:`Client.verify`, over the stream."""
        return list(self.send(_base.as_verify_request(items)).results)

    def verify_sessions(
        self,
        sessions: Sequence[Session],
        drafts: Sequence[TreeLike],
        *,
        item_fields: Optional[Sequence[Mapping[str, Any]]] = None,
    ) -> List[pb.VerifyResult]:
        """Like :meth:`Client.verify_sessions`, over the stream."""
        req = _base.sessions_request(sessions, drafts, item_fields)
        return _base.record_all(sessions, list(self.send(req).results))

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
