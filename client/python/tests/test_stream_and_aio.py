"""VerifyStream (sync and asyncio) and the asyncio client."""

from __future__ import annotations

import asyncio

import pytest

import verifyd
from conftest import PROMPT


def test_stream_is_lossless_and_batches_sessions(client: verifyd.Client, reference) -> None:
    prompts = [PROMPT, [3, 1, 4, 1, 5, 9, 2, 6]]
    drafter = verifyd.NgramDrafter(depth=3, branches=2)
    sessions = [client.session(p) for p in prompts]
    try:
        with client.verify_stream() as stream:
            for _ in range(25):
                stream.verify_sessions(sessions, [drafter.draft(s.history) for s in sessions])
            # raw items on the same stream
            (r,) = stream.verify([verifyd.item(sessions[0].session_id)])
            assert r.committed_len == sessions[0].committed_len + 1
            sessions[0].resync()
            assert stream.streams_opened == 1
        for p, s in zip(prompts, sessions):
            got = s.history[len(p) :]
            assert len(got) > 25 and got == reference(p, len(got))
    finally:
        for s in sessions:
            s.close()


def test_stream_error_ends_the_stream_and_the_next_call_reopens_it(
    client: verifyd.Client,
) -> None:
    with client.session(PROMPT) as s, client.verify_stream() as stream:
        with pytest.raises(verifyd.NotFound):
            stream.verify([verifyd.item("no-such-session")])
        with pytest.raises(verifyd.InvalidArgument):
            stream.verify([verifyd.item(s.session_id, ([1, 2], [-1, 7]))])
        stream.verify_sessions([s], [None])
        assert stream.streams_opened == 3
        assert s.committed_len == len(PROMPT) + 1


def test_asyncio_client(server, reference) -> None:
    n = 60
    ref = reference(PROMPT, n)

    async def main() -> None:
        async with verifyd.AsyncClient(server.target) as c:
            await c.wait_until_serving(5)
            assert await c.health() == "SERVING"
            info = await c.get_info()
            assert info.model.name == "tiny"
            # raw RPCs
            opened = await c.open_session(PROMPT)
            r = await c.verify_one(opened.session_id, (ref[1:3], None), request_id="a")
            assert list(r.accepted_tokens) == ref[1:3]
            t = await c.truncate_session(opened.session_id, len(PROMPT) + 1)
            assert t.next_token == ref[1]
            f = await c.fork_session(opened.session_id)
            assert f.next_token == ref[1]
            for sid in (opened.session_id, f.session_id):
                await c.close_session(sid)
            with pytest.raises(verifyd.NotFound):
                await c.verify_one(opened.session_id)
            with pytest.raises(verifyd.InvalidArgument):
                await c.open_session([])
            # sessions: n-gram speculation, several sessions concurrently, is lossless
            drafter = verifyd.NgramDrafter()

            async def run() -> list:
                async with await c.session(PROMPT) as s:
                    while len(s.history) - len(PROMPT) < n:
                        await s.verify(drafter.draft(s.history))
                    return s.history[len(PROMPT) :][:n]

            outs = await asyncio.gather(*(run() for _ in range(4)))
            assert all(o == ref for o in outs)
            # batched sessions and the stream
            a, b = await c.session(PROMPT), await c.session(PROMPT[:5])
            await c.verify_sessions([a, b], [None, ([1], None)])
            async with c.verify_stream() as stream:
                for _ in range(10):
                    await stream.verify_sessions([a, b], [drafter.draft(a.history), None])
                with pytest.raises(verifyd.NotFound):
                    await stream.verify([verifyd.item("no-such-session")])
                await stream.verify_sessions([a], [None])
                assert stream.streams_opened == 2
            assert a.history[len(PROMPT) :] == ref[: len(a.history) - len(PROMPT)]
            assert b.history[5:] == reference(PROMPT[:5], len(b.history) - 5)
            fa = await a.fork()
            await fa.verify()
            assert fa.history == a.history + [ref[len(a.history) - len(PROMPT)]]
            for s in (a, b, fa):
                await s.close()

    asyncio.run(main())
