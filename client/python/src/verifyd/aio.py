"""The asyncio verifyd client (grpc.aio): the same methods as :mod:`verifyd.client`, as
coroutines.

Use it from one event loop: create the :class:`AsyncClient` inside the loop that uses it.
An :class:`AsyncSession` or :class:`AsyncVerifyStream` is for one task at a time.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any, Awaitable, Callable, List, Mapping, Optional, Sequence, Tuple, TypeVar

import grpc
import grpc.aio

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
from .client import _sessions_request
from .errors import NotFound, Unavailable, VerifydError, from_rpc_error

__all__ = ["AsyncClient", "AsyncSession", "AsyncVerifyStream"]

R = TypeVar("R")


class AsyncClient:
    """The asyncio counterpart of :class:`verifyd.Client` (same arguments; ``interceptors``
    are grpc.aio client interceptors)."""

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
        channel: Optional[grpc.aio.Channel] = None,
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
        if channel is not None and interceptors:
            raise ValueError("grpc.aio channels take their interceptors when created")
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
            ics = list(interceptors) or None
            channel = (
                grpc.aio.secure_channel(target, creds, options=opts, interceptors=ics)
                if creds is not None
                else grpc.aio.insecure_channel(target, options=opts, interceptors=ics)
            )
        self.channel: grpc.aio.Channel = channel
        self._stub = pb_grpc.VerifyServiceStub(channel)
        self._health = c.health_check(channel)

    async def close(self) -> None:
        """Closes the channel (when the client created it)."""
        if self._owns_channel:
            await self.channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def _invoke(
        self,
        name: str,
        fn: Callable[..., Awaitable[R]],
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
                return await fn(
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
                await asyncio.sleep(delay)

    def _retry_for(self, safe: bool, retry: Optional[RetryPolicy]) -> RetryPolicy:
        if not safe:
            return c.NO_RETRY
        return self.retry if retry is None else retry

    async def get_info(
        self, *, timeout: Optional[float] = None, retry: Optional[RetryPolicy] = None
    ) -> pb.GetInfoResponse:
        """See :meth:`verifyd.Client.get_info`."""
        return await self._invoke(
            "GetInfo",
            self._stub.GetInfo,
            pb.GetInfoRequest(),
            timeout=timeout,
            retry=self._retry_for(True, retry),
        )

    async def health(self, service: str = "", *, timeout: Optional[float] = None) -> str:
        """See :meth:`verifyd.Client.health`."""
        return await self._invoke(
            "Health.Check", self._health, service, timeout=timeout, retry=c.NO_RETRY
        )

    async def wait_until_serving(self, timeout: float = 30.0, interval: float = 0.05) -> None:
        """See :meth:`verifyd.Client.wait_until_serving`."""
        deadline = time.monotonic() + timeout
        last: Optional[BaseException] = None
        while time.monotonic() < deadline:
            try:
                t = max(0.05, min(1.0, deadline - time.monotonic()))
                if await self.health(timeout=t) == "SERVING":
                    return
                last = None
            except VerifydError as e:
                last = e
            await asyncio.sleep(interval)
        if last is not None:
            raise last
        raise Unavailable(f"{self.target} not SERVING after {timeout} s", method="Health.Check")

    async def open_session(
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
        """See :meth:`verifyd.Client.open_session` (never retried)."""
        req = c.open_request(
            prompt_tokens, prefix_session_id, sampling, top_logprobs, hidden_states, fields
        )
        return await self._invoke(
            "OpenSession", self._stub.OpenSession, req, timeout=timeout, retry=c.NO_RETRY
        )

    async def verify(
        self,
        items: Sequence[ItemLike],
        *,
        timeout: Optional[float] = None,
        retry: Optional[RetryPolicy] = None,
    ) -> List[pb.VerifyResult]:
        """See :meth:`verifyd.Client.verify` (retried only when every item has a request_id)."""
        req = items if isinstance(items, pb.VerifyRequest) else c.verify_request(items)
        resp = await self._invoke(
            "Verify",
            self._stub.Verify,
            req,
            timeout=timeout,
            retry=self._retry_for(c.retry_safe(req), retry),
        )
        return list(resp.results)

    async def verify_one(
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
        """See :meth:`verifyd.Client.verify_one`."""
        it = c.item(
            session_id,
            draft,
            request_id=request_id,
            expected_committed_len=expected_committed_len,
            **fields,
        )
        return (await self.verify([it], timeout=timeout, retry=retry))[0]

    async def close_session(
        self,
        session_id: str,
        *,
        timeout: Optional[float] = None,
        retry: Optional[RetryPolicy] = None,
    ) -> None:
        """See :meth:`verifyd.Client.close_session`."""
        await self._invoke(
            "CloseSession",
            self._stub.CloseSession,
            pb.CloseSessionRequest(session_id=session_id),
            timeout=timeout,
            retry=self._retry_for(True, retry),
            on_retry_not_found=pb.CloseSessionResponse,
        )

    async def truncate_session(
        self,
        session_id: str,
        committed_len: int,
        *,
        timeout: Optional[float] = None,
        retry: Optional[RetryPolicy] = None,
    ) -> pb.TruncateSessionResponse:
        """See :meth:`verifyd.Client.truncate_session`."""
        return await self._invoke(
            "TruncateSession",
            self._stub.TruncateSession,
            pb.TruncateSessionRequest(session_id=session_id, committed_len=committed_len),
            timeout=timeout,
            retry=self._retry_for(True, retry),
        )

    async def fork_session(
        self, session_id: str, *, timeout: Optional[float] = None
    ) -> pb.ForkSessionResponse:
        """See :meth:`verifyd.Client.fork_session` (never retried)."""
        return await self._invoke(
            "ForkSession",
            self._stub.ForkSession,
            pb.ForkSessionRequest(session_id=session_id),
            timeout=timeout,
            retry=c.NO_RETRY,
        )

    def verify_stream(
        self, *, timeout: Optional[float] = None, retry: Optional[RetryPolicy] = None
    ) -> "AsyncVerifyStream":
        """See :meth:`verifyd.Client.verify_stream`."""
        return AsyncVerifyStream(self, timeout=timeout, retry=retry)

    async def session(
        self,
        prompt_tokens: Sequence[int],
        *,
        prefix: "Optional[AsyncSession | str]" = None,
        sampling: Any = None,
        top_logprobs: Optional[int] = None,
        hidden_states: Any = None,
        timeout: Optional[float] = None,
        **fields: Any,
    ) -> "AsyncSession":
        """See :meth:`verifyd.Client.session`."""
        prefix_id, prefix_tokens = c.known_prefix(prefix)
        resp = await self.open_session(
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
        return AsyncSession(self, state, resp)

    async def verify_sessions(
        self,
        sessions: Sequence["AsyncSession"],
        drafts: Sequence[TreeLike],
        *,
        item_fields: Optional[Sequence[Mapping[str, Any]]] = None,
        timeout: Optional[float] = None,
        retry: Optional[RetryPolicy] = None,
    ) -> List[pb.VerifyResult]:
        """See :meth:`verifyd.Client.verify_sessions`."""
        req = _sessions_request(sessions, drafts, item_fields)
        results = await self.verify(req, timeout=timeout, retry=retry)
        for s, r in zip(sessions, results):
            s._state.apply(r)
            s.last_result = r
        return results


class AsyncSession:
    """The asyncio counterpart of :class:`verifyd.Session`."""

    def __init__(self, client: AsyncClient, state: c.SessionState, opened: Any) -> None:
        self.client = client
        self._state = state
        self.opened = opened
        self.last_result: Optional[pb.VerifyResult] = None

    @property
    def session_id(self) -> str:
        return self._state.session_id

    @property
    def next_token(self) -> int:
        return self._state.next_token

    @property
    def committed_len(self) -> int:
        return self._state.committed_len

    @property
    def history(self) -> List[int]:
        return list(self._state.history)

    async def verify(
        self,
        draft: TreeLike = None,
        *,
        request_id: Optional[str] = None,
        timeout: Optional[float] = None,
        retry: Optional[RetryPolicy] = None,
        **fields: Any,
    ) -> pb.VerifyResult:
        """See :meth:`verifyd.Session.verify`."""
        it = self._state.item(draft, request_id, fields)
        r = (await self.client.verify([it], timeout=timeout, retry=retry))[0]
        self._state.apply(r)
        self.last_result = r
        return r

    async def truncate(
        self, committed_len: int, *, timeout: Optional[float] = None
    ) -> pb.TruncateSessionResponse:
        r = await self.client.truncate_session(self.session_id, committed_len, timeout=timeout)
        self._state.apply_truncate(r.committed_len, r.next_token)
        return r

    async def resync(self, *, timeout: Optional[float] = None) -> None:
        await self.truncate(self.committed_len, timeout=timeout)

    async def fork(self, *, timeout: Optional[float] = None) -> "AsyncSession":
        r = await self.client.fork_session(self.session_id, timeout=timeout)
        return AsyncSession(self.client, self._state.fork_state(r.session_id), r)

    async def close(self, *, timeout: Optional[float] = None) -> None:
        if self._state.closed:
            return
        try:
            await self.client.close_session(self.session_id, timeout=timeout)
        except NotFound:
            pass
        self._state.closed = True

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        return (
            f"AsyncSession({self.session_id!r}, committed_len={self.committed_len}, "
            f"next_token={self.next_token})"
        )


class AsyncVerifyStream:
    """The asyncio counterpart of :class:`verifyd.VerifyStream`."""

    def __init__(
        self,
        client: AsyncClient,
        *,
        timeout: Optional[float] = None,
        retry: Optional[RetryPolicy] = None,
    ) -> None:
        self._client = client
        self._timeout = timeout
        self._retry = retry
        self._call: Any = None
        self.streams_opened = 0

    def _open(self) -> None:
        if self.streams_opened:
            c.log.info(
                "VerifyStream: reconnecting to %s (stream %d)",
                self._client.target,
                self.streams_opened + 1,
            )
        self._call = self._client._stub.VerifyStream(
            timeout=self._timeout,
            metadata=self._client.metadata or None,
            wait_for_ready=self._client.wait_for_ready,
        )
        self.streams_opened += 1

    def _drop(self) -> None:
        if self._call is not None:
            self._call.cancel()
        self._call = None

    async def send(self, request: pb.VerifyRequest) -> pb.VerifyResponse:
        """One request, one response (retried like :meth:`verifyd.VerifyStream.send`)."""
        policy = self._client._retry_for(c.retry_safe(request), self._retry)
        attempt = 0
        while True:
            attempt += 1
            if self._call is None:
                self._open()
            err: Optional[grpc.RpcError] = None
            try:
                await self._call.write(request)
                resp = await self._call.read()
                if resp is not grpc.aio.EOF:
                    return resp
                # The server ended the stream: its status says why.
                code = await self._call.code()
                details = await self._call.details() or "stream ended without a response"
                if code == grpc.StatusCode.OK:
                    code = grpc.StatusCode.UNAVAILABLE
            except grpc.RpcError as e:
                code, details, err = e.code(), e.details() or "", e
            except asyncio.InvalidStateError:  # write after the call finished
                code = await self._call.code()
                details = await self._call.details() or ""
            self._drop()
            if attempt >= policy.max_attempts or code not in policy.retryable_codes:
                c.log_failure("VerifyStream", code, details, attempt)
                if err is not None:
                    raise from_rpc_error(err, method="VerifyStream", attempts=attempt) from err
                raise from_rpc_error(
                    _Status(code, details), method="VerifyStream", attempts=attempt
                )
            delay = policy.backoff_s(attempt, self._client._rng)
            event = RetryEvent("VerifyStream", attempt, code, details, delay)
            c.log_retry(event, policy.max_attempts)
            if self._client.on_retry is not None:
                self._client.on_retry(event)
            await asyncio.sleep(delay)

    async def verify(self, items: Sequence[ItemLike]) -> List[pb.VerifyResult]:
        req = items if isinstance(items, pb.VerifyRequest) else c.verify_request(items)
        return list((await self.send(req)).results)

    async def verify_sessions(
        self,
        sessions: Sequence[AsyncSession],
        drafts: Sequence[TreeLike],
        *,
        item_fields: Optional[Sequence[Mapping[str, Any]]] = None,
    ) -> List[pb.VerifyResult]:
        results = list((await self.send(_sessions_request(sessions, drafts, item_fields))).results)
        for s, r in zip(sessions, results):
            s._state.apply(r)
            s.last_result = r
        return results

    async def close(self) -> None:
        """Half-closes the stream and waits for the server to end it."""
        if self._call is None:
            return
        call, self._call = self._call, None
        await call.done_writing()
        code = await call.code()
        if code not in (grpc.StatusCode.OK, grpc.StatusCode.CANCELLED):
            raise from_rpc_error(_Status(code, await call.details() or ""), method="VerifyStream")

    async def __aenter__(self) -> "AsyncVerifyStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if exc and exc[0] is not None:
            self._drop()
        else:
            await self.close()


class _Status:
    """A (code, details) pair shaped like an RpcError for from_rpc_error."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details
