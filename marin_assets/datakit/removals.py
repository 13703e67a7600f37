"""Per-shard removal lists: what a global step (a dedup reduce) decides about one shard.

A partitioned reduce (exact dedup per hash bucket, fuzzy dedup per LSH band) sees a slice
of every shard; what it concludes comes back as one removal list per shard, and a
per-shard filter applies it. The list is the only thing a shard's downstream steps depend
on from the global step, so its *digest* versions them (early cutoff): a new shard that
changes nothing about shard 7 leaves shard 7's list, hence its digest, hence its filtered
and tokenized artifacts, as they were.

On disk a list is JSON Lines, one removed row per line, sorted by (id, row), each line
`{"id", "kept_id", "kept_row", "kept_shard", "reason", "row"}` with sorted keys: `row` is
the row in the shard the list belongs to, `id` that row's document id (checked when the
list is applied), `kept_*` the canonical copy that made it a duplicate (provenance).

The digest covers only the effect, the sorted (row, id, reason) triples: the provenance can
change (a new document bridges two components and another copy becomes the survivor) without
changing which rows this shard loses, and then nothing downstream of this shard should rerun.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from marin_assets.datakit import shards
from marin_assets.datakit.shards import check_shard_key, join, read_table, write_table

REMOVAL_REASONS = ("exact_duplicate", "fuzzy_duplicate", "low_quality", "contaminated", "language")
REMOVAL_SUFFIX = ".jsonl"


@dataclass(frozen=True, order=True)
class Removal:
    """One removed row of one shard, and the document it duplicates."""

    id: str
    row: int
    reason: str
    kept_id: str
    kept_shard: str
    kept_row: int

    def __post_init__(self):
        if self.reason not in REMOVAL_REASONS:
            raise ValueError(f"unknown removal reason {self.reason!r}; expected one of {REMOVAL_REASONS}")
        if isinstance(self.row, bool) or not isinstance(self.row, int) or self.row < 0:
            raise ValueError(f"removal of {self.id!r}: row must be a non-negative int, got {self.row!r}")
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"removal at row {self.row}: id must be a non-empty string, got {self.id!r}")


def removal_list_path(root: str, shard_key: str) -> str:
    return join(root, check_shard_key(shard_key) + REMOVAL_SUFFIX)


def removal_digest(removals: Iterable[Removal]) -> str:
    """sha256 of the sorted (row, id, reason) triples: what the list does to its shard."""
    h = hashlib.sha256()
    for row, doc_id, reason in sorted((r.row, r.id, r.reason) for r in removals):
        h.update(f"{row}\t{doc_id}\t{reason}\n".encode())
    return h.hexdigest()


def write_removal_list(removals: Iterable[Removal], path: str) -> str:
    """Write the list (sorted, deterministic bytes) and return its digest."""
    import fsspec

    entries = sorted(removals)
    rows = [r.row for r in entries]
    if len(set(rows)) != len(rows):
        dup = next(r for r in rows if rows.count(r) > 1)
        raise ValueError(f"removal list {path}: row {dup} is listed twice")
    fs, p = fsspec.core.url_to_fs(path)
    fs.makedirs(p.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(p, "w") as f:
        for r in entries:
            f.write(json.dumps(r.__dict__, sort_keys=True) + "\n")
    return removal_digest(entries)


def read_removal_list(path: str) -> list[Removal]:
    import fsspec

    out = []
    with fsspec.open(path, "r") as f:
        for lineno, line in enumerate(f, 1):
            try:
                out.append(Removal(**json.loads(line)))
            except (ValueError, TypeError) as e:
                raise ValueError(f"removal list {path} line {lineno}: {e}") from None
    return out


def removal_list_digest(path: str) -> str:
    """The digest of a list on disk (what a downstream shard version follows)."""
    return removal_digest(read_removal_list(path))


def flag_removals(attr_path: str, column: str, reason: str, shard_key: str, out_path: str) -> dict:
    """The removal list of the rows whose boolean `column` is True in a co-partitioned
    attribute file (same rows as the shard): a filter (low quality, contamination) as a list.

    Such a row goes for what it is, not as a copy of another, so `kept_*` name the row
    itself. Returns {"removed", "digest"}.
    """
    key = check_shard_key(shard_key)
    table = read_table(attr_path, columns=["id", column])
    flags = table.column(column).to_pylist()
    ids = table.column("id").to_pylist()
    removals = [Removal(doc_id, row, reason, doc_id, key, row) for row, (doc_id, flag) in enumerate(zip(ids, flags)) if flag]
    return {"removed": len(removals), "digest": write_removal_list(removals, out_path)}


def apply_removals(shard_path: str, removal_paths: Sequence[str], out_path: str, columns: Sequence[str] | None = None) -> dict:
    """Write the rows of one shard that no list removes (in order) to `out_path`.

    Each list must belong to this shard: every listed row exists and holds the listed id
    (a list computed for another version of the shard is an error, not a silent no-op).
    A row listed by several lists counts once, for the first list that names it. Returns
    {"docs_in", "docs_out", "removed": {reason: n}} with docs_in = docs_out + removed.
    """
    import numpy as np
    import pyarrow as pa

    table = read_table(shard_path, columns=list(columns) if columns else None)
    ids = (table if "id" in table.column_names else read_table(shard_path, columns=["id"])).column("id").to_pylist()
    drop = np.zeros(table.num_rows, dtype=bool)
    removed: dict[str, int] = {}
    for path in removal_paths:
        for r in read_removal_list(path):
            if r.row >= table.num_rows or ids[r.row] != r.id:
                found = ids[r.row] if r.row < table.num_rows else f"no such row (shard has {table.num_rows})"
                raise ValueError(f"removal list {path}: row {r.row} of {shard_path} should hold {r.id}, found {found}")
            if not drop[r.row]:
                drop[r.row] = True
                removed[r.reason] = removed.get(r.reason, 0) + 1
    kept = table.filter(pa.array(~drop))
    write_table(kept, out_path, row_group_size=shards.DOC_ROW_GROUP)  # a verify reads partner rows by group
    counts = {"docs_in": table.num_rows, "docs_out": kept.num_rows, "removed": dict(sorted(removed.items()))}
    assert counts["docs_in"] == counts["docs_out"] + sum(removed.values()), counts
    return counts
