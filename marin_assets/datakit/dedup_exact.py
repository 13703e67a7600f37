"""Exact deduplication as map -> reduce -> (removal lists | collect) over hash buckets.

Because `id` is the xxh3-128 of the text, exact duplicates share an id. The map step
(`exact_map`, per shard) writes (id, source, source_id, row) of its shard grouped by hash
bucket (the id's prefix); each reduce step (`exact_reduce`, per bucket) reads its bucket of
every shard's map output, so it sees every copy of an id, keeps the copy with the lowest
(source, source_id, shard key, row) and marks the rest. Per shard, `exact_removals` turns the
marks into a removal list (removals.py) and `exact_dedup_collect` into an attribute file
co-partitioned with the shard (same basename, same row order): id, source_id,
is_duplicate [, duplicate_spans].

Layout (every directory may be shared by all partitions, or be one partition's own):
  map_root/docs/<shard key>.parquet            one row group per bucket
  map_root/paragraphs/<shard key>.parquet      (paragraph mode) one row group per bucket
  reduce_root/docs/bucket-BBBBB.parquet        row, is_duplicate, id, kept_key, kept_row;
                                               one row group per shard key
  reduce_root/paragraphs/bucket-BBBBB.parquet  row, start, end; one row group per shard key
A reduce therefore reads one row group of each map file and a shard's removal list one row
group of each reduce file: each step reads only its slice of the others' output.

With `paragraphs=True` the map also emits one row per paragraph (runs of text separated
by blank lines); the first occurrence of a paragraph (ordered by document id) is
canonical and every later one is reported as a (start, end) character span.

`exact_dedup` runs every step in this process (what `marin datakit run` does).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from marin_assets.numeric_checks import check_int
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
    reset_dir,
    write_json,
    write_row_groups,
    write_table,
)

PARAGRAPH_RE = re.compile(r"(?:[^\n]|\n(?![ \t]*\n))+")


@dataclass(frozen=True)
class ExactDedupConfig:
    num_buckets: int = 16
    paragraphs: bool = False
    min_paragraph_chars: int = 20  # shorter paragraphs ("Thanks,", "---") are too common to flag

    def __post_init__(self):
        check_int("ExactDedupConfig.num_buckets", self.num_buckets, 1, 65536)
        check_int("ExactDedupConfig.min_paragraph_chars", self.min_paragraph_chars, 1)


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


def paragraph_spans(text: str, min_chars: int) -> list[tuple[int, int, str]]:
    """(start, end, stripped paragraph) for every paragraph of at least min_chars characters."""
    spans = []
    for m in PARAGRAPH_RE.finditer(text):
        para = m.group().strip()
        if len(para) >= min_chars:
            spans.append((m.start(), m.end(), para))
    return spans


def _key(dataset: str, shard_path: str) -> str:
    return check_shard_key(f"{dataset}--{basename(shard_path)}" if dataset else basename(shard_path))


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
    per non-empty bucket (shards.write_row_groups), and with paragraphs
    map_root/paragraphs/<shard_key>.parquet (phash, id, source, source_id, row, start, end).
    `map_root` may be this shard's own artifact directory or one shared by all shards: the
    reduce reads the row group of its bucket from every map file under the roots it gets.
    """
    key = check_shard_key(shard_key)
    table = read_table(shard_path, columns=_map_columns(config))
    base, ptable = _map_rows(table, config)
    if base.num_rows:
        buckets = buckets_of(base.column("id").combine_chunks(), config.num_buckets)
        write_row_groups(_split_by_bucket(base, buckets), join(map_root, "docs", f"{key}.parquet"))
    paragraphs = ptable.num_rows if ptable is not None else 0
    if paragraphs:
        pbuckets = buckets_of(ptable.column("phash").combine_chunks(), config.num_buckets)
        write_row_groups(_split_by_bucket(ptable, pbuckets), join(map_root, "paragraphs", f"{key}.parquet"))
    return {"docs": table.num_rows, "paragraphs": paragraphs}


def _map_columns(config: ExactDedupConfig) -> list[str]:
    return ["id", "source", "source_id"] + (["text"] if config.paragraphs else [])


def _map_rows(table, config: ExactDedupConfig):
    """(docs, paragraphs) of one shard's `table` (columns _map_columns): docs holds id, source,
    source_id, row; paragraphs (None without config.paragraphs) phash, id, source, source_id,
    row, start, end of every paragraph of at least min_paragraph_chars characters."""
    import numpy as np
    import pyarrow as pa

    base = pa.Table.from_arrays(
        [table.column("id"), table.column("source"), table.column("source_id"), arrow_int64(np.arange(table.num_rows))],
        names=["id", "source", "source_id", "row"],
    )
    if not config.paragraphs:
        return base, None
    import xxhash

    ids = table.column("id").to_pylist()
    rows = {"phash": [], "id": [], "source": [], "source_id": [], "row": [], "start": [], "end": []}
    sources, source_ids = table.column("source").to_pylist(), table.column("source_id").to_pylist()
    for row, text in enumerate(table.column("text").to_pylist()):
        for start, end, para in paragraph_spans(text, config.min_paragraph_chars):
            rows["phash"].append(xxhash.xxh3_128_hexdigest(para.encode("utf-8")))
            for name, value in (("id", ids[row]), ("source", sources[row]), ("source_id", source_ids[row]),
                                ("row", row), ("start", start), ("end", end)):  # fmt: skip
                rows[name].append(value)
    ptable = pa.table(rows, schema=pa.schema([("phash", pa.string()), ("id", pa.string()), ("source", pa.string()),
                                              ("source_id", pa.string()), ("row", pa.int64()), ("start", pa.int64()),
                                              ("end", pa.int64())]))  # fmt: skip
    return base, ptable


def exact_dedup_map(dataset: str, shard_path: str, out_dir: str, config: ExactDedupConfig) -> dict:
    """exact_map into the shared out_dir/_map of the in-process run (key: dataset--basename)."""
    return exact_map(_key(dataset, shard_path), shard_path, join(out_dir, "_map"), config)


def _gather(roots: Sequence[str], kind: str, part: str, with_key: bool = False):
    """Row group `part` of every roots/<kind>/*.parquet, concatenated (None if there is none).

    With `with_key`, a `key` column holds each file's stem (the shard key of a map file).
    """
    import pyarrow as pa

    tables = []
    for root in dict.fromkeys(roots):
        for path in list_dir(join(root, kind), suffix=".parquet"):
            t = read_row_group(path, part)
            if t is not None:
                if with_key:
                    t = t.append_column("key", pa.array([basename(path)[: -len(".parquet")]] * t.num_rows, pa.string()))
                tables.append(t)
    return pa.concat_tables(tables) if tables else None


DOC_ORDER = ("id", "source", "source_id", "key", "row")  # the first row of an id is its canonical copy
PARAGRAPH_ORDER = ("phash", "id", "source", "source_id", "key", "row", "start")


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


def exact_reduce(bucket: int, map_roots: Sequence[str], reduce_root: str, config: ExactDedupConfig,
                 reuse: str | None = None) -> dict:
    """Reduce one hash bucket: read its row group of every map file, mark duplicates.

    Every copy of an id lands in the same bucket; the copy with the lowest (source,
    source_id, shard key, row) is canonical. Writes reduce_root/docs/bucket-BBBBB.parquet
    (row, is_duplicate, id, kept_key, kept_row, source, source_id), one row group per shard
    key, and with paragraphs reduce_root/paragraphs/bucket-BBBBB.parquet (row, start, end
    of each later copy of a paragraph), also one row group per shard key.

    reuse: the reduce_root of an earlier reduce of this bucket over other shards whose map
    output is unchanged. Its marks hold every row of those shards, so they stand in for
    those shards' map files: after one new shard a reduce reads two files, not one per
    shard, and writes the same bytes as reading every map file. Documents only.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    counts = {"docs": 0, "duplicates": 0, "paragraphs": 0, "duplicate_paragraphs": 0}
    name = _bucket_name(check_int("bucket", bucket, 0, config.num_buckets - 1))
    table = _gather(map_roots, "docs", name, with_key=True)
    if reuse is not None:
        if config.paragraphs:
            raise ValueError("exact_reduce: reuse covers documents only (its marks keep no paragraph rows)")
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
    ptable = _gather(map_roots, "paragraphs", name, with_key=True) if config.paragraphs else None
    if ptable is not None:
        order, first = _sorted_firsts(ptable, PARAGRAPH_ORDER)
        dup = ptable.take(order).filter(pc.invert(pa.array(first))).select(["key", "row", "start", "end"])
        if dup.num_rows:
            _write_by_key(dup, join(reduce_root, "paragraphs", f"{name}.parquet"))
        counts["paragraphs"] = ptable.num_rows
        counts["duplicate_paragraphs"] = dup.num_rows
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
    for key, row, doc_id, kept_key, kept_row in zip(*(dups.column(c).to_pylist() for c in ("key", "row", "id", "kept_key", "kept_row"))):
        per_key.setdefault(key, []).append((row, doc_id, kept_key, kept_row))
    return {key: hashlib.sha256("".join(f"{r}\t{i}\t{k}\t{kr}\n" for r, i, k, kr in sorted(rows)).encode()).hexdigest()
            for key, rows in per_key.items()}


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


def exact_dedup_reduce(bucket: int, out_dir: str, config: ExactDedupConfig) -> dict:
    """exact_reduce over the in-process run's shared out_dir/_map, into out_dir/_reduce."""
    return exact_reduce(bucket, [join(out_dir, "_map")], join(out_dir, "_reduce"), config)


def _write_by_key(table, path: str) -> None:
    """`table` sorted by (key, row), one row group per shard key, without the key column."""
    import numpy as np
    import pyarrow.compute as pc

    table = table.take(pc.sort_indices(table, [("key", "ascending"), ("row", "ascending")]))
    starts = np.flatnonzero(_first_flags(table.column("key")))
    names = table.column("key").take(arrow_int64(starts)).to_pylist()
    ends = list(starts[1:]) + [table.num_rows]
    body = table.drop_columns(["key"])
    write_row_groups([(k, body.slice(int(lo), int(hi) - int(lo))) for k, lo, hi in zip(names, starts, ends)], path)


def exact_removals(shard_key: str, reduce_roots: Sequence[str], out_path: str) -> dict:
    """The removal list of one shard from every bucket reduce: {"removed", "digest"}.

    `reduce_roots` are the reduce outputs of all buckets (one shared root in-process, one
    root per bucket partition otherwise); only this shard's row group of each bucket file
    is read, so the cost is this shard's marks, not the corpus.
    """
    from marin_assets.datakit.removals import Removal, write_removal_list

    marks = _gather(reduce_roots, "docs", check_shard_key(shard_key))
    removals = []
    if marks is not None:
        dups = marks.filter(marks.column("is_duplicate"))
        for doc_id, row, kept_key, kept_row in zip(*(dups.column(c).to_pylist() for c in ("id", "row", "kept_key", "kept_row"))):
            removals.append(Removal(doc_id, row, "exact_duplicate", doc_id, kept_key, kept_row))
    digest = write_removal_list(removals, out_path)
    return {"removed": len(removals), "digest": digest}


def exact_dedup_collect(dataset: str, shard_path: str, out_dir: str, config: ExactDedupConfig) -> dict:
    """Write the co-partitioned attribute file for one input shard from the reduce files of
    the in-process run (out_dir/_reduce); return its counts."""
    import numpy as np

    key = _key(dataset, shard_path)
    shard = read_table(shard_path, columns=["id", "source_id"])
    n = shard.num_rows
    is_dup = np.zeros(n, dtype=bool)
    seen = np.zeros(n, dtype=bool)
    marks = _gather([join(out_dir, "_reduce")], "docs", key)
    if marks is not None:
        rows = marks.column("row").to_numpy()
        is_dup[rows] = marks.column("is_duplicate").to_numpy(zero_copy_only=False)
        seen[rows] = True
    if not seen.all():
        raise RuntimeError(f"exact dedup: {int((~seen).sum())} rows of {shard_path} missing from reduce output")
    spans = None
    if config.paragraphs:
        pmarks = _gather([join(out_dir, "_reduce")], "paragraphs", key)
        spans = list(zip(*(pmarks.column(c).to_pylist() for c in ("row", "start", "end")))) if pmarks is not None else []
    return _write_attributes(shard.column("id"), shard.column("source_id"), is_dup, spans, _attribute_path(dataset, shard_path, out_dir))


def _attribute_path(dataset: str, shard_path: str, out_dir: str) -> str:
    return join(out_dir, dataset, basename(shard_path)) if dataset else join(out_dir, basename(shard_path))


def _write_attributes(ids, source_ids, is_dup, spans: list[tuple[int, int, int]] | None, out_path: str) -> dict:
    """The attribute file of one shard: id, source_id, is_duplicate and, when `spans` (the
    shard's duplicate paragraphs as (row, start, end)) is given, duplicate_spans per row."""
    import pyarrow as pa

    columns = {"id": ids, "source_id": source_ids, "is_duplicate": pa.array(is_dup)}
    dup_chars = 0
    if spans is not None:
        per_row: list[list[dict]] = [[] for _ in range(len(is_dup))]
        for row, start, end in spans:
            per_row[row].append({"start": start, "end": end})
            dup_chars += end - start
        for s in per_row:
            s.sort(key=lambda d: d["start"])
        span_type = pa.list_(pa.struct([("start", pa.int64()), ("end", pa.int64())]))
        columns["duplicate_spans"] = pa.array(per_row, span_type)
    write_table(pa.table(columns), out_path)
    return {"docs": len(is_dup), "duplicates": int(is_dup.sum()), "duplicate_paragraph_chars": dup_chars}


# Up to this many map rows (documents, plus paragraphs in paragraph mode; all shards
# together) the in-process run shuffles in memory: ~100-150 bytes a row (ids, source,
# source_id, row, key, span), under 1 GB.
IN_MEMORY_ROWS = 5_000_000


def exact_dedup(
    datasets: Mapping[str, Sequence[str]] | Sequence[str], out_dir: str, config: ExactDedupConfig, in_memory_rows: int = IN_MEMORY_ROWS
) -> dict:
    """Run map, reduce and collect over all shards of all datasets (global dedup).

    `datasets` maps a dataset name to its normalized shard paths; attribute files land in
    out_dir/<name>/<shard basename>. A plain list of paths is one unnamed dataset whose
    attributes land directly in out_dir.

    Up to `in_memory_rows` map rows the shuffle stays in memory (one global sort; the
    buckets only bound what one reduce holds, and every copy of an id shares a bucket, so
    the marks are the same); a corpus found larger while mapping is mapped again through
    out_dir/_map and out_dir/_reduce, as the sharded graph does. Attribute files and counts
    are the same either way.
    """
    if not isinstance(datasets, Mapping):
        datasets = {"": list(datasets)}
    # The reduce reads whole bucket directories: map files of an earlier run would join it.
    reset_dir(out_dir)
    shards = [(name, path) for name, paths in datasets.items() for path in paths]
    result = _dedup_in_memory(shards, out_dir, config, in_memory_rows)
    docs, reduce_counts, collected = result if result is not None else _dedup_through_files(shards, out_dir, config)
    per_dataset = {name: {"docs": 0, "duplicates": 0} for name in datasets}
    for (name, _), c in zip(shards, collected):
        per_dataset[name]["docs"] += c["docs"]
        per_dataset[name]["duplicates"] += c["duplicates"]
    counts = {
        "docs": docs,
        "duplicates": reduce_counts["duplicates"],
        "unique": docs - reduce_counts["duplicates"],
        "duplicate_paragraphs": reduce_counts["duplicate_paragraphs"],
        "per_dataset": per_dataset,
    }
    assert sum(d["duplicates"] for d in per_dataset.values()) == counts["duplicates"]
    write_json(counts, join(out_dir, "_counts.json"))
    return counts


def _dedup_through_files(shards: list[tuple[str, str]], out_dir: str, config: ExactDedupConfig):
    """(docs, reduce counts, per-shard collect counts) of map -> file shuffle -> reduce -> collect."""
    docs = sum(exact_dedup_map(name, path, out_dir, config)["docs"] for name, path in shards)
    reduces = [exact_dedup_reduce(b, out_dir, config) for b in range(config.num_buckets)]
    totals = {k: sum(c[k] for c in reduces) for k in ("duplicates", "duplicate_paragraphs")}
    return docs, totals, [exact_dedup_collect(name, path, out_dir, config) for name, path in shards]


def _dedup_in_memory(shards: list[tuple[str, str]], out_dir: str, config: ExactDedupConfig, max_rows: int):
    """_dedup_through_files with the map output kept in memory and reduced in one sort;
    None (nothing written) as soon as the map rows exceed `max_rows`.

    Each shard's key enters the sort as its rank among all keys (the same order as the key
    strings, without a string per row); each shard file is read once.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = [_key(name, path) for name, path in shards]
    if len(set(keys)) != len(keys):
        twice = sorted(k for k in set(keys) if keys.count(k) > 1)
        raise ValueError(f"exact dedup: shards share the key {twice[0]!r} (same dataset, same file name)")
    rank = {k: i for i, k in enumerate(sorted(keys))}
    doc_parts, para_parts, columns, rows = [], [], [], 0
    for (name, path), key in zip(shards, keys):
        table = read_table(path, columns=_map_columns(config))
        base, ptable = _map_rows(table, config)
        doc_parts.append(base.append_column("key", arrow_int64(np.full(base.num_rows, rank[key]))))
        if ptable is not None:
            para_parts.append(ptable.append_column("key", arrow_int64(np.full(ptable.num_rows, rank[key]))))
        columns.append((table.column("id"), table.column("source_id")))
        rows += base.num_rows + (ptable.num_rows if ptable is not None else 0)
        if rows > max_rows:
            return None
    is_dup = np.zeros(0, dtype=bool)
    if doc_parts:
        order, first = _sorted_firsts(pa.concat_tables(doc_parts), DOC_ORDER)
        is_dup = np.zeros(len(first), dtype=bool)
        is_dup[order.to_numpy()] = ~first
    spans: list[list[tuple[int, int, int]]] = [[] for _ in shards]
    dup_paragraphs = 0
    if para_parts:
        ptable = pa.concat_tables(para_parts)
        order, first = _sorted_firsts(ptable, PARAGRAPH_ORDER)
        dup = ptable.take(order).filter(pc.invert(pa.array(first)))
        shard_of_rank = {rank[k]: i for i, k in enumerate(keys)}
        for r, row, start, end in zip(*(dup.column(c).to_pylist() for c in ("key", "row", "start", "end"))):
            spans[shard_of_rank[r]].append((row, start, end))
        dup_paragraphs = dup.num_rows
    collected, offset = [], 0
    for (name, path), (ids, source_ids), shard_spans in zip(shards, columns, spans):
        n = len(ids)
        out_path = _attribute_path(name, path, out_dir)
        collected.append(_write_attributes(ids, source_ids, is_dup[offset : offset + n], shard_spans if config.paragraphs else None, out_path))
        offset += n
    totals = {"duplicates": int(is_dup.sum()), "duplicate_paragraphs": dup_paragraphs}
    return len(is_dup), totals, collected
