"""verifyd.AcceptanceStats: vLLM's mean acceptance length, 1 + accepted draft tokens / drafts,
where a draft is an item whose tree had a node (empty trees are plain decode steps)."""

from __future__ import annotations

import pytest

import verifyd


def test_mean_acceptance_length_counts_only_non_empty_trees() -> None:
    a = verifyd.AcceptanceStats()
    assert a.mean_acceptance_length is None and a.draft_acceptance_rate is None
    a.record(4, 3)  # 3 of 4 nodes accepted: 4 tokens emitted with the bonus
    a.record(0, 0)  # a plain decode step: not a draft
    a.record(2, 0)  # nothing accepted: the bonus alone
    a.record(5, 1)
    assert (a.drafts, a.draft_tokens, a.accepted_tokens) == (3, 11, 4)
    assert (a.steps, a.emitted_tokens) == (4, 4 + 1 + 1 + 2)
    assert a.mean_acceptance_length == pytest.approx(1 + 4 / 3)  # not 1 + 4 / 4 steps
    assert a.draft_acceptance_rate == pytest.approx(4 / 11)
    assert a.accepted_by_position == [2, 1, 1]
    assert a.per_position_acceptance_rate() == pytest.approx([2 / 3, 1 / 3, 1 / 3])
    assert a.summary().startswith(
        "mean acceptance length=2.33 (1 + 4 accepted draft tokens / 3 drafts), "
        "draft acceptance rate=0.36 (4/11 draft tokens), steps=4"
    )


def test_no_accepted_token_is_one() -> None:
    a = verifyd.AcceptanceStats()
    for _ in range(3):
        a.record(3, 0)
    assert a.mean_acceptance_length == 1.0 and a.per_position_acceptance_rate() == []
    only_plain = verifyd.AcceptanceStats()
    only_plain.record(0, 0)
    assert only_plain.mean_acceptance_length is None
    assert "mean acceptance length=n/a" in only_plain.summary()


def test_record_result_reads_every_tree_form() -> None:
    r = verifyd.pb.VerifyResult(accepted_tokens=[7, 8], bonus_token=9)
    a = verifyd.AcceptanceStats()
    a.record_result(verifyd.tree([7, 8, 1]), r)
    a.record_result(([7, 8, 1], [-1, 0, 0]), r)
    a.record_result(([7, 8], None), r)
    a.record_result({"tokens": [7, 8, 3, 4]}, r)
    a.record_result([7, 8], r)
    a.record_result(None, verifyd.pb.VerifyResult(bonus_token=9))
    a.record_result(([], []), verifyd.pb.VerifyResult(bonus_token=9))
    assert (a.drafts, a.draft_tokens, a.accepted_tokens, a.steps) == (5, 14, 10, 7)
    assert a.mean_acceptance_length == 3.0


def test_bad_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="accepted"):
        verifyd.AcceptanceStats().record(2, 3)
    with pytest.raises(ValueError, match="draft_nodes"):
        verifyd.AcceptanceStats().record(-1, 0)
