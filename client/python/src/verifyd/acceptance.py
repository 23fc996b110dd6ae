"""Acceptance counters with one definition: vLLM's mean acceptance length.

    mean acceptance length = 1 + accepted draft tokens / drafts

*drafts* are the Verify items whose tree had at least one node (an empty tree is a plain
decode step, not a draft); *accepted draft tokens* exclude the bonus token, which the ``1 +``
counts. It is the tokens a draft yields on average: 1.0 when no draft token is accepted. This
is the quantity verifyd's metrics (``verifyd:mean_acceptance_length:rate5m``), ``verifyctl``
and vLLM's ``spec_decode_num_accepted_tokens`` / ``spec_decode_num_drafts`` counters give.

Thread-safety: an :class:`AcceptanceStats` is for one thread (or task) at a time.
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional

__all__ = ["AcceptanceStats"]


@dataclasses.dataclass
class AcceptanceStats:
    """Counts Verify items as a drafter sends them; :meth:`record` each (draft, result).

    Attributes:
        drafts: items whose tree had at least one node.
        draft_tokens: draft nodes sent (over all items).
        accepted_tokens: accepted draft nodes (the bonus tokens excluded).
        steps: items recorded, empty trees included.
        emitted_tokens: tokens the items produced: accepted ones plus one bonus token each.
        accepted_by_position: ``accepted_by_position[i]``: drafts whose accepted path has more
            than ``i`` tokens (vLLM's per-position counts).
    """

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    steps: int = 0
    emitted_tokens: int = 0
    accepted_by_position: List[int] = dataclasses.field(default_factory=list)

    def record(self, draft_nodes: int, accepted: int) -> None:
        """One Verify item: its tree had ``draft_nodes`` nodes, ``accepted`` were accepted."""
        if draft_nodes < 0 or not 0 <= accepted <= draft_nodes:
            raise ValueError(
                f"AcceptanceStats.record: need 0 <= accepted ({accepted}) <= draft_nodes "
                f"({draft_nodes})"
            )
        self.steps += 1
        self.emitted_tokens += accepted + 1
        if draft_nodes == 0:
            return
        self.drafts += 1
        self.draft_tokens += draft_nodes
        self.accepted_tokens += accepted
        if accepted > len(self.accepted_by_position):
            self.accepted_by_position.extend([0] * (accepted - len(self.accepted_by_position)))
        for i in range(accepted):
            self.accepted_by_position[i] += 1

    def record_result(self, draft: Any, result: Any) -> None:
        """One Verify item from the tree sent (a DraftTree, a ``(tokens, parents)`` pair, a
        dict with ``tokens``, a token list, or None) and its VerifyResult."""
        self.record(_num_nodes(draft), len(result.accepted_tokens))

    @property
    def mean_acceptance_length(self) -> Optional[float]:
        """1 + accepted draft tokens / drafts; None before the first draft."""
        if self.drafts == 0:
            return None
        return 1.0 + self.accepted_tokens / self.drafts

    @property
    def draft_acceptance_rate(self) -> Optional[float]:
        """Accepted / draft tokens (falls as trees get wider, whatever the drafter's quality);
        None before the first draft."""
        if self.draft_tokens == 0:
            return None
        return self.accepted_tokens / self.draft_tokens

    def per_position_acceptance_rate(self) -> List[float]:
        """``[i]``: the share of drafts whose token at depth ``i + 1`` was accepted."""
        return [n / self.drafts for n in self.accepted_by_position] if self.drafts else []

    def summary(self) -> str:
        """One line naming each figure, e.g. for a drafter's report."""
        mal = self.mean_acceptance_length
        rate = self.draft_acceptance_rate
        return (
            f"mean acceptance length={'n/a' if mal is None else f'{mal:.2f}'} "
            f"(1 + {self.accepted_tokens} accepted draft tokens / {self.drafts} drafts), "
            f"draft acceptance rate={'n/a' if rate is None else f'{rate:.2f}'} "
            f"({self.accepted_tokens}/{self.draft_tokens} draft tokens), "
            f"steps={self.steps} (drafts and plain decode steps)"
        )


def _num_nodes(draft: Any) -> int:
    if draft is None:
        return 0
    tokens = getattr(draft, "tokens", None)
    if tokens is None:
        if isinstance(draft, dict):
            tokens = draft.get("tokens", ())
        elif isinstance(draft, tuple) and len(draft) == 2 and not isinstance(draft[0], int):
            tokens = draft[0]
        else:
            tokens = draft
    return len(tokens)
