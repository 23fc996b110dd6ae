"""Pieces that need no server: retry policy, request builders, n-gram drafter, hidden-state
decoding, health wire format, session bookkeeping, the asyncio classes' API against the sync
ones."""

from __future__ import annotations

import inspect
import random
import struct
from types import SimpleNamespace

import grpc
import pytest

import verifyd
from verifyd import _common


def test_backoff_is_capped_exponential_with_full_jitter() -> None:
    p = verifyd.RetryPolicy(initial_backoff_s=0.1, max_backoff_s=0.5, backoff_multiplier=2)
    rng = random.Random(7)
    for failures, cap in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.5), (10, 0.5)]:
        draws = [p.backoff_s(failures, rng) for _ in range(200)]
        assert all(0 <= d <= cap for d in draws)
        assert max(draws) > 0.8 * cap and min(draws) < 0.2 * cap  # spread over [0, cap]
    with pytest.raises(ValueError):
        verifyd.RetryPolicy(max_attempts=0)
    assert verifyd.NO_RETRY.max_attempts == 1


def test_tree_and_item_builders() -> None:
    t = verifyd.tree([5, 6, 7])
    assert list(t.parents) == [-1, 0, 1]
    it = verifyd.item("s", ([1, 2], [-1, -1]), request_id="r", expected_committed_len=4)
    assert it.session_id == "s" and list(it.tree.tokens) == [1, 2]
    assert it.request_id == "r" and it.HasField("expected_committed_len")
    assert not verifyd.item("s").HasField("expected_committed_len")
    assert _common.as_item({"session_id": "s", "tree": {"tokens": [3]}}).tree.parents == [-1]
    req = _common.verify_request([verifyd.item("a", request_id="1"), verifyd.item("b")])
    assert not _common.retry_safe(req)
    req.items[1].request_id = "2"
    assert _common.retry_safe(req)


def test_optional_fields_set_by_name() -> None:
    pb = verifyd.pb
    if not verifyd.has_field(pb.OpenSessionRequest, "hidden_states"):
        pytest.skip("these stubs predate the hidden_states field")
    req = _common.open_request(
        [1, 2],
        None,
        {"temperature": 0.7, "top_p": 0.9, "seed": 3},
        5,
        {"layers": [0, 1], "dtype": "HIDDEN_DTYPE_FP32"},
        {},
    )
    assert req.sampling.temperature == pytest.approx(0.7) and req.sampling.seed == 3
    assert req.top_logprobs == 5 and req.HasField("top_logprobs")
    assert list(req.hidden_states.layers) == [0, 1]
    assert req.hidden_states.dtype == pb.HIDDEN_DTYPE_FP32
    assert list(_common.open_request([1], None, None, None, [2], {}).hidden_states.layers) == [2]
    if verifyd.has_field(pb.VerifyItem, "draft_probs"):
        it = verifyd.item("s", ([1], [-1]), draft_probs=[0.25])
        assert list(it.draft_probs) == [0.25]


def test_ngram_drafter() -> None:
    d = verifyd.NgramDrafter(max_ngram=2, depth=3, branches=2)
    # "1 2" occurred twice before, followed by 3 4 5 and by 3 9 (latest first): one tree
    tokens, parents = d.draft([1, 2, 3, 9, 7, 1, 2, 3, 4, 5, 1, 2])
    assert tokens == [3, 4, 5, 9, 7] and parents == [-1, 0, 1, 0, 3]
    assert d.draft([1, 2, 3]) == ([], [])
    assert d.draft([]) == ([], [])
    # falls back to a shorter suffix
    assert verifyd.NgramDrafter(max_ngram=3, depth=2).draft([7, 8, 5, 9, 8]) == ([5, 9], [-1, 0])


def _bf16(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0] >> 16


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_hidden_states_decoding(dtype: str) -> None:
    tokens, layers, hidden = 2, 3, 4
    values = [
        float(t * 100 + ly * 10 + h) - 50.5
        for t in range(tokens)
        for ly in range(layers)
        for h in range(hidden)
    ]
    if dtype == "fp32":
        data, code = struct.pack(f"<{len(values)}f", *values), 1
    else:  # values exactly representable in bf16? -50.5 .. 183.5 need 8 bits of mantissa
        data, code = struct.pack(f"<{len(values)}H", *(_bf16(v) for v in values)), 0
    hs = SimpleNamespace(
        layers=[0, 5, 9], hidden_size=hidden, num_tokens=tokens, dtype=code, data=data
    )
    assert verifyd.hidden_states_dtype(hs) == dtype
    assert verifyd.hidden_states_shape(hs) == (tokens, layers, hidden)
    nested = verifyd.hidden_states_to_lists(hs)
    row = layers * hidden
    expect = [
        [values[t * row + i * hidden : t * row + (i + 1) * hidden] for i in range(layers)]
        for t in range(tokens)
    ]
    if dtype == "fp32":
        assert nested == expect
    else:
        flat_got = [v for row in nested for layer in row for v in layer]
        assert all(abs(a - b) <= abs(b) / 128 for a, b in zip(flat_got, values))
    np = pytest.importorskip("numpy")
    arr = verifyd.hidden_states_to_numpy(hs)
    assert arr.shape == (tokens, layers, hidden) and arr.dtype == np.float32
    assert arr.tolist() == nested
    hs.data = data[:-2]
    with pytest.raises(ValueError):
        verifyd.hidden_states_shape(hs)


def test_health_messages_are_grpc_health_v1_on_the_wire() -> None:
    from verifyd._proto import health_pb2

    assert _common.health_request("").SerializeToString() == b""
    assert _common.health_request("verify.v1.VerifyService").SerializeToString()[:2] == b"\x0a\x17"
    parse = health_pb2.HealthCheckResponse.FromString
    assert _common.health_status(parse(b"\x08\x01")) == "SERVING"
    assert _common.health_status(parse(b"\x08\x02")) == "NOT_SERVING"
    assert _common.health_status(parse(b"")) == "UNKNOWN"
    assert _common.health_status(parse(b"\x12\x01x\x08\x01")) == "SERVING"  # skips unknown
    assert _common.health_status(parse(b"\x08\x09")) == "UNKNOWN"  # a status added later


def test_session_state_bookkeeping() -> None:
    st = _common.SessionState("s", [1, 2, 3, 9], committed_len=3)
    a = st.item(None, None, {})
    b = st.item(None, None, {})
    assert a.request_id != b.request_id and len(a.request_id) <= 128
    assert a.expected_committed_len == 3
    r = verifyd.pb.VerifyResult(accepted_tokens=[4, 5], bonus_token=6, committed_len=6)
    assert st.apply(r) == [4, 5, 6]
    assert st.history == [1, 2, 3, 9, 4, 5, 6] and st.next_token == 6
    with pytest.raises(RuntimeError):
        st.apply(verifyd.pb.VerifyResult(bonus_token=1, committed_len=99))
    st.apply_truncate(2, 3)
    assert st.history == [1, 2, 3] and st.committed_len == 2
    fork = st.fork_state("f")
    assert fork.history == st.history and fork.session_id == "f"


def test_errors_carry_code_details_and_attempts() -> None:
    class Fake(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.RESOURCE_EXHAUSTED

        def details(self):
            return "queue full"

    e = verifyd.from_rpc_error(Fake(), method="Verify", attempts=3)
    assert isinstance(e, verifyd.ResourceExhausted)
    assert e.code == grpc.StatusCode.RESOURCE_EXHAUSTED and e.details == "queue full"
    assert "Verify" in str(e) and "3 attempts" in str(e)


def _torch():
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed: hidden_states_to_torch is untested in this run")
    return torch


def test_hidden_states_to_torch_keeps_bf16_bits() -> None:
    torch = _torch()
    # 2 tokens x 2 layers x 3: ordinary values, -0, inf, a NaN with a payload, a subnormal
    bits = [0x3F80, 0xC2F7, 0x8000, 0x7F80, 0x7FC1, 0x0001, 0x4049, 0xBF00, 0x1234, 0, 1, 2]
    data = struct.pack(f"<{len(bits)}H", *bits)
    hs = SimpleNamespace(layers=[1, 3], hidden_size=3, num_tokens=2, dtype=0, data=data)
    t = verifyd.hidden_states_to_torch(hs)
    assert t.dtype == torch.bfloat16 and tuple(t.shape) == (2, 2, 3)
    assert t.reshape(-1).view(torch.int16).tolist() == list(struct.unpack("<12h", data))
    assert t[0, 0, 0].item() == 1.0 and t[1, 0, 0].item() == 3.140625
    assert verifyd.hidden_states_to_torch(hs, device="cpu").device.type == "cpu"
    if torch.cuda.is_available():
        on_gpu = verifyd.hidden_states_to_torch(hs, device="cuda")
        assert on_gpu.device.type == "cuda" and torch.equal(
            on_gpu.cpu().view(torch.int16), t.view(torch.int16)
        )
    empty = SimpleNamespace(layers=[1, 3], hidden_size=3, num_tokens=0, dtype=0, data=b"")
    assert tuple(verifyd.hidden_states_to_torch(empty).shape) == (0, 2, 3)


def test_hidden_states_to_torch_fp32() -> None:
    torch = _torch()
    values = [0.5, -1.25, 2.0**100, 7.0]
    hs = SimpleNamespace(
        layers=[0], hidden_size=2, num_tokens=2, dtype=1, data=struct.pack("<4f", *values)
    )
    t = verifyd.hidden_states_to_torch(hs)
    assert t.dtype == torch.float32 and tuple(t.shape) == (2, 1, 2)
    assert t.reshape(-1).tolist() == values
    hs.data = hs.data[:-4]
    with pytest.raises(ValueError):
        verifyd.hidden_states_to_torch(hs)


@pytest.mark.parametrize(
    "sync_cls, async_cls",
    [
        (verifyd.Client, verifyd.AsyncClient),
        (verifyd.Session, verifyd.AsyncSession),
        (verifyd.VerifyStream, verifyd.AsyncVerifyStream),
    ],
)
def test_asyncio_classes_mirror_the_sync_ones(sync_cls, async_cls) -> None:
    """Every public method of a sync class exists on its asyncio counterpart with the same
    parameters (names, kinds, defaults), as a coroutine where it calls the server."""
    names = [n for n in dir(sync_cls) if not n.startswith("_")] + ["__init__"]
    for name in names:
        sync_attr, async_attr = getattr(sync_cls, name), getattr(async_cls, name, None)
        assert async_attr is not None, f"{async_cls.__name__}.{name} is missing"
        if isinstance(inspect.getattr_static(sync_cls, name), property):
            assert isinstance(inspect.getattr_static(async_cls, name), property), name
            continue
        params = [
            (p.name, p.kind, p.default) for p in inspect.signature(sync_attr).parameters.values()
        ]
        async_params = [
            (p.name, p.kind, p.default) for p in inspect.signature(async_attr).parameters.values()
        ]
        assert async_params == params, f"{async_cls.__name__}.{name}"
        blocking = name not in ("__init__", "verify_stream")
        assert inspect.iscoroutinefunction(async_attr) == blocking, name
