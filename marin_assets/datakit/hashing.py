"""The one 64-bit mixer every DataKit hash is built on (MinHash, LSH, Bloom, Feistel)."""

from __future__ import annotations

import numpy as np


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a cheap bijective mixer on uint64 arrays (returns a new array)."""
    x = np.asarray(x, dtype=np.uint64).copy()
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x
