"""An n-gram (prompt lookup) drafter against verifyd.

Each round drafts a tree from the session's own history (the tokens that followed earlier
occurrences of its last few tokens), verifies it, and keeps the accepted tokens plus the
bonus token. At the end it reports vLLM's mean acceptance length (1 + accepted draft tokens /
drafts, a draft being a round whose tree had a node) and checks losslessness: the speculative
output equals plain greedy decoding (empty trees) token for token.

    python examples/ngram_drafter.py --target 127.0.0.1:50051 --tokens 200
"""

from __future__ import annotations

import argparse
import time

import verifyd


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="127.0.0.1:50051")
    ap.add_argument("--prompt", default="11,22,33,44,55,66,77,88", help="comma-separated ids")
    ap.add_argument("--tokens", type=int, default=200, help="tokens to generate")
    ap.add_argument("--depth", type=int, default=4, help="draft tokens per continuation")
    ap.add_argument("--branches", type=int, default=3, help="continuations per tree")
    args = ap.parse_args()
    prompt = [int(t) for t in args.prompt.split(",")]
    drafter = verifyd.NgramDrafter(max_ngram=3, depth=args.depth, branches=args.branches)

    with verifyd.Client(args.target) as client:
        info = client.get_info()
        print(f"target: {info.model.name} ({info.backend}, tp {info.tp_size})")

        acceptance = verifyd.AcceptanceStats()
        start = time.perf_counter()
        with client.session(prompt) as s:
            while len(s.history) - len(prompt) < args.tokens:
                tokens, parents = drafter.draft(s.history)
                r = s.verify((tokens, parents))
                acceptance.record_result((tokens, parents), r)
            elapsed = time.perf_counter() - start
            speculative = s.history[len(prompt) :][: args.tokens]
            # Servers whose proto has VerifyResult.stats count the same on their side.
            stats = getattr(r, "stats", None)
            if stats is not None and stats.rounds:
                print(
                    f"server stats: rounds={stats.rounds} draft_tokens={stats.draft_tokens} "
                    f"accepted_tokens={stats.accepted_tokens} "
                    f"accepted by depth={list(stats.accepted_by_depth)}"
                )

        # The same number of tokens by plain greedy decoding.
        with client.session(prompt) as plain:
            while len(plain.history) - len(prompt) < args.tokens:
                plain.verify()
            greedy = plain.history[len(prompt) :][: args.tokens]

    # vLLM's mean acceptance length: 1 + accepted draft tokens / drafts (rounds with a
    # non-empty tree); plain decode steps (nothing matched) are not drafts.
    print(acceptance.summary())
    print(f"{args.tokens / elapsed:.0f} tokens/s")
    if speculative != greedy:
        print("MISMATCH: speculative output differs from greedy decoding")
        return 1
    print(f"lossless: {args.tokens} tokens equal greedy decoding")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
