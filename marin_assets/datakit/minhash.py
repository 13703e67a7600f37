"""MinHash signatures over cleaned character n-grams, vectorised with numpy.

Pipeline per document: cap the text, clean it (lowercase, drop punctuation, collapse
whitespace), hash every character n-gram in one vector pass (polynomial over code points,
then a splitmix64 finaliser), deduplicate the hashes (that is the shingle set), and take the
minimum under each of ``num_perm`` hash functions.

The permutations are ``pi_i(x) = (a_i * x + b_i) mod 2^32`` with random odd ``a_i``: each
is a bijection of 32-bit space, and the ``mod 2^32`` is the free wrap-around of uint32
arithmetic, so there is no integer modulo and half the memory traffic of datasketch's
uint64 ``(a x + b) mod (2^61 - 1)``. A linear map alone is a weak min-wise family on
structured keys, but our keys ``x`` are already splitmix64-mixed hashes, i.e. uniformly
spread; tests check that the Jaccard estimate is unbiased with binomial variance.

The shingles of a group of documents are concatenated into one stream and processed in
blocks: the (num_perm, block) matrix is built at once and ``np.minimum.reduceat`` takes
per-document minima, so memory is bounded by ``num_perm * chunk_shingles * 4`` bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from marin_assets.numeric_checks import check_int
from marin_assets.datakit.hashing import mix64

EMPTY_SIGNATURE_VALUE = np.uint32(0xFFFFFFFF)

# Punctuation is everything that is neither a word character nor whitespace, plus "_".
_PUNCT = re.compile(r"[^\w\s]|_")
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class MinHashParams:
    """The parts of a config that determine signatures (shared by dedup configs)."""

    num_perm: int = 286
    ngram: int = 5
    seed: int = 42
    max_chars: int = 500_000
    chunk_shingles: int = 8192

    def __post_init__(self) -> None:
        for name in ("num_perm", "ngram", "max_chars", "chunk_shingles"):
            check_int(name, getattr(self, name), 1)
        check_int("seed", self.seed, 0)


def clean_text(text: str, max_chars: int = 500_000) -> str:
    """Lowercase, strip punctuation, collapse whitespace (after capping the length)."""
    text = text[:max_chars].lower()
    text = _PUNCT.sub("", text)
    return _SPACE.sub(" ", text).strip()


def shingle_hashes(text: str, params: MinHashParams = MinHashParams()) -> np.ndarray:
    """Sorted unique 64-bit hashes of the cleaned character n-grams of ``text``.

    A cleaned text shorter than ``ngram`` characters is one shingle (itself); an empty
    cleaned text has no shingles.
    """
    cleaned = clean_text(text, params.max_chars)
    if not cleaned:
        return np.zeros(0, dtype=np.uint64)
    codes = np.frombuffer(cleaned.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    n = params.ngram
    if codes.size < n:
        codes = np.concatenate([codes, np.zeros(n - codes.size, dtype=np.uint64)])
    count = codes.size - n + 1
    h = codes[:count].copy()
    mult = np.uint64(0x100000001B3)  # FNV-64 prime: spreads the 21-bit code points
    for k in range(1, n):
        h *= mult
        h += codes[k : k + count]
    return np.unique(mix64(h))


def permutation_coefficients(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(a, b)`` of the hash family, each shaped (num_perm, 1) uint32; ``a`` is odd."""
    rng = np.random.Generator(np.random.PCG64(seed))
    a = rng.integers(0, 1 << 32, size=num_perm, dtype=np.uint32) | np.uint32(1)
    b = rng.integers(0, 1 << 32, size=num_perm, dtype=np.uint32)
    return a.reshape(-1, 1), b.reshape(-1, 1)


def signatures_from_shingles(shingle_sets: list[np.ndarray], params: MinHashParams = MinHashParams()) -> np.ndarray:
    """(docs, num_perm) uint32 signatures from precomputed shingle hash sets.

    A document without shingles gets all-``0xFFFFFFFF`` (callers keep it out of LSH).
    The shingle stream of a group of documents is cut into blocks of ``chunk_shingles``
    (small enough for the (num_perm, block) matrix to stay in cache); a document may span
    blocks, so block minima are folded into the running minima of their documents.
    """
    a, b = permutation_coefficients(params.num_perm, params.seed)
    docs = len(shingle_sets)
    out = np.full((docs, params.num_perm), EMPTY_SIGNATURE_VALUE, dtype=np.uint32)
    block = params.chunk_shingles
    buf = np.empty((params.num_perm, block), dtype=np.uint32)
    group_target = max(block, 1 << 20)  # bounds the concatenated key stream of a group

    start = 0
    while start < docs:
        stop, total = start, 0
        while stop < docs and (stop == start or total < group_target):
            total += shingle_sets[stop].size
            stop += 1
        nonempty = np.array([i for i in range(start, stop) if shingle_sets[i].size], dtype=np.int64)
        start_next = stop
        if nonempty.size:
            # Keys for the hash family: the high word of each (already mixed) 64-bit hash.
            x = np.concatenate([(shingle_sets[i] >> np.uint64(32)).astype(np.uint32) for i in nonempty])
            sizes = np.array([shingle_sets[i].size for i in nonempty], dtype=np.int64)
            doc_starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
            group_min = np.full((params.num_perm, nonempty.size), EMPTY_SIGNATURE_VALUE, dtype=np.uint32)
            for s in range(0, x.size, block):
                e = min(s + block, x.size)
                values = buf[:, : e - s]
                np.multiply(a, x[s:e], out=values)  # wraps mod 2^32 by design
                np.add(values, b, out=values)
                lo, hi = np.searchsorted(doc_starts, [s, e], side="left")
                seg_starts = doc_starts[lo:hi]
                if seg_starts.size == 0 or seg_starts[0] != s:
                    seg_starts = np.concatenate([[s], seg_starts])
                seg_docs = np.searchsorted(doc_starts, seg_starts, side="right") - 1
                minima = np.minimum.reduceat(values, seg_starts - s, axis=1)
                np.minimum(group_min[:, seg_docs], minima, out=minima)
                group_min[:, seg_docs] = minima
            out[nonempty] = group_min.T
        start = start_next
    return out


def minhash_signatures(texts: list[str], params: MinHashParams = MinHashParams()) -> np.ndarray:
    """(len(texts), num_perm) uint32 MinHash signatures. ``params`` may be any object with
    the MinHashParams fields (e.g. a FuzzyDedupConfig)."""
    return signatures_from_shingles([shingle_hashes(t, params) for t in texts], params)


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Exact Jaccard similarity of two sorted unique hash arrays (0.0 when both empty)."""
    if a.size == 0 and b.size == 0:
        return 0.0
    inter = np.intersect1d(a, b, assume_unique=True).size
    return inter / (a.size + b.size - inter)
