"""Fields that drafting frontends read (hidden states, logprobs, session stats, sampling)
pass through the client unchanged. Skipped where the stubs' proto or the server lacks them."""

from __future__ import annotations

import pytest

import verifyd
from conftest import PROMPT

pb = verifyd.pb


def _need(message_type, name: str) -> None:
    if not verifyd.has_field(message_type, name):
        pytest.skip(f"these stubs have no {message_type.DESCRIPTOR.name}.{name}")


def test_hidden_states_of_every_committed_token(client: verifyd.Client, reference) -> None:
    _need(pb.OpenSessionRequest, "hidden_states")
    np = pytest.importorskip("numpy")
    info = client.get_info()
    layers = list(range(info.model.num_hidden_layers))
    hidden = info.model.hidden_size
    ref = reference(PROMPT, 10)
    req = {"layers": layers, "include_prompt": True, "dtype": "HIDDEN_DTYPE_FP32"}
    with client.session(PROMPT, hidden_states=req) as s:
        hs = s.opened.hidden_states
        if hs.num_tokens == 0:
            pytest.skip("this server returns no hidden states")
        assert list(hs.layers) == layers and hs.hidden_size == hidden
        prompt_rows = verifyd.hidden_states_to_numpy(hs)
        assert prompt_rows.shape == (len(PROMPT), len(layers), hidden)
        assert np.isfinite(prompt_rows).all() and np.abs(prompt_rows).max() > 0
        wrong = (ref[3] + 1) % info.model.vocab_size
        r = s.verify((ref[1:3] + [wrong], None))  # two accepted, the third not
        got = verifyd.hidden_states_to_numpy(r.hidden_states)
        assert got.shape == (3, len(layers), hidden)  # old pending token + 2 accepted
        assert verifyd.hidden_states_to_lists(r.hidden_states) == got.tolist()
    # The same prompt in bf16: the same values within bf16 rounding.
    with client.session(PROMPT, hidden_states={"layers": layers, "include_prompt": True}) as s:
        bf = verifyd.hidden_states_to_numpy(s.opened.hidden_states)
        assert verifyd.hidden_states_dtype(s.opened.hidden_states) == "bf16"
        np.testing.assert_allclose(bf, prompt_rows, rtol=1 / 128, atol=1e-6)


def test_logprobs_and_stats(client: verifyd.Client, reference) -> None:
    _need(pb.OpenSessionRequest, "top_logprobs")
    _need(pb.VerifyResult, "stats")
    ref = reference(PROMPT, 10)
    with client.session(PROMPT, top_logprobs=3) as s:
        if len(s.opened.logprobs) == 0:
            pytest.skip("this server returns no logprobs")
        (lp,) = s.opened.logprobs
        assert lp.token == s.next_token and len(lp.top_tokens) == 3
        assert lp.top_tokens[0] == lp.token  # greedy: the best token
        r = s.verify((ref[1:3], None))
        assert [x.token for x in r.logprobs] == ref[1:4]  # accepted, then the bonus
        assert r.stats.rounds == 1 and r.stats.draft_tokens == 2 and r.stats.accepted_tokens == 2


def test_seeded_sampling_is_reproducible_and_lossless(client: verifyd.Client) -> None:
    _need(pb.OpenSessionRequest, "sampling")
    sampling = {"temperature": 1.0, "top_k": 50, "seed": 42}
    n = 40
    with client.session(PROMPT, sampling=sampling) as plain:
        while len(plain.history) < len(PROMPT) + n:
            plain.verify()
    drafter = verifyd.NgramDrafter()
    with client.session(PROMPT, sampling=sampling) as spec:
        while len(spec.history) < len(PROMPT) + n:
            spec.verify(drafter.draft(spec.history))
    assert spec.history[: len(PROMPT) + n] == plain.history[: len(PROMPT) + n]
