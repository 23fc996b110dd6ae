"""The sync client against a live CPU verifyd: every RPC, sessions, batching, losslessness."""

from __future__ import annotations

import random

import pytest

import verifyd
from conftest import PROMPT


def test_info_and_health(client: verifyd.Client) -> None:
    assert client.health() == "SERVING"
    info = client.get_info()
    assert info.model.name == "tiny"
    assert info.backend == "cpu"
    assert info.tp_size == 1
    assert info.model.vocab_size > 0
    assert info.limits.max_draft_nodes > 0
    assert info.limits.max_prompt_tokens == info.limits.max_context - 1
    assert info.exact_lossless  # the CPU backend is batch-invariant
    assert info.kv_cache_dtype == "float32"
    # GetInfoResponse.memory is a CUDA server's: unset on the CPU backend, zeros when read.
    assert not info.HasField("memory")
    assert info.memory.device_bytes == 0 and info.memory.kv_tokens == 0


def test_open_verify_close(client: verifyd.Client) -> None:
    opened = client.open_session(PROMPT)
    assert opened.session_id
    assert opened.committed_len == len(PROMPT)
    r = client.verify_one(opened.session_id)  # empty tree: one plain decode step
    assert list(r.accepted_nodes) == [] and list(r.accepted_tokens) == []
    assert r.session_id == opened.session_id
    assert r.committed_len == len(PROMPT) + 1
    client.close_session(opened.session_id)
    with pytest.raises(verifyd.NotFound):
        client.verify_one(opened.session_id)


def test_verify_accepts_the_greedy_path(client: verifyd.Client, reference) -> None:
    ref = reference(PROMPT, 8)
    with client.session(PROMPT) as s:
        assert s.next_token == ref[0]
        # A chain of the next three greedy tokens with a wrong sibling first: all accepted.
        wrong = (ref[1] + 1) % client.get_info().model.vocab_size
        r = s.verify(([wrong, ref[1], ref[2], ref[3]], [-1, -1, 1, 2]))
        assert list(r.accepted_nodes) == [1, 2, 3]
        assert list(r.accepted_tokens) == ref[1:4]
        assert r.bonus_token == ref[4]
        assert s.history == PROMPT + ref[:5]
        assert s.committed_len == len(PROMPT) + 4


def test_random_trees_accept_exactly_the_matching_prefix(client: verifyd.Client, reference) -> None:
    """Trees that hold the greedy continuation up to a chosen depth among random siblings:
    the server accepts exactly that depth and the bonus is the next greedy token."""
    vocab = client.get_info().model.vocab_size
    rng = random.Random(1234)
    n = 60
    ref = reference(PROMPT, n + 10)
    with client.session(PROMPT) as s:
        while len(s.history) - len(PROMPT) < n:
            pos = len(s.history) - len(PROMPT) - 1  # index in ref of the pending token
            depth = rng.randint(0, 5)
            tokens, parents = [], []
            parent = -1
            for d in range(depth + 1):
                # random wrong siblings, then (while d < depth) the right token
                for _ in range(rng.randint(0, 2)):
                    t = rng.randrange(vocab)
                    if t != ref[pos + 1 + d]:
                        tokens.append(t)
                        parents.append(parent)
                if d < depth:
                    tokens.append(ref[pos + 1 + d])
                    parents.append(parent)
                    parent = len(tokens) - 1
            r = s.verify((tokens, parents))
            assert list(r.accepted_tokens) == ref[pos + 1 : pos + 1 + depth]
            assert r.bonus_token == ref[pos + 1 + depth]
        assert s.history[len(PROMPT) :] == ref[: len(s.history) - len(PROMPT)]


def test_ngram_speculation_is_lossless(client: verifyd.Client, reference) -> None:
    n = 120
    ref = reference(PROMPT, n)
    drafter = verifyd.NgramDrafter(max_ngram=3, depth=4, branches=3)
    drafted = accepted = 0
    with client.session(PROMPT) as s:
        while len(s.history) - len(PROMPT) < n:
            tokens, parents = drafter.draft(s.history)
            r = s.verify((tokens, parents))
            drafted += len(tokens)
            accepted += len(r.accepted_tokens)
        out = s.history[len(PROMPT) :][:n]
    assert out == ref
    assert drafted > 0 and accepted > 0, "the n-gram drafter never hit: the test proves nothing"


def test_batched_verify_of_several_sessions(client: verifyd.Client, reference) -> None:
    prompts = [PROMPT, PROMPT[::-1], [5, 6, 7]]
    sessions = [client.session(p) for p in prompts]
    try:
        drafter = verifyd.NgramDrafter()
        for _ in range(20):
            results = client.verify_sessions(sessions, [drafter.draft(s.history) for s in sessions])
            assert [r.session_id for r in results] == [s.session_id for s in sessions]
        for p, s in zip(prompts, sessions):
            got = s.history[len(p) :]
            assert got == reference(p, len(got))
    finally:
        for s in sessions:
            s.close()


def test_raw_batched_items_and_dict_items(client: verifyd.Client) -> None:
    a = client.open_session([1, 2, 3])
    b = client.open_session([4, 5, 6])
    try:
        results = client.verify(
            [
                verifyd.item(a.session_id, ([7], [-1])),
                {"session_id": b.session_id, "tokens": [8, 9]},  # parents default: a chain
            ]
        )
        assert [r.session_id for r in results] == [a.session_id, b.session_id]
        assert results[0].committed_len == 4 + len(results[0].accepted_tokens)
    finally:
        client.close_session(a.session_id)
        client.close_session(b.session_id)


def test_truncate_and_fork(client: verifyd.Client, reference) -> None:
    ref = reference(PROMPT, 12)
    with client.session(PROMPT) as s:
        for _ in range(6):
            s.verify()
        assert s.history == PROMPT + ref[:7]
        r = s.truncate(len(PROMPT) + 2)
        assert r.next_token == ref[2]
        assert s.next_token == ref[2] and s.committed_len == len(PROMPT) + 2
        assert s.history == PROMPT + ref[:3]
        with s.fork() as f:
            assert f.session_id != s.session_id
            assert f.next_token == s.next_token and f.committed_len == s.committed_len
            f.verify()
            s.verify()
            assert f.history == s.history == PROMPT + ref[:4]
        # resync after a verify whose outcome is unknown: the server follows the client
        s.resync()
        assert s.verify().bonus_token == ref[4]


def test_open_on_a_prefix_session(client: verifyd.Client, reference) -> None:
    with client.session(PROMPT[:4]) as base:
        with client.session(PROMPT[4:], prefix=base) as s:
            assert s.committed_len == len(PROMPT)
            assert s.history == PROMPT + [reference(PROMPT, 1)[0]]
            s.verify()
            assert s.history[len(PROMPT) :] == reference(PROMPT, 2)
        with client.session(PROMPT[4:], prefix=base.session_id) as s:  # by id: prefix unknown
            assert s.committed_len == len(PROMPT)
            assert s.history == PROMPT[4:] + [reference(PROMPT, 1)[0]]
            # the new pending token is the one that followed in the history: a prompt token
            assert s.truncate(2).next_token == PROMPT[2]
            assert s.history == [PROMPT[2]] and s.committed_len == 2


def test_new_proto_fields_pass_through_or_are_refused_cleanly(client: verifyd.Client) -> None:
    """Convenience arguments exist for fields being added to verify.proto: with stubs that
    have the field the request carries it; without, UnsupportedField (a TypeError)."""
    pb = verifyd.pb
    cases = {
        "sampling": {"temperature": 0.0},
        "top_logprobs": 0,
        "hidden_states": [0],
    }
    for name, value in cases.items():
        if verifyd.has_field(pb.OpenSessionRequest, name):
            opened = client.open_session(PROMPT, **{name: value})
            client.close_session(opened.session_id)
        else:
            with pytest.raises(verifyd.UnsupportedField):
                client.open_session(PROMPT, **{name: value})
    with pytest.raises(verifyd.UnsupportedField):
        client.open_session(PROMPT, no_such_field=1)
    with pytest.raises(verifyd.UnsupportedField):
        verifyd.item("s", None, no_such_field=[0.5])
