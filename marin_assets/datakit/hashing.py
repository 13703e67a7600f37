"""The one 64-bit mixer every DataKit hash is built on (MinHash, LSH, Bloom, Feistel), and
per-word work done once per distinct word."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def distinct_words(words: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """(the distinct words, each word's index into them), so per-word work (hashing) runs once
    per distinct word: Arrow's dictionary encoding finds them (a corpus repeats a small
    vocabulary). Words Arrow cannot hold (lone surrogates) come back as they are, one each."""
    import pyarrow as pa

    try:
        encoded = pa.array(words, type=pa.string()).dictionary_encode()
    except (pa.ArrowException, UnicodeEncodeError):
        return list(words), np.arange(len(words))
    return encoded.dictionary.to_pylist(), encoded.indices.to_numpy(zero_copy_only=False)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a cheap bijective mixer on uint64 arrays (returns a new array)."""
    x = np.asarray(x, dtype=np.uint64).copy()
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x
