"""A prompt-lookup (n-gram) drafter: draft trees from the session's own history.

The longest suffix of the history (up to ``max_ngram`` tokens, at least ``min_ngram``) that
occurred earlier is looked up; the tokens that followed its latest ``branches`` earlier
occurrences become the draft, merged into a tree (a shared first token is one node). No
model is involved: it pays off on repetitive text (code, extraction, long quotes).
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

__all__ = ["NgramDrafter"]


class NgramDrafter:
    """Draft trees hanging off the pending token, which is ``history[-1]``.

    Args:
        max_ngram, min_ngram: the suffix lengths tried, longest first.
        depth: tokens per continuation (the tree's depth).
        branches: distinct continuations merged into one tree.
    """

    def __init__(
        self, max_ngram: int = 3, min_ngram: int = 1, depth: int = 4, branches: int = 2
    ) -> None:
        if not 1 <= min_ngram <= max_ngram or depth < 1 or branches < 1:
            raise ValueError("NgramDrafter: need 1 <= min_ngram <= max_ngram, depth, branches >= 1")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.depth = depth
        self.branches = branches

    def continuations(self, history: Sequence[int]) -> List[List[int]]:
        """Up to ``branches`` distinct continuations, the latest occurrence first."""
        h = list(history)
        for n in range(min(self.max_ngram, len(h) - 1), self.min_ngram - 1, -1):
            suffix = h[-n:]
            found: List[List[int]] = []
            # Occurrences that end before the last token, latest first.
            for start in range(len(h) - n - 1, -1, -1):
                if h[start : start + n] == suffix:
                    cont = h[start + n : start + n + self.depth]
                    if cont and cont not in found:
                        found.append(cont)
                        if len(found) == self.branches:
                            break
            if found:
                return found
        return []

    def draft(self, history: Sequence[int]) -> Tuple[List[int], List[int]]:
        """(tokens, parents) of the draft tree; empty when nothing matches."""
        tokens: List[int] = []
        parents: List[int] = []
        children: Dict[Tuple[int, int], int] = {}  # (parent node, token) -> node
        for cont in self.continuations(history):
            parent = -1
            for tok in cont:
                node = children.get((parent, tok))
                if node is None:
                    node = len(tokens)
                    tokens.append(tok)
                    parents.append(parent)
                    children[(parent, tok)] = node
                parent = node
        return tokens, parents
