"""Fuzzy deduplication: MinHash + LSH candidates, exact-Jaccard verification, components.

Marin's published recipe (github.com/marin-community/marin, DataKit docs): character 5-grams of cleaned text, 286
permutations, seed 42, LSH 26 bands x 11 rows, text capped at 500k characters, connected
components over candidate pairs, one survivor per component. Its known failure is that
templated text over-merges (one cluster held 44% of a source) because LSH candidates are
merged unverified; here every candidate pair is checked with the exact Jaccard similarity of
the two shingle sets and only pairs at or above ``jaccard_threshold`` become edges.

The algorithm runs as partitioned steps (see the layout comment above `fuzzy_map`): a map per
shard writes band keys, a reduce per (band, key range) pairs the keys of that slice across
every shard, a verify per shard checks the pairs it owns by exact Jaccard, and one resolve
runs union-find over the verified edges (the only global state, one row per near-duplicate
pair) and writes a removal list per shard. No step holds all signatures.

The survivor of a component is its earliest document in corpus order, the lowest (shard
key, row) (shard keys are numbered in raw-file order). A shard appended later therefore
never displaces an existing survivor: its near copies of older documents are removed from
the new shard itself, and an old shard's removals change only when a new document bridges
two old components. (The rule used to be "lowest id", which let a new near copy with a
smaller content hash take over and change an old shard's list.) Rows that repeat a text are
exact copies (Jaccard 1) and join its component.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from marin_assets.datakit.arrow_strings import string_array
from marin_assets.datakit.attribute_files import read_id_text
from marin_assets.datakit.fuzzy_candidates import (
    KEYS_DIR,
    OWNERS_DIR,
    PAIRS_DIR,
    owned_candidates,
    read_earlier_keys,
    write_keys,
    write_pairs,
)
from marin_assets.datakit.lsh import band_keys, band_pairs
from marin_assets.datakit.minhash import MinHashParams, jaccard, keyed_batches
from marin_assets.datakit.removals import Removal, removal_list_path, write_removal_list
from marin_assets.datakit.shards import (
    arrow_array,
    basename,
    check_shard_key,
    join,
    list_dir,
    numpy_view,
    parquet_file,
    read_rows,
    read_table,
)
from marin_assets.datakit.shards import write_table as shard_write_table
from marin_assets.datakit.shingle_keys_file import ShingleKeysWriter, read_shingle_keys
from marin_assets.knobs import knob
from marin_assets.numeric_checks import check_float, check_int


@dataclass(frozen=True)
class FuzzyDedupConfig(MinHashParams):
    """MinHash fields (num_perm, ngram, seed, max_chars, chunk_shingles) plus LSH/verify."""

    bands: int = 26
    rows: int = 11
    jaccard_threshold: float = knob(0.8, help="near duplicates: candidate pairs merge only at or above this exact 5-gram Jaccard")
    max_bucket_size: int = 64
    docs_per_reduce: int = knob(2_000_000, help="keys one key range of a band's reduce holds in memory (memory bound)")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("bands", self.bands, 1)
        check_int("rows", self.rows, 1)
        if self.bands * self.rows != self.num_perm:
            raise ValueError(f"bands * rows must equal num_perm: {self.bands} * {self.rows} != {self.num_perm}")
        check_float("jaccard_threshold", self.jaccard_threshold, 0.0, 1.0, lo_open=True)
        check_int("max_bucket_size", self.max_bucket_size, 2)
        check_int("docs_per_reduce", self.docs_per_reduce, 1)

    @property
    def lsh_threshold(self) -> float:
        """Similarity at which a pair becomes a candidate with probability ~1/2."""
        return (1.0 / self.bands) ** (1.0 / self.rows)


def component_survivors(num_nodes: int, edges: np.ndarray, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(survivor node of each node's component, component label of each node).

    ``edges`` (k, 2) are verified pairs of node indices; ``rank`` is a permutation giving
    each node's place in the survivor order (lowest rank survives).
    """
    # Here, not at the top: `marin datakit run` imports this module for its flags (FuzzyDedupConfig)
    # and scipy.sparse costs ~0.4 s that only the fuzzy_removals step needs.
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    graph = coo_matrix((np.ones(len(edges), dtype=np.int8), (edges[:, 0], edges[:, 1])), shape=(num_nodes, num_nodes))
    _, labels = connected_components(graph, directed=False)
    best = np.full(labels.max() + 1 if num_nodes else 0, num_nodes, dtype=np.int64)
    np.minimum.at(best, labels, rank)
    by_rank = np.argsort(rank)
    return by_rank[best[labels]], labels


# ---------------------------------------------------------------------------------------
# Sharded fuzzy dedup: map per shard -> reduce per (band, key range) -> verify per shard ->
# resolve (union-find over verified edges) -> one removal list per shard.
#
#   map_root/band-BBB/<shard>.parquet          key uint64, row uint32; sorted by key, row
#                                              groups of MAP_ROW_GROUP rows (range reads)
#   map_root/shingle-keys/<shard>.bin          each row's shingle keys (shingle_keys_file.py)
#   cand_root/pairs, owners, keys              see fuzzy_candidates.py
#   edges file (one per owner shard)           row_a, id_a, shard_b, row_b, id_b, jaccard; a
#                                              spanning forest of the shard's verified pairs
#   removals_root/<shard>.jsonl                see removals.py
#
# Nodes are ordered by (shard key, row), the corpus order. Owning a pair by its later node
# means a shard appended last owns every pair it brings: the old owners' candidates, hence
# their verify partitions, stay as they were.
# ---------------------------------------------------------------------------------------

MAP_ROW_GROUP = 8192
SHINGLE_KEYS_DIR = "shingle-keys"
KEY_SPACE = 1 << 64


def _band_name(band: int) -> str:
    return f"band-{band:03d}"


def key_range_bounds(index: int, count: int) -> tuple[int, int]:
    """[lo, hi) of range `index` of `count` equal slices of the 64-bit band-key space."""
    check_int("key range count", count, 1)
    check_int("key range index", index, 0, count - 1)
    return index * KEY_SPACE // count, (index + 1) * KEY_SPACE // count


def band_reduce_ranges(total_docs: int, docs_per_reduce: int) -> int:
    """How many key ranges to cut each band into so a reduce holds ~docs_per_reduce keys.

    Its memory is proportional to the keys it holds (about 40 bytes each while sorting), so
    growing the range count with the corpus keeps every reduce under a fixed bound however
    many shards there are.
    """
    check_int("docs_per_reduce", docs_per_reduce, 1)
    return max(1, -(-int(total_docs) // docs_per_reduce))


def fuzzy_map(shard_key: str, shard_path: str, map_root: str, config: FuzzyDedupConfig = FuzzyDedupConfig()) -> dict:
    """The map side of one shard: one band-key file per LSH band under `map_root`, and the
    documents' shingle keys (shingle_keys_path, read by the verify).

    Documents without shingles (empty after cleaning) are left out: their all-max
    signatures would collide with each other. Signatures are computed a batch of documents
    at a time (minhash.keyed_batches) and only their band keys kept, so memory is one
    batch plus 8 bytes a band of every document. Returns {"docs", "empty"}.
    """
    key = check_shard_key(shard_key)
    _, texts = read_id_text(shard_path)
    row_parts, key_parts = [np.zeros(0, np.uint32)], [np.zeros((config.bands, 0), np.uint64)]
    with ShingleKeysWriter(shingle_keys_path(map_root, key), len(texts)) as shingles:
        for batch in keyed_batches(texts, config):
            shingles.add(batch.positions, batch.keys, batch.starts)
            row_parts.append(batch.positions.astype(np.uint32))
            key_parts.append(band_keys(batch.signatures, config.bands, config.rows))
    nonempty, keys = np.concatenate(row_parts), np.concatenate(key_parts, axis=1)
    for band in range(config.bands):
        order = np.lexsort((nonempty, keys[band]))
        table = pa.table({"key": arrow_array(keys[band][order], np.uint64), "row": arrow_array(nonempty[order], np.uint32)})
        shard_write_table(table, join(map_root, _band_name(band), f"{key}.parquet"), row_group_size=MAP_ROW_GROUP)
    return {"docs": len(texts), "empty": len(texts) - int(nonempty.size)}


def shingle_keys_path(map_root: str, shard_key: str) -> str:
    return join(map_root, SHINGLE_KEYS_DIR, f"{check_shard_key(shard_key)}.bin")


def _read_key_range(path: str, lo: int, hi: int, last: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """(keys, rows, row groups read) of one band file restricted to [lo, hi) (or [lo, max])."""
    with parquet_file(path) as pf:
        groups = []
        for g in range(pf.metadata.num_row_groups):
            stats = pf.metadata.row_group(g).column(0).statistics
            if stats is None or not stats.has_min_max or (stats.max >= lo and (last or stats.min < hi)):
                groups.append(g)
        table = pf.read_row_groups(groups, columns=["key", "row"]) if groups else None
    if table is None or table.num_rows == 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.uint32), len(groups)
    keys = numpy_view(table.column("key"), np.uint64)
    rows = numpy_view(table.column("row"), np.uint32)
    inside = keys >= np.uint64(lo)
    if not last:
        inside &= keys < np.uint64(hi)
    return keys[inside], rows[inside], len(groups)


def _shard_files(roots: Sequence[str], subdir: str) -> dict[str, str]:
    """{shard key: file} for the <key>.parquet files of `subdir` under every root."""
    found: dict[str, str] = {}
    for root in dict.fromkeys(roots):
        for path in list_dir(join(root, subdir)):
            name = basename(path)
            if not name.endswith(".parquet"):
                continue
            key = check_shard_key(name[: -len(".parquet")])
            if key in found:
                raise ValueError(f"shard {key!r} has map output under two roots: {found[key]} and {path}")
            found[key] = path
    return dict(sorted(found.items()))


def fuzzy_band_reduce(
    band: int,
    key_range: tuple[int, int],
    map_roots: Sequence[str],
    out_root: str,
    config: FuzzyDedupConfig = FuzzyDedupConfig(),
    reuse: str | None = None,
) -> dict:
    """Candidate pairs of one LSH band within one key range, across every shard.

    `key_range` is (index, count): this reduce reads only the keys in slice `index` of
    `count` (whole row groups outside it are skipped), so its memory is the slice, not the
    band. Pairs go to out_root/pairs/band-BBB-range-RRRRR.parquet, sorted by the shard of
    their higher (later) node, which is where verification happens, with each owner's
    digest in out_root/owners/. The keys it held go to out_root/keys/ (with every shard's
    key in the metadata).

    reuse: the out_root of an earlier reduce of this band and range over other shards whose
    map output is unchanged: its keys file stands in for their band files (two reads
    after one new shard, not one per shard; the same pairs, since pairs depend only on the
    shards' order).
    """
    check_int("band", band, 0, config.bands - 1)
    index, count = key_range
    lo, hi = key_range_bounds(index, count)
    name = f"{_band_name(band)}-range-{index:05d}"
    files = _shard_files(map_roots, _band_name(band))
    earlier = read_earlier_keys(join(reuse, KEYS_DIR, f"{name}.parquet")) if reuse is not None else None
    both = set(files) & set(earlier[0]) if earlier else set()
    if both:
        raise ValueError(f"fuzzy_band_reduce: shards {sorted(both)[:5]} are both new and in the reused reduce {reuse}")
    shard_keys: list[str] = sorted([*files, *(earlier[0] if earlier else [])])
    position = {k: s for s, k in enumerate(shard_keys)}
    key_parts, node_parts, groups = [], [], 0
    if earlier:
        key_parts.append(numpy_view(earlier[1].column("key"), np.uint64))
        shard_of = np.array([position[k] for k in earlier[0]], np.int64)[numpy_view(earlier[1].column("shard"), np.uint32)]
        node_parts.append((shard_of << np.int64(32)) | numpy_view(earlier[1].column("row"), np.uint32).astype(np.int64))
    for shard in files:
        keys, rows, g = _read_key_range(files[shard], lo, hi, index == count - 1)
        groups += g
        key_parts.append(keys)
        node_parts.append((np.int64(position[shard]) << np.int64(32)) | rows.astype(np.int64))
        del keys, rows
    keys = np.concatenate(key_parts) if key_parts else np.zeros(0, np.uint64)
    nodes = np.concatenate(node_parts) if node_parts else np.zeros(0, np.int64)
    del key_parts, node_parts
    held = int(keys.size)
    keys, nodes = write_keys(
        keys, nodes, shard_keys, join(out_root, KEYS_DIR, f"{name}.parquet"), earlier[1].num_rows if earlier else 0
    )
    pairs = band_pairs(keys, nodes, config.max_bucket_size)
    del keys, nodes
    write_pairs(pairs, shard_keys, join(out_root, PAIRS_DIR, f"{name}.parquet"), join(out_root, OWNERS_DIR, f"{name}.json"))
    return {"shards": len(shard_keys), "keys": held, "pairs": len(pairs), "row_groups_read": groups}


def fuzzy_verify(
    shard_key: str,
    candidate_roots: Sequence[str],
    shard_paths: Mapping[str, str],
    map_roots: Mapping[str, str],
    out_path: str,
    config: FuzzyDedupConfig = FuzzyDedupConfig(),
) -> dict:
    """Verify the candidate pairs owned by one shard with the exact Jaccard of their shingle keys.

    Reads the pairs it owns from every band reduce (fuzzy_candidates.owned_candidates),
    drops repeats (a pair matches in many bands), then takes the pairs partner shard by
    partner shard (this shard's own pairs first), reading only the rows they name: their
    ids from `shard_paths` and their shingle keys from the map's file under `map_roots`
    (shard key -> the root fuzzy_map wrote it under).

    A pair that the edges kept so far already join is not compared: its edge could not
    change a component, and resolve keeps components, not edges. So the edges written are a
    spanning forest of this shard's verified pairs. A cluster of k near copies in this
    shard costs k - 1 comparisons that pass, not up to k (k - 1) / 2; each partner row still
    needs one, since this shard cannot know which partner rows their own shard joined.
    Returns {"candidate_pairs", "checked_pairs" (compared), "verified_pairs" (edges written)}.
    """
    key = check_shard_key(shard_key)
    cand = owned_candidates(key, candidate_roots)
    edges = {"row_a": [], "id_a": [], "shard_b": [], "row_b": [], "id_b": [], "jaccard": []}
    total = checked = 0
    if cand is not None:
        names, triples = _candidate_triples(cand, key)
        total = len(triples)
        own_ids, own = _shard_rows(
            key, shard_paths, map_roots, np.union1d(triples[:, 0], triples[names[triples[:, 1]] == key, 2])
        )
        joined = _Components()
        for c, partner in enumerate(names):
            mine = [(a, b) for a, _, b in triples[triples[:, 1] == c].tolist() if not joined.same((key, a), (partner, b))]
            if not mine:
                continue
            if partner == key:
                p_ids, other = own_ids, own
            else:
                p_ids, other = _shard_rows(partner, shard_paths, map_roots, np.unique([b for _, b in mine]))
            for row_a, row_b in mine:
                if joined.same((key, row_a), (partner, row_b)):
                    continue
                checked += 1
                j = jaccard(own[row_a], other[row_b])
                if j >= config.jaccard_threshold:
                    joined.join((key, row_a), (partner, row_b))
                    for name, value in (("row_a", row_a), ("id_a", own_ids[row_a]), ("shard_b", str(partner)),
                                        ("row_b", row_b), ("id_b", p_ids[row_b]), ("jaccard", j)):  # fmt: skip
                        edges[name].append(value)
    table = pa.table({
        "row_a": arrow_array(edges["row_a"], np.int64), "id_a": string_array(edges["id_a"]),
        "shard_b": string_array(edges["shard_b"]), "row_b": arrow_array(edges["row_b"], np.int64),
        "id_b": string_array(edges["id_b"]), "jaccard": arrow_array(edges["jaccard"], np.float64),
    })  # fmt: skip
    shard_write_table(table, out_path)
    return {"candidate_pairs": total, "checked_pairs": checked, "verified_pairs": len(edges["row_a"])}


def _candidate_triples(cand: pa.Table, own_key: str) -> tuple[np.ndarray, np.ndarray]:
    """(partner shard names, this shard's first; unique (row_a, partner index, row_b) rows)."""
    partners = np.array(cand.column("shard_b").to_pylist(), dtype=str)
    others = np.unique(partners[partners != own_key])
    names = np.array(([own_key] if (partners == own_key).any() else []) + others.tolist(), dtype=str)
    code = np.searchsorted(others, partners) + (names.size - others.size)
    code[partners == own_key] = 0
    row_a = numpy_view(cand.column("row_a"), np.uint32).astype(np.int64)
    row_b = numpy_view(cand.column("row_b"), np.uint32).astype(np.int64)
    return names, np.unique(np.stack([row_a, code, row_b], 1), axis=0)


class _Components:
    """Union-find over documents named (shard, row): which verified edges already join two."""

    def __init__(self) -> None:
        self._parent: dict[tuple[str, int], tuple[str, int]] = {}

    def _root(self, node: tuple[str, int]) -> tuple[str, int]:
        parent = self._parent
        while parent.get(node, node) != node:
            parent[node] = parent.get(parent[node], parent[node])  # path halving
            node = parent[node]
        return node

    def same(self, a: tuple[str, int], b: tuple[str, int]) -> bool:
        return self._root(a) == self._root(b)

    def join(self, a: tuple[str, int], b: tuple[str, int]) -> None:
        self._parent[self._root(a)] = self._root(b)


def _shard_rows(
    key: str, shard_paths: Mapping[str, str], map_roots: Mapping[str, str], rows: np.ndarray
) -> tuple[dict[int, str], dict[int, np.ndarray]]:
    """({row: id}, {row: shingle keys}) of the given rows of shard `key`."""
    for what, paths in (("shard_paths", shard_paths), ("map_roots", map_roots)):
        if key not in paths:
            raise ValueError(f"candidate pairs name shard {key!r}, which is not in {what} ({len(paths)} shards)")
    path = shard_paths[key]
    rows = np.asarray(rows, dtype=np.int64)
    try:
        ids = read_rows(path, rows, columns=["id"]).column("id").to_pylist()
    except ValueError as err:
        raise ValueError(f"candidate pairs name a row of shard {key!r} that it lacks: {err}") from None
    for row, doc_id in zip(rows.tolist(), ids):
        if doc_id is None:
            raise ValueError(f"shard {path} row {row}: null id")
    return dict(zip(rows.tolist(), ids)), read_shingle_keys(shingle_keys_path(map_roots[key], key), rows)


def fuzzy_resolve(edge_paths: Mapping[str, str], removals_root: str) -> dict:
    """Components over every shard's verified edges -> one removal list per shard.

    `edge_paths` maps every shard key to its fuzzy_verify output (so a shard with no
    duplicates still gets its empty list). The verified edges are the only global state
    (one entry per near-duplicate pair, far smaller than the signatures). The survivor of a
    component is its earliest member, lowest (shard key, row); every other member is removed with reason
    "fuzzy_duplicate". Returns {"duplicates", "clusters", "verified_pairs", "lists":
    {key: {"removed", "digest"}}}.
    """
    keys = [check_shard_key(k) for k in sorted(edge_paths)]
    node_of: dict[tuple[str, int], int] = {}
    info: list[tuple[str, str, int]] = []  # (id, shard, row) per node
    ends: list[tuple[int, int]] = []

    def node(shard: str, row: int, doc_id: str) -> int:
        n = node_of.setdefault((shard, row), len(info))
        if n == len(info):
            if shard not in edge_paths:
                raise ValueError(f"verified edge names shard {shard!r}, which has no edges file in this resolve")
            info.append((doc_id, shard, row))
        elif info[n][0] != doc_id:
            raise ValueError(f"shard {shard!r} row {row} is {info[n][0]} in one edge and {doc_id} in another")
        return n

    for key in keys:
        t = read_table(edge_paths[key], columns=["row_a", "id_a", "shard_b", "row_b", "id_b"])
        for row_a, id_a, shard_b, row_b, id_b in zip(*(t.column(c).to_pylist() for c in t.column_names)):
            ends.append((node(key, row_a, id_a), node(shard_b, row_b, id_b)))
    n = len(info)
    edges = np.array(ends, dtype=np.int64).reshape(-1, 2)
    rank = np.empty(n, dtype=np.int64)
    rank[sorted(range(n), key=lambda i: info[i][1:])] = np.arange(n)  # corpus order: (shard key, row)
    survivor, labels = component_survivors(n, edges, rank) if n else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    per_shard: dict[str, list] = {k: [] for k in keys}
    for i, s in enumerate(survivor.tolist()):
        if s != i:
            doc_id, shard, row = info[i]
            kept_id, kept_shard, kept_row = info[s]
            per_shard[shard].append(Removal(doc_id, row, "fuzzy_duplicate", kept_id, kept_shard, kept_row))
    lists = {
        k: {"removed": len(r), "digest": write_removal_list(r, removal_list_path(removals_root, k))} for k, r in per_shard.items()
    }
    clusters = len(np.unique(labels))
    return {"duplicates": n - clusters, "clusters": clusters, "verified_pairs": len(ends), "lists": lists}
