"""The asyncio verifyd client (grpc.aio): the same methods as :mod:`verifyd.client`, as
coroutines.

Use it from one event loop: create the :class:`AsyncClient` inside the loop that uses it.
An :class:`AsyncSession` or :class:`AsyncVerifyStream` is for one task at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, List, Mapping, Optional, Sequence

import grpc
import grpc.aio

from . import _base
from . import _common as c
from ._common import ItemLike, RetryPolicy, TreeLike
from ._proto import verify_pb2 as pb
from .errors import NotFound, VerifydError, from_rpc_error

__all__ = ["AsyncClient", "AsyncSession", "AsyncVerifyStream"]


class AsyncClient(_base.ClientBase[grpc.aio.Channel]):
    """The asyncio counterpart of :class:`verifyd.Client` (same arguments; ``interceptors``
    are grpc.aio client interceptors)."""

    def _channel(
        self,
        given: Optional[grpc.aio.Channel],
        cfg: c.ChannelConfig,
        interceptors: Sequence[Any],
    ) -> grpc.aio.Channel:
        if given is not None:
            if interceptors:
                raise ValueError("grpc.aio channels take their interceptors when created")
            return given
        return cfg.make_channel(
            grpc.aio.secure_channel,
            grpc.aio.insecure_channel,
            interceptors=list(interceptors) or None,
        )

    async def close(self) -> None:
        """Closes the channel (when the client created it)."""
        if self._owns_channel:
            await self.channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def _invoke(self, call: _base.Call) -> Any:
        """The retry loop of :meth:`verifyd.Client._invoke`, awaiting."""
        attempts = self._attempts(call)
        while True:
            try:
                return await call.fn(call.request, **attempts.options())
            except grpc.RpcError as e:
                pause = attempts.failed(e)
            if pause is None:
                assert call.on_retry_not_found is not None
                return call.on_retry_not_found()
            await asyncio.sleep(pause)

    async def _call(self, call: _base.Call) -> Any:
        return call.result(await self._invoke(call))

    async def get_info(
        self, *, timeout: Optional[float] = None, retry: Optional[RetryPolicy] = None
    ) -> pb.GetInfoResponse:
        """See :meth:`verifyd.Client.get_info`."""
        return await self._call(self._get_info_call(timeout, retry))

    async def health(self, service: str = "", *, timeout: Optional[float] = None) -> str:
        """See :meth:`verifyd.Client.health`."""
        return await self._call(self._health_call(service, timeout))

    async def wait_until_serving(self, timeout: float = 30.0, interval: float = 0.05) -> None:
        """See :meth:`verifyd.Client.wait_until_serving`."""
        wait = _base.ServingWait(self.target, timeout)
        while wait.pending():
            try:
                if await self.health(timeout=wait.probe_timeout()) == "SERVING":
                    return
                wait.last = None
            except VerifydError as e:
                wait.last = e
            await asyncio.sleep(interval)
        wait.give_up()

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
        return await self._call(
            self._open_session_call(
                prompt_tokens,
                prefix_session_id,
                sampling,
                top_logprobs,
                hidden_states,
                timeout,
                fields,
            )
        )

    async def verify(
        self,
        items: Sequence[ItemLike],
        *,
        timeout: Optional[float] = None,
        retry: Optional[RetryPolicy] = None,
    ) -> List[pb.VerifyResult]:
        """See :meth:`verifyd.Client.verify` (retried only when every item has a request_id)."""
        return await self._call(self._verify_call(items, timeout, retry))

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
        it = _base.one_item(session_id, draft, request_id, expected_committed_len, fields)
        return (await self.verify([it], timeout=timeout, retry=retry))[0]

    async def close_session(
        self,
        session_id: str,
        *,
        timeout: Optional[float] = None,
        retry: Optional[RetryPolicy] = None,
    ) -> None:
        """See :meth:`verifyd.Client.close_session`."""
        await self._call(self._close_session_call(session_id, timeout, retry))

    async def truncate_session(
        self,
        session_id: str,
        committed_len: int,
        *,
        timeout: Optional[float] = None,
        retry: Optional[RetryPolicy] = None,
    ) -> pb.TruncateSessionResponse:
        """See :meth:`verifyd.Client.truncate_session`."""
        call = self._truncate_session_call(session_id, committed_len, timeout, retry)
        return await self._call(call)

    async def fork_session(
        self, session_id: str, *, timeout: Optional[float] = None
    ) -> pb.ForkSessionResponse:
        """See :meth:`verifyd.Client.fork_session` (never retried)."""
        return await self._call(self._fork_session_call(session_id, timeout))

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
        prefix_id, known = c.known_prefix(prefix)
        opts = dict(sampling=sampling, top_logprobs=top_logprobs, hidden_states=hidden_states)
        resp = await self.open_session(
            prompt_tokens, prefix_session_id=prefix_id, timeout=timeout, **opts, **fields
        )
        return AsyncSession(self, self._session_state(known, prompt_tokens, resp), resp)

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
        req = _base.sessions_request(sessions, drafts, item_fields)
        return _base.record_all(sessions, await self.verify(req, timeout=timeout, retry=retry))


class AsyncSession(_base.SessionBase[AsyncClient]):
    """The asyncio counterpart of :class:`verifyd.Session`."""

    _kind = "AsyncSession"

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
        return self._record((await self.client.verify([it], timeout=timeout, retry=retry))[0])

    async def truncate(
        self, committed_len: int, *, timeout: Optional[float] = None
    ) -> pb.TruncateSessionResponse:
        r = await self.client.truncate_session(self.session_id, committed_len, timeout=timeout)
        return self._truncated(r)

    async def resync(self, *, timeout: Optional[float] = None) -> None:
        await self.truncate(self.committed_len, timeout=timeout)

    async def fork(self, *, timeout: Optional[float] = None) -> "AsyncSession":
        r = await self.client.fork_session(self.session_id, timeout=timeout)
        return AsyncSession(self.client, self._state.fork_state(r.session_id), r)

    async def close(self, *, timeout: Optional[float] = None) -> None:
        if not self._state.closed:
            with contextlib.suppress(NotFound):
                await self.client.close_session(self.session_id, timeout=timeout)
            self._state.closed = True

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncVerifyStream(_base.StreamBase[AsyncClient]):
    """The asyncio counterpart of :class:`verifyd.VerifyStream`."""

    def _open(self) -> None:
        self._call = self._client._stub.VerifyStream(**self._stream_options())
        self.streams_opened += 1

    def _drop(self) -> None:
        if self._call is not None:
            self._call.cancel()
        self._call = None

    async def send(self, request: pb.VerifyRequest) -> pb.VerifyResponse:
        """One request, one response (retried like :meth:`verifyd.VerifyStream.send`)."""
        attempts = self._attempts(request)
        while True:
            attempts.start()
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
            await asyncio.sleep(attempts.failed(code, details, err))

    async def verify(self, items: Sequence[ItemLike]) -> List[pb.VerifyResult]:
        return list((await self.send(_base.as_verify_request(items))).results)

    async def verify_sessions(
        self,
        sessions: Sequence[AsyncSession],
        drafts: Sequence[TreeLike],
        *,
        item_fields: Optional[Sequence[Mapping[str, Any]]] = None,
    ) -> List[pb.VerifyResult]:
        req = _base.sessions_request(sessions, drafts, item_fields)
        return _base.record_all(sessions, list((await self.send(req)).results))

    async def close(self) -> None:
        """Half-closes the stream and waits for the server to end it."""
        if self._call is None:
            return
        call, self._call = self._call, None
        await call.done_writing()
        code = await call.code()
        if code not in (grpc.StatusCode.OK, grpc.StatusCode.CANCELLED):
            details = await call.details() or ""
            raise from_rpc_error(_base.Status(code, details), method="VerifyStream")

    async def __aenter__(self) -> "AsyncVerifyStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if exc and exc[0] is not None:
            self._drop()
        else:
            await self.close()
