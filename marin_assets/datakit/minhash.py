"""MinHash signatures over cleaned character n-grams, vectorised with numpy.

Per document: cap the text, clean it (lowercase, drop punctuation, collapse whitespace), hash
every character n-gram (polynomial over code points, then a splitmix64 finaliser): those
hashes, deduplicated, are the document's shingle set (`shingle_hashes`, the definition); its
signature is the minimum under each of ``num_perm`` hash functions of its keys, the high
words of its shingles (`shingle_keys`: the set the signature estimates the Jaccard of, and the
one fuzzy dedup's verify compares exactly).

The permutations are ``pi_i(x) = (a_i * x + b_i) mod 2^32`` with random odd ``a_i``: each
is a bijection of 32-bit space, and the ``mod 2^32`` is the free wrap-around of uint32
arithmetic, so there is no integer modulo and half the memory traffic of datasketch's
uint64 ``(a x + b) mod (2^61 - 1)``. A linear map alone is a weak min-wise family on
structured keys, but our keys ``x`` are already splitmix64-mixed hashes, i.e. uniformly
spread; tests check that the Jaccard estimate is unbiased with binomial variance.

The steps work on batches of documents (`keyed_batches`, `signature_batches`; the same
results as `shingle_keys` one document at a time): ASCII texts are cleaned together (one
bytes.translate, then numpy collapses the spaces), the n-grams of the batch are hashed in one
pass over the concatenated code points, and one sort of (document, key) packed into uint64
drops the repeated keys of a document (about a third of the 5-grams of prose; a repeat
cannot change a minimum), which leaves each document's keys sorted and unique (fuzzy_map
keeps them for the verify), before ``np.minimum.reduceat`` takes per-document minima over
blocks of ``chunk_shingles`` keys, a few permutations at a time so the block stays in cache.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from marin_assets.datakit.hashing import mix64
from marin_assets.numeric_checks import check_int

EMPTY_SIGNATURE_VALUE = np.uint32(0xFFFFFFFF)

# Punctuation is everything that is neither a word character nor whitespace, plus "_".
_PUNCT = re.compile(r"[^\w\s]|_")
# The same cleaning on ASCII bytes (str.isascii() is O(1)): \w and \s of an ASCII character
# are isalnum() and isspace() (checked over all 128 in the tests). One bytes.translate drops
# punctuation, lowercases and turns whitespace into spaces (bytes.split() would not split on
# \x1c-\x1f, which str.isspace() counts as whitespace).
_ASCII_DROP = bytes(c for c in range(128) if not (chr(c).isalnum() or chr(c).isspace()) or chr(c) == "_")
_ASCII_TABLE = bytes(32 if chr(c).isspace() else ord(chr(c).lower()) if c < 128 else c for c in range(256))
# Between texts in a batch: no cleaned text holds U+0080 (a control character, dropped).
_SEPARATOR = "\x80"
_FNV_PRIME = np.uint64(0x100000001B3)  # spreads the 21-bit code points
# Characters per batch (its arrays take ~50 bytes a character). Measured on the benchmark's
# prose: signatures are fastest at 64k (fewer, fuller blocks for the minima).
SIGNATURE_BATCH_CHARS = 1 << 16
PERM_GROUP = 16  # permutations reduced together: a (16, chunk_shingles) uint32 block stays in L2


@dataclass(frozen=True)
class MinHashParams:
    """The parts of a config that determine signatures (shared by dedup configs)."""

    num_perm: int = 286
    ngram: int = 5
    seed: int = 42
    max_chars: int = 500_000
    chunk_shingles: int = 16384  # keys per reduced block (any value gives the same signatures)

    def __post_init__(self) -> None:
        for name in ("num_perm", "ngram", "max_chars", "chunk_shingles"):
            check_int(name, getattr(self, name), 1)
        check_int("seed", self.seed, 0)


def clean_text(text: str, max_chars: int = 500_000) -> str:
    """Lowercase, strip punctuation, collapse whitespace (after capping the length)."""
    text = text[:max_chars]
    if text.isascii():
        return b" ".join(text.encode("ascii").translate(_ASCII_TABLE, _ASCII_DROP).split()).decode("ascii")
    return " ".join(_PUNCT.sub("", text.lower()).split())  # str.split(): the whitespace of \s


def _codes(cleaned: str, ngram: int) -> np.ndarray:
    """The code points of a cleaned text as uint64, zero-padded to at least `ngram`."""
    if len(cleaned) < ngram:
        cleaned += "\0" * (ngram - len(cleaned))  # NUL never survives cleaning: a plain pad
    return np.frombuffer(cleaned.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)


def _window_hashes(codes: np.ndarray, ngram: int) -> np.ndarray:
    """The mixed polynomial hash of every `ngram`-window of `codes` (uint64, in order)."""
    count = codes.size - ngram + 1
    h = codes[:count].copy()
    for k in range(1, ngram):
        h *= _FNV_PRIME
        h += codes[k : k + count]
    return mix64(h)


def _drop_repeats(values: np.ndarray) -> np.ndarray:
    """A sorted 1-D array without its repeated values (a new array)."""
    first = np.ones(values.size, dtype=bool)
    np.not_equal(values[1:], values[:-1], out=first[1:])
    return values[first]


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """np.unique of a 1-D array by one sort and a comparison (np.unique hashes, then sorts)."""
    return _drop_repeats(np.sort(values))


def shingle_hashes(text: str, params: MinHashParams = MinHashParams()) -> np.ndarray:
    """Sorted unique 64-bit hashes of the cleaned character n-grams of ``text``.

    A cleaned text shorter than ``ngram`` characters is one shingle (itself); an empty
    cleaned text has no shingles.
    """
    cleaned = clean_text(text, params.max_chars)
    if not cleaned:
        return np.zeros(0, dtype=np.uint64)
    return _sorted_unique(_window_hashes(_codes(cleaned, params.ngram), params.ngram))


def shingle_keys(text: str, params: MinHashParams = MinHashParams()) -> np.ndarray:
    """Sorted unique uint32 keys of ``text``'s shingles: the high words of shingle_hashes, the
    values the permutations act on. The set whose Jaccard the signatures estimate, and the
    one the verify compares exactly."""
    return _sorted_unique((shingle_hashes(text, params) >> np.uint64(32)).astype(np.uint32))


@functools.lru_cache(maxsize=8)  # asked for once per batch of a map
def permutation_coefficients(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(a, b)`` of the hash family, each shaped (num_perm, 1) uint32 and read-only; ``a`` is odd."""
    rng = np.random.Generator(np.random.PCG64(seed))
    a = rng.integers(0, 1 << 32, size=num_perm, dtype=np.uint32) | np.uint32(1)
    b = rng.integers(0, 1 << 32, size=num_perm, dtype=np.uint32)
    a.flags.writeable = b.flags.writeable = False
    return a.reshape(-1, 1), b.reshape(-1, 1)


def _keyed_minima(keys: np.ndarray, starts: np.ndarray, params: MinHashParams) -> np.ndarray:
    """(len(starts), num_perm) minima of pi_i over each run of `keys` (uint32; run d is
    keys[starts[d]:starts[d + 1]], every run non-empty, starts[0] == 0).

    The stream is cut into blocks of chunk_shingles keys; a run may span blocks, so a
    block's minima are folded into the running minima of their runs.
    """
    a, b = permutation_coefficients(params.num_perm, params.seed)
    out = np.full((starts.size, params.num_perm), EMPTY_SIGNATURE_VALUE, dtype=np.uint32)
    block = params.chunk_shingles
    group = min(PERM_GROUP, params.num_perm)
    buf = np.empty((group, min(block, max(1, keys.size))), dtype=np.uint32)
    for s in range(0, keys.size, block):
        e = min(s + block, keys.size)
        first = int(np.searchsorted(starts, s, side="right")) - 1  # the run holding key s
        last = int(np.searchsorted(starts, e, side="left"))  # runs [first, last) meet the block
        seg = starts[first:last] - s
        seg[0] = 0
        minima = np.empty((params.num_perm, seg.size), dtype=np.uint32)
        x = keys[s:e]
        for g in range(0, params.num_perm, group):
            h = min(g + group, params.num_perm)
            values = buf[: h - g, : e - s]
            np.multiply(a[g:h], x, out=values)  # wraps mod 2^32 by design
            np.add(values, b[g:h], out=values)
            np.minimum.reduceat(values, seg, axis=1, out=minima[g:h])
        np.minimum(out[first:last], minima.T, out=out[first:last])
    return out


def signatures_from_shingles(shingle_sets: Sequence[np.ndarray], params: MinHashParams = MinHashParams()) -> np.ndarray:
    """(docs, num_perm) uint32 signatures from precomputed shingle hash sets (uint64).

    A document without shingles gets all-``0xFFFFFFFF`` (callers keep it out of LSH).
    """
    out = np.full((len(shingle_sets), params.num_perm), EMPTY_SIGNATURE_VALUE, dtype=np.uint32)
    nonempty = np.array([i for i, s in enumerate(shingle_sets) if s.size], dtype=np.int64)
    if nonempty.size:
        sizes = np.array([shingle_sets[i].size for i in nonempty], dtype=np.int64)
        # Keys for the hash family: the high word of each (already mixed) 64-bit hash.
        keys = np.concatenate([(shingle_sets[i] >> np.uint64(32)).astype(np.uint32) for i in nonempty])
        out[nonempty] = _keyed_minima(keys, np.r_[0, np.cumsum(sizes)[:-1]], params)
    return out


def _cleaned_ascii(texts: list[str], gap: int) -> np.ndarray:
    """clean_text of ASCII texts as one byte array, each text followed by `gap` separators:
    one translate over all of them, then runs of spaces cut to one and the spaces at either
    end of a text dropped with numpy (what " ".join(text.split()) does to each)."""
    sep = _SEPARATOR * gap
    kept = np.frombuffer((sep.join(texts) + sep).encode("latin-1").translate(_ASCII_TABLE, _ASCII_DROP), dtype=np.uint8)
    space = kept == 32
    after = np.ones(kept.size, dtype=bool)  # after a space, a separator or nothing
    after[1:] = space[:-1] | (kept[:-1] == 0x80)
    kept = kept[~(space & after)]
    before = np.ones(kept.size, dtype=bool)  # before a separator (a space is never last: a separator is)
    before[:-1] = kept[1:] == 0x80
    return kept[~((kept == 32) & before)]


def _padded_codes(texts: Sequence[str], params: MinHashParams) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(code points of every cleaned text, each followed by `gap` zeros, uint64; the cleaned
    length of each; its position in `texts`; gap): the ASCII texts first, then the others.

    NUL never survives cleaning, so with gap = ngram - 1 no n-gram window holds two texts,
    and a text shorter than ngram is one window padded with zeros, as shingle_hashes pads.
    """
    gap = max(params.ngram - 1, 1)
    capped = [t[: params.max_chars] for t in texts]
    ascii_texts = [i for i, t in enumerate(capped) if t.isascii()]
    others = [i for i, t in enumerate(capped) if not t.isascii()]
    parts = []  # cleaned code points, each text followed by `gap` separators
    if ascii_texts:
        parts.append(_cleaned_ascii([capped[i] for i in ascii_texts], gap))
    if others:
        sep = _SEPARATOR * gap
        parts.append(np.frombuffer((sep.join(clean_text(capped[i], params.max_chars) for i in others) + sep).encode("utf-32-le"),
                                   dtype=np.uint32))  # fmt: skip
    codes = np.empty(sum(part.size for part in parts), dtype=np.uint64)
    separators, at = [np.zeros(0, dtype=np.int64)], 0
    for part in parts:
        codes[at : at + part.size] = part
        separators.append(at + np.flatnonzero(part == 0x80))
        at += part.size
    separators = np.concatenate(separators)
    codes[separators] = 0
    ends = separators[::gap]  # each text's first separator
    lengths = ends - np.r_[0, ends[:-1] + gap]
    return codes, lengths, np.array(ascii_texts + others, dtype=np.int64), gap


def _shingle_stream(texts: Sequence[str], params: MinHashParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the n-gram hashes of every text with a non-empty cleaned text, concatenated, each
    text's in order and with repeats; how many each has; its position in `texts`)."""
    n = params.ngram
    padded, lengths, positions, gap = _padded_codes(texts, params)
    offsets = np.cumsum(lengths + gap) - (lengths + gap)  # where each text starts in `padded`
    nonempty = lengths > 0
    lengths, positions, offsets = lengths[nonempty], positions[nonempty], offsets[nonempty]
    if not lengths.size:
        return np.zeros(0, dtype=np.uint64), lengths, positions
    hashes = _window_hashes(padded, n)
    counts = np.maximum(lengths - n, 0) + 1
    # The windows of a text are the `count` from its first character on (the next text starts
    # further on): +1 where a run of them starts, -1 where it ends, summed up.
    step = np.zeros(padded.size + 1, dtype=np.int8)
    step[offsets] = 1
    step[offsets + counts] = -1
    return hashes[np.cumsum(step[: hashes.size], dtype=np.int8).view(bool)], counts, positions


def _batches(texts: Sequence[str], max_chars: int, batch_chars: int) -> Iterator[tuple[int, int]]:
    """[start, stop) slices of `texts` holding about `batch_chars` characters each."""
    start = 0
    while start < len(texts):
        stop, size = start, 0
        while stop < len(texts) and (stop == start or size < batch_chars):
            size += min(len(texts[stop]), max_chars)
            stop += 1
        yield start, stop
        start = stop


@dataclass(frozen=True)
class KeyedBatch:
    """One batch of texts' shingle keys and signatures, run by run: run d is the text at
    `positions[d]`, its keys ``keys[starts[d]:starts[d + 1]]`` (sorted, unique; the last run
    ends at keys.size) and its signature ``signatures[d]``. Texts whose cleaned text is
    empty have no run."""

    positions: np.ndarray  # int64, index into the texts given
    keys: np.ndarray  # uint32
    starts: np.ndarray  # int64
    signatures: np.ndarray  # (runs, num_perm) uint32


def keyed_batches(texts: Sequence[str], params: MinHashParams = MinHashParams()) -> Iterator[KeyedBatch]:
    """KeyedBatch of the texts about SIGNATURE_BATCH_CHARS characters at a time (memory: a
    batch, whatever the number of texts). Run d's keys are shingle_keys(texts[positions[d]])
    and its signature signatures_from_shingles([shingle_hashes(texts[positions[d]])])."""
    for start, stop in _batches(texts, params.max_chars, SIGNATURE_BATCH_CHARS):
        hashes, counts, positions = _shingle_stream(texts[start:stop], params)
        if counts.size:
            keys, starts = _stream_keys(hashes, counts)
            yield KeyedBatch(start + positions, keys, starts, _keyed_minima(keys, starts, params))


def signature_batches(texts: Sequence[str], params: MinHashParams = MinHashParams()) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(positions, signatures) of the texts whose cleaned text is not empty, in order, a
    batch at a time (keyed_batches without the keys)."""
    for batch in keyed_batches(texts, params):
        order = np.argsort(batch.positions)
        yield batch.positions[order], batch.signatures[order]


def minhash_signatures(texts: Sequence[str], params: MinHashParams = MinHashParams()) -> np.ndarray:
    """(len(texts), num_perm) uint32 signatures of `texts` (signature_batches), all-``0xFFFFFFFF``
    for a text whose cleaned text is empty."""
    out = np.full((len(texts), params.num_perm), EMPTY_SIGNATURE_VALUE, dtype=np.uint32)
    for positions, signatures in signature_batches(texts, params):
        out[positions] = signatures
    return out


def _stream_keys(hashes: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(each run's sorted unique keys, run after run; where each run starts) of consecutive
    runs of `counts` hashes (each > 0): one sort of (run, key) packed into uint64."""
    doc = np.repeat(np.arange(counts.size, dtype=np.uint64), counts)
    packed = (doc << np.uint64(32)) | (hashes >> np.uint64(32))
    del doc
    packed.sort()
    packed = _drop_repeats(packed)  # by document, then key, each once
    keys = (packed & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    doc = packed >> np.uint64(32)
    return keys, np.flatnonzero(np.r_[True, doc[1:] != doc[:-1]])


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Exact Jaccard similarity of two sorted unique hash arrays (0.0 when both empty).

    The intersection is the number of adjacent equal values once the two are merged (a
    stable sort of two sorted runs is one timsort merge: a third of np.intersect1d's time).
    """
    if a.size == 0 and b.size == 0:
        return 0.0
    merged = np.concatenate([a, b])
    merged.sort(kind="stable")
    inter = int(np.count_nonzero(merged[1:] == merged[:-1]))
    return inter / (a.size + b.size - inter)
