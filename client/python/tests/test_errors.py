"""Status codes map to their exception classes; client-side refusals."""

from __future__ import annotations

import socket

import grpc
import pytest

import verifyd
from conftest import PROMPT


def test_one_class_per_status_code() -> None:
    codes = [c for c in grpc.StatusCode if c != grpc.StatusCode.OK]
    classes = {verifyd.error_class(c) for c in codes}
    assert len(classes) == len(codes)
    for code in codes:
        cls = verifyd.error_class(code)
        assert issubclass(cls, verifyd.VerifydError) and cls is not verifyd.VerifydError
        assert cls.code == code
        assert cls.__name__.lower() == code.name.replace("_", "").lower()


def test_unknown_session_is_not_found(client: verifyd.Client) -> None:
    with pytest.raises(verifyd.NotFound) as e:
        client.verify_one("no-such-session", ([1], [-1]))
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    assert "items[0].session_id" in e.value.details
    assert isinstance(e.value.__cause__, grpc.RpcError)
    for call in (
        lambda: client.close_session("no-such-session"),
        lambda: client.truncate_session("no-such-session", 1),
        lambda: client.fork_session("no-such-session"),
        lambda: client.open_session([1], prefix_session_id="no-such-session"),
    ):
        with pytest.raises(verifyd.NotFound):
            call()


@pytest.mark.parametrize(
    "tree, field",
    [
        (([1, 2], [-1, 5]), "items[0].tree.parents[1]"),  # parent after the node
        (([1, 2], [-1]), "items[0].tree"),  # lengths differ
        (([1 << 20], [-1]), "items[0].tree.tokens[0]"),  # outside the vocabulary
    ],
)
def test_bad_tree_is_invalid_argument(client: verifyd.Client, tree, field) -> None:
    with client.session(PROMPT) as s:
        with pytest.raises(verifyd.InvalidArgument) as e:
            client.verify_one(s.session_id, verifyd.pb.DraftTree(tokens=tree[0], parents=tree[1]))
        assert field in e.value.details
        assert e.value.attempts == 1
        assert client.verify_one(s.session_id).committed_len == len(PROMPT) + 1  # unchanged


def test_other_invalid_requests(client: verifyd.Client) -> None:
    with pytest.raises(verifyd.InvalidArgument):
        client.open_session([])
    with pytest.raises(verifyd.InvalidArgument):
        client.verify([])
    with client.session(PROMPT) as s:
        with pytest.raises(verifyd.InvalidArgument):
            client.truncate_session(s.session_id, s.committed_len + 1)
        with pytest.raises(verifyd.InvalidArgument):
            client.verify_one(s.session_id, request_id="x" * 129)
        # the same request_id with another tree is a client error, not a retry
        client.verify_one(s.session_id, ([1], [-1]), request_id="r1")
        with pytest.raises(verifyd.InvalidArgument) as e:
            client.verify_one(s.session_id, ([2], [-1]), request_id="r1")
        assert "request_id" in e.value.details


def test_wrong_expected_committed_len_is_aborted(client: verifyd.Client) -> None:
    with client.session(PROMPT) as s:
        with pytest.raises(verifyd.Aborted) as e:
            client.verify_one(s.session_id, expected_committed_len=s.committed_len + 3)
        assert "nothing was applied" in e.value.details
        assert s.verify().committed_len == len(PROMPT) + 1


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_server_is_unavailable_after_retries() -> None:
    events = []
    policy = verifyd.RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02)
    with verifyd.Client(
        f"127.0.0.1:{_closed_port()}", timeout=2, retry=policy, on_retry=events.append
    ) as c:
        with pytest.raises(verifyd.Unavailable) as e:
            c.get_info()
        assert e.value.attempts == 3
        assert [ev.attempt for ev in events] == [1, 2]
        assert all(ev.code == grpc.StatusCode.UNAVAILABLE for ev in events)
        assert all(0 <= ev.backoff_s <= 0.02 for ev in events)
        events.clear()
        # never retried: a lost answer would leak a session
        with pytest.raises(verifyd.Unavailable) as e:
            c.open_session(PROMPT)
        assert e.value.attempts == 1 and events == []
        with pytest.raises(verifyd.Unavailable):
            c.fork_session("s")
        # a Verify without request_id is not retried either
        with pytest.raises(verifyd.Unavailable) as e:
            c.verify_one("s")
        assert e.value.attempts == 1 and events == []


def test_tls_options_are_checked() -> None:
    with pytest.raises(ValueError, match="TLS"):
        verifyd.Client("127.0.0.1:1", tls=False, token="0123456789abcdef")
    with pytest.raises(ValueError, match="together"):
        verifyd.Client("127.0.0.1:1", root_certificates=b"x", client_certificate=b"y")
