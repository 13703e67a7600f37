"""Bits-per-byte on tagged held-out sets (Paloma-style), micro and macro averaged.

bpb = loss (nats/token) * tokens / bytes / ln 2 = total nats / (bytes * ln 2): a number
that does not depend on the tokenizer, so models with different vocabularies compare.
Each document is scored in full: a BOS/EOS token is the context of its first token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from marin_assets.evaluation.scoring import TokenLogprobs, score_spans


def bits_per_byte(
    sets: Mapping[str, Sequence[str]],
    token_logprobs: TokenLogprobs,
    encode: Callable[[str], list[int]],
    bos_id: int,
    seq_len: int,
    batch_size: int = 8,
) -> dict:
    """{"sets": {tag: {bpb, nats_per_token, tokens, bytes, docs}}, "micro_bpb", "macro_bpb"}."""
    if not sets:
        raise ValueError("bits_per_byte: no eval sets given")
    per_set = {}
    total_nats = total_bytes = 0.0
    for tag, docs in sorted(sets.items()):
        docs = [d for d in docs if d]
        if not docs:
            raise ValueError(f"bits_per_byte: eval set {tag!r} has no non-empty documents")
        scores = score_spans([([bos_id], encode(d)) for d in docs], token_logprobs, seq_len, batch_size)
        nats = -sum(s for s, _ in scores)
        tokens = sum(c for _, c in scores)
        n_bytes = sum(len(d.encode("utf-8")) for d in docs)
        per_set[tag] = {
            "bpb": nats / n_bytes / math.log(2),
            "nats_per_token": nats / tokens,
            "tokens": tokens,
            "bytes": n_bytes,
            "docs": len(docs),
        }
        total_nats += nats
        total_bytes += n_bytes
    return {
        "sets": per_set,
        "micro_bpb": total_nats / total_bytes / math.log(2),
        "macro_bpb": sum(s["bpb"] for s in per_set.values()) / len(per_set),
    }
