"""Exact deduplication as map -> reduce -> removal lists over hash buckets.

Because `id` is the xxh3-128 of the text, exact duplicates share an id. The map step
(`exact_map`, per shard) writes (id, source, source_id, row) of its shard grouped by hash
bucket (the id's prefix); each reduce step (`exact_reduce`, per bucket) reads its bucket of
every shard's map output, so it sees every copy of an id, keeps the copy with the lowest
(source, source_id, shard key, row) and marks the rest. Per shard, `exact_removals` turns the
marks into a removal list (removals.py), and `duplicates_digest` is what that list depends on.

Layout (every directory may be shared by all partitions, or be one partition's own):
  map_root/docs/<shard key>.parquet            one row group per bucket
  reduce_root/docs/bucket-BBBBB.parquet        row, is_duplicate, id, kept_key, kept_row,
                                               source, source_id; one row group per shard key
  reduce_root/marks/bucket-BBBBB.json          {shard key: digest of its duplicate rows}
A reduce therefore reads one row group of each map file and a shard's removal list one row
group of each reduce file: each step reads only its slice of the others' output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from marin_assets.datakit.removals import Removal, write_removal_list
from marin_assets.datakit.shards import (
    arrow_int64,
    basename,
    check_shard_key,
    join,
    list_committed_dir,
    list_dir,
    read_committed_json,
    read_parts,
    read_row_group,
    read_table,
    write_json,
    write_row_groups,
)
from marin_assets.numeric_checks import check_int


@dataclass(frozen=True)
class ExactDedupConfig:
    num_buckets: int = 16

    def __post_init__(self):
        check_int("ExactDedupConfig.num_buckets", self.num_buckets, 1, 65536)


def bucket_of(doc_id: str, num_buckets: int) -> int:
    return int(doc_id[:8], 16) % num_buckets


_HEX_VALUES = None  # byte -> its hex digit's value, 255 for a byte that is not one


def buckets_of(ids, num_buckets: int):
    """bucket_of for every id of a pyarrow string Array, as an int64 numpy array.

    Vectorised over Arrow's buffer when every id starts with 8 hex digits (ids are
    xxh3-128 hex); any other id set goes through bucket_of one by one (same answers).
    """
    import numpy as np

    global _HEX_VALUES
    if _HEX_VALUES is None:
        table = np.full(256, 255, dtype=np.uint8)
        for i, c in enumerate(b"0123456789abcdef"):
            table[c] = i
        for i, c in enumerate(b"ABCDEF"):
            table[c] = 10 + i
        _HEX_VALUES = table
    n = len(ids)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    offsets_buffer, data_buffer = ids.buffers()[1:3]
    width = np.int64 if ids.type == "large_string" else np.int32
    offsets = np.frombuffer(offsets_buffer, dtype=width)[ids.offset : ids.offset + n + 1].astype(np.int64)
    if ids.null_count == 0 and data_buffer is not None and (np.diff(offsets) >= 8).all():
        data = np.frombuffer(data_buffer, dtype=np.uint8)
        digits = _HEX_VALUES[data[offsets[:-1, None] + np.arange(8)]]
        if (digits != 255).all():
            values = (digits.astype(np.uint64) << (np.arange(7, -1, -1, dtype=np.uint64) * np.uint64(4))).sum(axis=1)
            return (values % np.uint64(num_buckets)).astype(np.int64)
    return np.array([bucket_of(i, num_buckets) for i in ids.to_pylist()], dtype=np.int64)


def _bucket_name(bucket: int) -> str:
    return f"bucket-{bucket:05d}"


def _split_by_bucket(table, buckets) -> list:
    """[(bucket name, rows of that bucket in table order)] in bucket order (one row group each
    on disk): one stable sort by bucket and a slice per bucket, not a filter pass per bucket."""
    import numpy as np

    order = np.argsort(buckets, kind="stable")
    grouped = table.take(arrow_int64(order))
    present, starts = np.unique(buckets[order], return_index=True)
    ends = list(starts[1:]) + [len(order)]
    return [(_bucket_name(int(b)), grouped.slice(int(lo), int(hi) - int(lo))) for b, lo, hi in zip(present, starts, ends)]


def exact_map(shard_key: str, shard_path: str, map_root: str, config: ExactDedupConfig) -> dict:
    """The map side of one shard: its rows grouped by hash bucket, one file under `map_root`.

    Layout: map_root/docs/<shard_key>.parquet (id, source, source_id, row), one row group
    per non-empty bucket (shards.write_row_groups). `map_root` may be this shard's own
    artifact directory or one shared by all shards: the reduce reads the row group of its
    bucket from every map file under the roots it gets. Returns {"docs"}.
    """
    import numpy as np
    import pyarrow as pa

    key = check_shard_key(shard_key)
    table = read_table(shard_path, columns=["id", "source", "source_id"])
    if table.num_rows:
        rows = pa.Table.from_arrays(
            [table.column("id"), table.column("source"), table.column("source_id"), arrow_int64(np.arange(table.num_rows))],
            names=["id", "source", "source_id", "row"],
        )
        buckets = buckets_of(rows.column("id").combine_chunks(), config.num_buckets)
        write_row_groups(_split_by_bucket(rows, buckets), join(map_root, "docs", f"{key}.parquet"))
    return {"docs": table.num_rows}


def _gather(roots: Sequence[str], kind: str, part: str, with_key: bool = False):
    """Row group `part` of every roots/<kind>/*.parquet, concatenated (None if there is none).

    With `with_key`, a `key` column holds each file's stem (the shard key of a map file); a
    key found under two roots is an error (its rows would be marked copies of themselves).
    """
    import pyarrow as pa

    tables, seen = [], {}
    for root in dict.fromkeys(roots):
        for path in list_dir(join(root, kind), suffix=".parquet"):
            key = basename(path)[: -len(".parquet")]
            if with_key and seen.setdefault(key, path) != path:
                raise ValueError(f"shard {key!r} has map output under two roots: {seen[key]} and {path}")
            t = read_row_group(path, part)
            if t is not None:
                if with_key:
                    t = t.append_column("key", pa.array([key] * t.num_rows, pa.string()))
                tables.append(t)
    return pa.concat_tables(tables) if tables else None


DOC_ORDER = ("id", "source", "source_id", "key", "row")  # the first row of an id is its canonical copy


def _first_flags(sorted_values):
    """True where a row starts a new group of equal values (the canonical copy), as a numpy
    bool array: one vectorised comparison of each value with the one before it (a null equals
    a null and nothing else)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    values = sorted_values.combine_chunks() if isinstance(sorted_values, pa.ChunkedArray) else sorted_values
    n = len(values)
    first = np.ones(n, dtype=bool)
    if n > 1:
        later, earlier = values.slice(1), values.slice(0, n - 1)
        same = pc.equal(later, earlier)
        if values.null_count:
            same = pc.if_else(pc.is_null(same), pc.and_(pc.is_null(later), pc.is_null(earlier)), same)
        first[1:] = ~same.to_numpy(zero_copy_only=False)
    return first


def _sorted_firsts(table, order_columns):
    """(order, first): the indices sorting `table` by order_columns, and in that order True
    where a row is the first of its order_columns[0] value."""
    import pyarrow.compute as pc

    order = pc.sort_indices(table, [(c, "ascending") for c in order_columns])
    return order, _first_flags(table.column(order_columns[0]).take(order))


def exact_reduce(
    bucket: int, map_roots: Sequence[str], reduce_root: str, config: ExactDedupConfig, reuse: str | None = None
) -> dict:
    """Reduce one hash bucket: read its row group of every map file, mark duplicates.

    Every copy of an id lands in the same bucket; the copy with the lowest (source,
    source_id, shard key, row) is canonical. Writes reduce_root/docs/bucket-BBBBB.parquet
    (row, is_duplicate, id, kept_key, kept_row, source, source_id), one row group per shard
    key, and reduce_root/marks/bucket-BBBBB.json (see duplicates_digest). Returns
    {"docs", "duplicates"}.

    reuse: the reduce_root of an earlier reduce of this bucket over other shards whose map
    output is unchanged. Its marks hold every row of those shards, so they stand in for
    those shards' map files: after one new shard a reduce reads two files, not one per
    shard, and writes the same bytes as reading every map file.
    """
    import numpy as np
    import pyarrow as pa

    counts = {"docs": 0, "duplicates": 0}
    name = _bucket_name(check_int("bucket", bucket, 0, config.num_buckets - 1))
    table = _gather(map_roots, "docs", name, with_key=True)
    if reuse is not None:
        table = _with_earlier_marks(table, join(reuse, "docs", f"{name}.parquet"))
    if table is not None:
        order, keep = _sorted_firsts(table, DOC_ORDER)
        table = table.take(order)
        # Each row's canonical copy is the last group start at or before it.
        canon = arrow_int64(np.maximum.accumulate(np.where(keep, np.arange(len(keep)), 0)))
        marks = pa.table(
            {
                "key": table.column("key"),
                "row": table.column("row"),
                "is_duplicate": pa.array(~keep),
                "id": table.column("id"),
                "kept_key": table.column("key").take(canon),
                "kept_row": table.column("row").take(canon),
                "source": table.column("source"),
                "source_id": table.column("source_id"),
            }
        )
        _write_by_key(marks, join(reduce_root, "docs", f"{name}.parquet"))
        write_json(_duplicate_digests(marks.filter(marks.column("is_duplicate"))), join(reduce_root, "marks", f"{name}.json"))
        counts["docs"] = table.num_rows
        counts["duplicates"] = int((~keep).sum())
    return counts


MAP_COLUMNS = ["id", "source", "source_id", "row", "key"]  # a gathered map row group, with its shard key


def _with_earlier_marks(table, marks_path: str):
    """`table` (gathered map rows, or None) plus the rows an earlier reduce marked."""
    import fsspec
    import pyarrow as pa

    fs, path = fsspec.core.url_to_fs(marks_path)
    if not fs.exists(path):
        return table  # that bucket had no documents
    earlier = read_parts(marks_path, "key", columns=MAP_COLUMNS[:-1])
    return earlier if table is None else pa.concat_tables([earlier, table.select(MAP_COLUMNS)])


def _duplicate_digests(dups) -> dict[str, str]:
    """{shard key: sha256 of its duplicate rows (row, id, kept_key, kept_row)} for the shards
    with a duplicate in this bucket: all that shard's removal list takes from the bucket."""
    import hashlib

    per_key: dict[str, list] = {}
    for key, row, doc_id, kept_key, kept_row in zip(
        *(dups.column(c).to_pylist() for c in ("key", "row", "id", "kept_key", "kept_row"))
    ):
        per_key.setdefault(key, []).append((row, doc_id, kept_key, kept_row))
    return {
        key: hashlib.sha256("".join(f"{r}\t{i}\t{k}\t{kr}\n" for r, i, k, kr in sorted(rows)).encode()).hexdigest()
        for key, rows in per_key.items()
    }


def duplicates_digest(shard_key: str, reduce_roots: Sequence[str]) -> str:
    """What the removal list of `shard_key` depends on, over every bucket reduce: the version
    of its exact_removals partition (early cutoff: a new shard that brings no copy of this
    shard's documents leaves its list, and the list's partition, as they were)."""
    import hashlib

    check_shard_key(shard_key)
    h = hashlib.sha256()
    for root in sorted(dict.fromkeys(reduce_roots)):
        for path in list_committed_dir(join(root, "marks"), suffix=".json"):
            h.update(f"{basename(path)}={read_committed_json(path).get(shard_key, '-')}\n".encode())
    return h.hexdigest()


def _write_by_key(table, path: str) -> None:
    """`table` sorted by (key, row), one row group per shard key, without the key column."""
    import numpy as np

    table = table.sort_by([("key", "ascending"), ("row", "ascending")])
    starts = np.flatnonzero(_first_flags(table.column("key")))
    names = table.column("key").take(arrow_int64(starts)).to_pylist()
    ends = list(starts[1:]) + [table.num_rows]
    body = table.drop_columns(["key"])
    write_row_groups([(k, body.slice(int(lo), int(hi) - int(lo))) for k, lo, hi in zip(names, starts, ends)], path)


def exact_removals(shard_key: str, reduce_roots: Sequence[str], out_path: str) -> dict:
    """The removal list of one shard from every bucket reduce: {"removed", "digest"}.

    `reduce_roots` are the reduce outputs of all buckets (one root per bucket partition, or
    one shared by all); only this shard's row group of each bucket file is read, so the
    cost is this shard's marks, not the corpus.
    """
    marks = _gather(reduce_roots, "docs", check_shard_key(shard_key))
    removals = []
    if marks is not None:
        dups = marks.filter(marks.column("is_duplicate"))
        for doc_id, row, kept_key, kept_row in zip(*(dups.column(c).to_pylist() for c in ("id", "row", "kept_key", "kept_row"))):
            removals.append(Removal(doc_id, row, "exact_duplicate", doc_id, kept_key, kept_row))
    digest = write_removal_list(removals, out_path)
    return {"removed": len(removals), "digest": digest}
