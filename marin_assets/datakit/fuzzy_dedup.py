"""Fuzzy deduplication: MinHash + LSH candidates, exact-Jaccard verification, components.

Marin's recipe (MARIN_REFERENCE section 2): character 5-grams of cleaned text, 286
permutations, seed 42, LSH 26 bands x 11 rows, text capped at 500k characters, connected
components over candidate pairs, one survivor per component. Its known failure is that
templated text over-merges (one cluster held 44% of a source) because LSH candidates are
merged unverified; here every candidate pair is checked with the exact Jaccard similarity of
the two shingle sets and only pairs at or above ``jaccard_threshold`` become edges.

The survivor of a component is the document with the lowest id, so the choice does not
depend on shard order. Rows that repeat an id are exact copies and join its component.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from marin_assets.datakit.attribute_files import (
    attribute_path,
    check_unique_basenames,
    read_id_text,
    write_table,
)
from marin_assets.numeric_checks import check_float, check_int
from marin_assets.datakit.lsh import candidate_pairs
from marin_assets.datakit.shards import reset_dir
from marin_assets.datakit.minhash import (
    MinHashParams,
    jaccard,
    shingle_hashes,
    signatures_from_shingles,
)
from marin_assets.datakit.minhash import minhash_signatures as _minhash_signatures


@dataclass(frozen=True)
class FuzzyDedupConfig(MinHashParams):
    """MinHash fields (num_perm, ngram, seed, max_chars, chunk_shingles) plus LSH/verify."""

    bands: int = 26
    rows: int = 11
    jaccard_threshold: float = 0.8
    max_bucket_size: int = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("bands", self.bands, 1)
        check_int("rows", self.rows, 1)
        if self.bands * self.rows != self.num_perm:
            raise ValueError(
                f"bands * rows must equal num_perm: {self.bands} * {self.rows} != {self.num_perm}"
            )
        check_float("jaccard_threshold", self.jaccard_threshold, 0.0, 1.0, lo_open=True)
        check_int("max_bucket_size", self.max_bucket_size, 2)

    @property
    def lsh_threshold(self) -> float:
        """Similarity at which a pair becomes a candidate with probability ~1/2."""
        return (1.0 / self.bands) ** (1.0 / self.rows)


def minhash_signatures(texts: list[str], config: FuzzyDedupConfig = FuzzyDedupConfig()) -> np.ndarray:
    """(len(texts), num_perm) uint32 MinHash signatures of the cleaned character n-grams."""
    return _minhash_signatures(texts, config)


@dataclass
class DedupResult:
    """Per-document outcome (positions index the input order) plus counts."""

    survivor: np.ndarray  # (docs,) int64: position of the component's survivor
    candidate_pairs: int
    verified_pairs: int

    def counts(self) -> dict[str, int]:
        docs = self.survivor.size
        is_dup = self.survivor != np.arange(docs)
        sizes = np.bincount(self.survivor, minlength=docs)
        return {
            "docs": int(docs),
            "duplicates": int(is_dup.sum()),
            "clusters": int((sizes > 1).sum()),
            "candidate_pairs": self.candidate_pairs,
            "verified_pairs": self.verified_pairs,
        }


def _resolve(
    ids: list[str],
    signatures: np.ndarray,
    empty: np.ndarray,
    shingles_for: Callable[[np.ndarray], dict[int, np.ndarray]],
    config: FuzzyDedupConfig,
) -> DedupResult:
    """Candidates -> verified edges -> components -> lowest-id survivor per component.

    ``shingles_for(positions)`` returns {position: shingle hash set} for the documents that
    appear in candidate pairs (so shard-backed callers can load only those).
    """
    docs = len(ids)
    if docs == 0:
        return DedupResult(survivor=np.zeros(0, dtype=np.int64), candidate_pairs=0, verified_pairs=0)
    pairs = candidate_pairs(signatures, config.bands, config.rows, config.max_bucket_size, empty)
    shingles = shingles_for(np.unique(pairs)) if len(pairs) else {}
    keep = np.array(
        [jaccard(shingles[i], shingles[j]) >= config.jaccard_threshold for i, j in pairs],
        dtype=bool,
    )
    edges = pairs[keep] if len(pairs) else pairs
    graph = coo_matrix(
        (np.ones(len(edges), dtype=np.int8), (edges[:, 0], edges[:, 1])), shape=(docs, docs)
    )
    _, labels = connected_components(graph, directed=False)

    # Rank documents by (id, position); the survivor is the lowest rank in its component.
    order = np.lexsort((np.arange(docs), np.array(ids, dtype=object).astype(str)))
    rank = np.empty(docs, dtype=np.int64)
    rank[order] = np.arange(docs)
    best = np.full(labels.max() + 1 if docs else 0, docs, dtype=np.int64)
    np.minimum.at(best, labels, rank)
    survivor = order[best[labels]]
    return DedupResult(survivor=survivor, candidate_pairs=len(pairs), verified_pairs=int(keep.sum()))


def dedup_texts(ids: list[str], texts: list[str], config: FuzzyDedupConfig = FuzzyDedupConfig()) -> DedupResult:
    """In-memory fuzzy dedup of aligned ``ids`` and ``texts`` (positions in the result)."""
    if len(ids) != len(texts):
        raise ValueError(f"{len(ids)} ids but {len(texts)} texts")
    shingle_sets = [shingle_hashes(t, config) for t in texts]
    signatures = signatures_from_shingles(shingle_sets, config)
    empty = np.array([s.size == 0 for s in shingle_sets], dtype=bool)
    return _resolve(ids, signatures, empty, lambda pos: {int(p): shingle_sets[p] for p in pos}, config)


def find_duplicates(
    ids: list[str], texts: list[str], config: FuzzyDedupConfig = FuzzyDedupConfig()
) -> dict[str, str]:
    """{id of a duplicate: id of its survivor} for every document that should be dropped.

    Ids are content hashes, so a repeated id is the same text: it maps to nothing here (it
    is its own survivor) and exact dedup is where such copies are counted.
    """
    result = dedup_texts(ids, texts, config)
    out: dict[str, str] = {}
    for pos, surv in enumerate(result.survivor):
        if ids[pos] != ids[surv]:
            out[ids[pos]] = ids[surv]
    return out


def fuzzy_dedup(
    shard_paths: list[str], out_dir: str, config: FuzzyDedupConfig = FuzzyDedupConfig()
) -> dict[str, int]:
    """Global fuzzy dedup over normalized shards; writes co-partitioned attribute files.

    Each output file (same basename as its shard, in ``out_dir``) has columns ``id``,
    ``cluster_id`` (the survivor's id), ``is_duplicate`` and ``duplicate_of`` (survivor id,
    null for survivors), in the shard's row order. Memory holds the signatures of all
    documents (num_perm * 4 bytes each) but shingle sets only for candidate documents,
    which are re-read from their shards for verification.
    """
    if not shard_paths:
        raise ValueError("fuzzy_dedup needs at least one shard")
    check_unique_basenames(shard_paths)
    reset_dir(out_dir)

    ids: list[str] = []
    shard_of: list[np.ndarray] = []
    sig_parts: list[np.ndarray] = []
    empty_parts: list[np.ndarray] = []
    bounds = [0]
    for shard_index, path in enumerate(shard_paths):
        shard_ids, texts = read_id_text(path)
        shingle_sets = [shingle_hashes(t, config) for t in texts]
        sig_parts.append(signatures_from_shingles(shingle_sets, config))
        empty_parts.append(np.array([s.size == 0 for s in shingle_sets], dtype=bool))
        ids.extend(shard_ids)
        shard_of.append(np.full(len(shard_ids), shard_index, dtype=np.int64))
        bounds.append(len(ids))
    signatures = np.concatenate(sig_parts) if ids else np.zeros((0, config.num_perm), np.uint32)
    empty = np.concatenate(empty_parts)
    shard_index_of = np.concatenate(shard_of)

    def shingles_for(positions: np.ndarray) -> dict[int, np.ndarray]:
        wanted: dict[int, list[int]] = defaultdict(list)
        for p in positions:
            wanted[int(shard_index_of[p])].append(int(p))
        out: dict[int, np.ndarray] = {}
        for s, plist in wanted.items():
            _, texts = read_id_text(shard_paths[s])
            for p in plist:
                out[p] = shingle_hashes(texts[p - bounds[s]], config)
        return out

    result = _resolve(ids, signatures, empty, shingles_for, config)
    ids_arr = np.array(ids, dtype=object)
    for s, path in enumerate(shard_paths):
        lo, hi = bounds[s], bounds[s + 1]
        surv = result.survivor[lo:hi]
        is_dup = surv != np.arange(lo, hi)
        cluster = ids_arr[surv]
        table = pa.table(
            {
                "id": pa.array(ids[lo:hi], type=pa.string()),
                "cluster_id": pa.array(cluster.tolist(), type=pa.string()),
                "is_duplicate": pa.array(is_dup, type=pa.bool_()),
                "duplicate_of": pa.array(
                    [c if d else None for c, d in zip(cluster.tolist(), is_dup)], type=pa.string()
                ),
            }
        )
        write_table(table, attribute_path(out_dir, path))
    counts = result.counts()
    counts["shards"] = len(shard_paths)
    return counts
