"""Deterministic pseudo-English for tests: one generator, shared by the test folders."""

from __future__ import annotations

import random

VOCAB = [
    f"{a}{b}"
    for a in ("ka", "lo", "mi", "ne", "su", "ta", "vo", "re", "di", "pa")
    for b in ("n", "s", "th", "r", "l", "m", "ck", "ve")
]


def prose(seed: int, words: int = 60) -> str:
    """`words` words, distinct per seed (near-zero shingle overlap across seeds)."""
    rng = random.Random(seed)
    return " ".join(rng.choice(VOCAB) for _ in range(words)) + "."
