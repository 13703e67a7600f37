"""A small in-memory oracle for the dedup shard steps: what they must decide, all pairs, no LSH.

Documents are dicts with id, text, source, source_id, key (shard key) and row, in corpus
order. The only library code used is the definition of a shingle (minhash.shingle_keys:
clean_text, then the hashed character n-grams' keys); grouping, Jaccard, components and the
survivor rules are written out here in plain Python.

    exact_duplicates(docs)        {(key, row): (kept key, kept row)} of every exact copy
    fuzzy_duplicates(docs, t)     {(key, row): (survivor key, survivor row)} of near copies
    dedup(docs, t)                (exact, fuzzy): fuzzy over what exact dedup keeps, as the
                                  graph runs them (the filter keeps each shard's row order)
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

from marin_assets.datakit.minhash import MinHashParams, shingle_keys

Place = tuple[str, int]  # (shard key, row): a document's place in corpus order


def place(doc: dict) -> Place:
    return doc["key"], doc["row"]


def exact_duplicates(docs: Sequence[dict]) -> dict[Place, Place]:
    """Every copy of an id but the one with the lowest (source, source_id, shard key, row),
    mapped to that kept copy."""
    by_id: dict[str, list[dict]] = {}
    for doc in docs:
        by_id.setdefault(doc["id"], []).append(doc)
    out = {}
    for copies in by_id.values():
        kept, *others = sorted(copies, key=lambda d: (d["source"], d["source_id"], d["key"], d["row"]))
        out.update({place(d): place(kept) for d in others})
    return out


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


def shingle_set(text: str) -> set[int]:
    """The shingles of `text` as the library defines them (the default MinHashParams)."""
    return set(shingle_keys(text, MinHashParams()).tolist())


def similar_pairs(docs: Sequence[dict], threshold: float) -> list[tuple[int, int]]:
    """(i, j), i < j, of every pair of positions whose shingle sets have Jaccard >= threshold
    (a document without shingles is similar to none)."""
    sets = [shingle_set(d["text"]) for d in docs]
    pairs = combinations(range(len(docs)), 2)
    return [(i, j) for i, j in pairs if sets[i] and sets[j] and jaccard(sets[i], sets[j]) >= threshold]


def components(count: int, pairs: Sequence[tuple[int, int]]) -> list[int]:
    """The component root of each of `count` nodes (union-find; a root is its lowest node)."""
    parent = list(range(count))

    def root(x: int) -> int:
        while parent[x] != x:
            x = parent[x]
        return x

    for i, j in pairs:
        a, b = root(i), root(j)
        parent[max(a, b)] = min(a, b)
    return [root(x) for x in range(count)]


def fuzzy_duplicates(docs: Sequence[dict], threshold: float = 0.8) -> dict[Place, Place]:
    """Every member of a near-duplicate component but its earliest (lowest (shard key,
    row)), mapped to that survivor."""
    ordered = sorted(docs, key=place)
    roots = components(len(ordered), similar_pairs(ordered, threshold))
    return {place(d): place(ordered[r]) for d, r in zip(ordered, roots, strict=True) if ordered[r] is not d}


def dedup(docs: Sequence[dict], threshold: float = 0.8) -> tuple[dict[Place, Place], dict[Place, Place]]:
    """(exact duplicates, fuzzy duplicates among the documents exact dedup keeps)."""
    exact = exact_duplicates(docs)
    return exact, fuzzy_duplicates([d for d in docs if place(d) not in exact], threshold)
