"""LSH banding over MinHash signatures: candidate pairs of documents.

Signatures (docs, bands * rows) are cut into ``bands`` bands of ``rows`` values; two
documents become a candidate pair when any band matches exactly. Each band is reduced to
one 64-bit key per document (a vectorised hash of its ``rows`` values), documents are sorted
by key, and runs of equal keys are the buckets.

A bucket of ``g`` documents has ``g (g - 1) / 2`` pairs. Templated text can produce huge
buckets, so above ``max_bucket_size`` members we emit only the pairs of each member with
its two sorted neighbours and with the bucket's first member: enough edges to connect a
true cluster after verification while staying linear in the bucket size.
"""

from __future__ import annotations

import numpy as np

from marin_assets.datakit.hashing import mix64


def band_keys(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(bands, docs) uint64 keys: one hash of each band's ``rows`` signature values."""
    docs, width = signatures.shape
    if width != bands * rows:
        raise ValueError(f"signature width {width} != bands*rows = {bands}*{rows}")
    sig = signatures.astype(np.uint64).reshape(docs, bands, rows)
    key = np.zeros((docs, bands), dtype=np.uint64)
    for r in range(rows):
        key = mix64(key ^ sig[:, :, r] ^ np.uint64(r + 1))
    # Fold the band number in so equal values in different bands never collide.
    key = key ^ mix64(np.arange(bands, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15))
    return key.T.copy()


def _bucket_pairs(members: np.ndarray, max_bucket_size: int) -> np.ndarray:
    """Candidate pairs (k, 2) within one bucket of sorted document indices."""
    g = members.size
    if g <= max_bucket_size:
        i, j = np.triu_indices(g, k=1)
        return np.stack([members[i], members[j]], axis=1)
    chain = np.stack([members[:-1], members[1:]], axis=1)
    skip = np.stack([members[:-2], members[2:]], axis=1)
    star = np.stack([np.full(g - 1, members[0]), members[1:]], axis=1)
    return np.concatenate([chain, skip, star])


def band_pairs(keys: np.ndarray, nodes: np.ndarray, max_bucket_size: int = 64) -> np.ndarray:
    """Candidate pairs (k, 2) of ``nodes`` (int64, any order) whose one-band ``keys`` match.

    Members of a bucket are taken in ascending node order, so the pairs (and the capped
    pairs of a huge bucket) depend only on the node numbering, not on the input order. The
    band reduce (fuzzy_dedup.fuzzy_band_reduce) calls this, one band key range at a time.
    """
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    sorted_nodes = nodes[order]
    starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]]) if keys.size else np.zeros(0, np.int64)
    sizes = np.diff(np.r_[starts, sorted_keys.size])
    chunks: list[np.ndarray] = []
    # Size-2 buckets are by far the most common: handle them all at once.
    two = starts[sizes == 2]
    if two.size:
        chunks.append(np.stack([sorted_nodes[two], sorted_nodes[two + 1]], axis=1))
    for s, g in zip(starts[sizes > 2], sizes[sizes > 2]):
        chunks.append(_bucket_pairs(np.sort(sorted_nodes[s : s + g]), max_bucket_size))
    if not chunks:
        return np.zeros((0, 2), dtype=np.int64)
    return np.sort(np.concatenate(chunks), axis=1).astype(np.int64)
