"""An EAGLE-style loop: read the target's hidden states (low, middle and high layer) for every
committed token and feed them to a drafter.

EAGLE-3 drafts from the target's features of the last committed token (three layers fused)
plus the embedding of the pending token. verifyd returns those features with each Verify:
``VerifyResult.hidden_states`` holds the tokens that round committed (the old pending token,
then the accepted nodes) as bytes, row-major [token][layer][hidden], little-endian bf16 or
fp32. With ``include_prompt`` the OpenSession answer holds the prompt's, so the feature
buffer always has one row per committed token.

THE DRAFTER HERE IS A STAND-IN, NOT A MODEL: a fixed random projection of the features
proposes a few tokens, so expect almost nothing to be accepted. Swap in a trained EAGLE
head; the plumbing stays the same.

    python examples/eagle_hidden_states.py --target 127.0.0.1:50051 --rounds 20

Exits 3 when the server (or the installed stubs) cannot return hidden states.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import verifyd


def decode(hs) -> np.ndarray:
    """HiddenStates -> float32 [num_tokens, num_layers, hidden_size], by hand (the library's
    verifyd.hidden_states_to_numpy does the same)."""
    shape = (hs.num_tokens, len(hs.layers), hs.hidden_size)
    if hs.dtype == verifyd.pb.HIDDEN_DTYPE_FP32:
        flat = np.frombuffer(hs.data, dtype="<f4")
    else:  # bf16 is the upper 16 bits of a float32
        flat = (np.frombuffer(hs.data, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    return flat.reshape(shape)


class StandInDraftHead:
    """NOT A TRAINED MODEL. Fuses the [layers, hidden] features of the last committed token
    with an embedding of the pending token and scores the vocabulary: `width` guesses for
    the next token (a depth-1 draft tree). Random weights; only the shapes are EAGLE's."""

    def __init__(self, layers: int, hidden: int, vocab: int, width: int = 4, dim: int = 64):
        rng = np.random.default_rng(0)
        self.fuse = rng.standard_normal((layers * hidden, dim), dtype=np.float32)
        self.embed = rng.standard_normal((vocab, dim), dtype=np.float32)
        self.lm_head = rng.standard_normal((dim, vocab), dtype=np.float32)
        self.width = width

    def draft(self, features: np.ndarray, pending_token: int) -> tuple[list[int], list[int]]:
        x = features.reshape(-1) @ self.fuse + self.embed[pending_token]
        guesses = np.argsort(x @ self.lm_head)[::-1][: self.width]
        return [int(t) for t in guesses], [-1] * len(guesses)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="127.0.0.1:50051")
    ap.add_argument("--prompt", default="11,22,33,44,55,66,77,88", help="comma-separated ids")
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    prompt = [int(t) for t in args.prompt.split(",")]

    if not verifyd.has_field(verifyd.pb.OpenSessionRequest, "hidden_states"):
        print("the installed verifyd-client was built from a proto without hidden states")
        return 3
    with verifyd.Client(args.target) as client:
        info = client.get_info()
        n_layers, hidden = info.model.num_hidden_layers, info.model.hidden_size
        # low, middle, high (EAGLE-3 reads layers near 2, L/2 and L-3)
        layers = sorted({min(2, n_layers // 4), n_layers // 2, max(n_layers - 3, n_layers // 2)})
        print(f"target: {info.model.name}, {n_layers} layers, hidden {hidden}; reading {layers}")
        head = StandInDraftHead(len(layers), hidden, info.model.vocab_size)

        with client.session(prompt, hidden_states={"layers": layers, "include_prompt": True}) as s:
            prompt_hs = s.opened.hidden_states
            if prompt_hs.num_tokens == 0:
                print("this server returns no hidden states")
                return 3
            features = decode(prompt_hs)  # one row per committed token
            assert np.array_equal(features, verifyd.hidden_states_to_numpy(prompt_hs))
            acceptance = verifyd.AcceptanceStats()
            for _ in range(args.rounds):
                assert features.shape[0] == s.committed_len
                tokens, parents = head.draft(features[-1], s.next_token)
                before = s.committed_len
                r = s.verify((tokens, parents))
                hs = r.hidden_states
                if hs.num_tokens != 1 + len(r.accepted_tokens):
                    # An answer replayed for a retried request_id carries no hidden states:
                    # roll back and run the round again.
                    s.truncate(before)
                    continue
                features = np.concatenate([features, decode(hs)])
                acceptance.record_result((tokens, parents), r)
                print(
                    f"committed {hs.num_tokens} token(s) -> features {features.shape}, "
                    f"accepted {list(r.accepted_tokens)}, bonus {r.bonus_token}"
                )
            print(f"{args.rounds} rounds (stand-in drafter): {acceptance.summary()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
