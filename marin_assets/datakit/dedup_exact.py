"""Exact deduplication as map -> reduce -> collect over hash buckets.

Because `id` is the xxh3-128 of the text, exact duplicates share an id. The map step
writes (id, source, source_id, row) of every shard into hash buckets chosen by the id's
prefix; each reduce step sees every copy of an id in one bucket, keeps the copy with the
lowest (source, source_id) and marks the rest; collect gathers the marks back into
attribute files co-partitioned with each input shard (same basename, same row order):
id, source_id, is_duplicate [, duplicate_spans].

With `paragraphs=True` the map also emits one row per paragraph (runs of text separated
by blank lines); the first occurrence of a paragraph (ordered by document id) is
canonical and every later one is reported as a (start, end) character span.

Every step is a pure function of its inputs, so each can be its own partition (map per
shard, reduce per bucket, collect per shard) in an orchestrator.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from marin_assets.numeric_checks import check_int
from marin_assets.datakit.shards import basename, join, read_table, reset_dir, write_json, write_table

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


def paragraph_spans(text: str, min_chars: int) -> list[tuple[int, int, str]]:
    """(start, end, stripped paragraph) for every paragraph of at least min_chars characters."""
    spans = []
    for m in PARAGRAPH_RE.finditer(text):
        para = m.group().strip()
        if len(para) >= min_chars:
            spans.append((m.start(), m.end(), para))
    return spans


def _key(dataset: str, shard_path: str) -> str:
    return f"{dataset}--{basename(shard_path)}" if dataset else basename(shard_path)


def _bucket_dir(out_dir: str, kind: str, bucket: int) -> str:
    return join(out_dir, f"_{kind}", f"bucket-{bucket:05d}")


def exact_dedup_map(dataset: str, shard_path: str, out_dir: str, config: ExactDedupConfig) -> dict:
    import numpy as np
    import pyarrow as pa

    columns = ["id", "source", "source_id"] + (["text"] if config.paragraphs else [])
    table = read_table(shard_path, columns=columns)
    ids = table.column("id").to_pylist()
    buckets = np.array([bucket_of(i, config.num_buckets) for i in ids], dtype=np.int64)
    key = _key(dataset, shard_path)
    base = pa.table(
        {
            "id": table.column("id"),
            "source": table.column("source"),
            "source_id": table.column("source_id"),
            "key": pa.array([key] * len(ids), pa.string()),
            "row": pa.array(np.arange(len(ids), dtype=np.int64)),
        }
    )
    for b in np.unique(buckets):
        write_table(base.filter(pa.array(buckets == b)), join(_bucket_dir(out_dir, "map", int(b)), f"{key}.parquet"))
    paragraphs = 0
    if config.paragraphs:
        import xxhash

        rows = {"phash": [], "id": [], "source": [], "source_id": [], "key": [], "row": [], "start": [], "end": []}
        sources, source_ids = table.column("source").to_pylist(), table.column("source_id").to_pylist()
        for row, text in enumerate(table.column("text").to_pylist()):
            for start, end, para in paragraph_spans(text, config.min_paragraph_chars):
                rows["phash"].append(xxhash.xxh3_128_hexdigest(para.encode("utf-8")))
                for name, value in (("id", ids[row]), ("source", sources[row]), ("source_id", source_ids[row]),
                                    ("key", key), ("row", row), ("start", start), ("end", end)):  # fmt: skip
                    rows[name].append(value)
        paragraphs = len(rows["phash"])
        ptable = pa.table(rows)
        pbuckets = np.array([bucket_of(h, config.num_buckets) for h in rows["phash"]], dtype=np.int64)
        for b in np.unique(pbuckets):
            path = join(_bucket_dir(out_dir, "map_para", int(b)), f"{key}.parquet")
            write_table(ptable.filter(pa.array(pbuckets == b)), path)
    return {"docs": len(ids), "paragraphs": paragraphs}


def _read_dir(directory: str):
    import fsspec
    import pyarrow as pa

    fs, root = fsspec.core.url_to_fs(directory)
    if not fs.exists(root):
        return None
    paths = sorted(fs.ls(root, detail=False))
    tables = [read_table(fs.unstrip_protocol(p)) for p in paths]
    return pa.concat_tables(tables) if tables else None


def _first_flags(sorted_keys: list) -> list[bool]:
    """True where a row starts a new group of equal keys (the canonical copy)."""
    return [i == 0 or k != sorted_keys[i - 1] for i, k in enumerate(sorted_keys)]


def exact_dedup_reduce(bucket: int, out_dir: str, config: ExactDedupConfig) -> dict:
    import pyarrow as pa
    import pyarrow.compute as pc

    counts = {"docs": 0, "duplicates": 0, "paragraphs": 0, "duplicate_paragraphs": 0}
    table = _read_dir(_bucket_dir(out_dir, "map", bucket))
    if table is not None:
        order = pc.sort_indices(table, [(c, "ascending") for c in ("id", "source", "source_id", "key", "row")])
        table = table.take(order)
        keep = _first_flags(table.column("id").to_pylist())
        marks = pa.table({"key": table.column("key"), "row": table.column("row"), "is_duplicate": pa.array([not k for k in keep])})
        _write_by_key(marks, join(out_dir, "_reduce"), bucket)
        counts["docs"] = table.num_rows
        counts["duplicates"] = keep.count(False)
    ptable = _read_dir(_bucket_dir(out_dir, "map_para", bucket)) if config.paragraphs else None
    if ptable is not None:
        cols = ("phash", "id", "source", "source_id", "key", "row", "start")
        ptable = ptable.take(pc.sort_indices(ptable, [(c, "ascending") for c in cols]))
        first = pa.array(_first_flags(ptable.column("phash").to_pylist()))
        dup = ptable.filter(pc.invert(first)).select(["key", "row", "start", "end"])
        _write_by_key(dup, join(out_dir, "_reduce_para"), bucket)
        counts["paragraphs"] = ptable.num_rows
        counts["duplicate_paragraphs"] = dup.num_rows
    return counts


def _write_by_key(table, root: str, bucket: int) -> None:
    import pyarrow.compute as pc

    for key in sorted(set(table.column("key").to_pylist())):
        part = table.filter(pc.equal(table.column("key"), key)).drop_columns(["key"])
        write_table(part, join(root, key, f"bucket-{bucket:05d}.parquet"))


def exact_dedup_collect(dataset: str, shard_path: str, out_dir: str, config: ExactDedupConfig) -> dict:
    """Write the co-partitioned attribute file for one input shard; return its counts."""
    import numpy as np
    import pyarrow as pa

    key = _key(dataset, shard_path)
    shard = read_table(shard_path, columns=["id", "source_id"])
    n = shard.num_rows
    is_dup = np.zeros(n, dtype=bool)
    seen = np.zeros(n, dtype=bool)
    marks = _read_dir(join(out_dir, "_reduce", key))
    if marks is not None:
        rows = marks.column("row").to_numpy()
        is_dup[rows] = marks.column("is_duplicate").to_numpy(zero_copy_only=False)
        seen[rows] = True
    if not seen.all():
        raise RuntimeError(f"exact dedup: {int((~seen).sum())} rows of {shard_path} missing from reduce output")
    columns = {"id": shard.column("id"), "source_id": shard.column("source_id"), "is_duplicate": pa.array(is_dup)}
    dup_chars = 0
    if config.paragraphs:
        spans: list[list[dict]] = [[] for _ in range(n)]
        pmarks = _read_dir(join(out_dir, "_reduce_para", key))
        if pmarks is not None:
            for row, start, end in zip(*(pmarks.column(c).to_pylist() for c in ("row", "start", "end"))):
                spans[row].append({"start": start, "end": end})
                dup_chars += end - start
        for s in spans:
            s.sort(key=lambda d: d["start"])
        span_type = pa.list_(pa.struct([("start", pa.int64()), ("end", pa.int64())]))
        columns["duplicate_spans"] = pa.array(spans, span_type)
    out_path = join(out_dir, dataset, basename(shard_path)) if dataset else join(out_dir, basename(shard_path))
    write_table(pa.table(columns), out_path)
    return {"docs": n, "duplicates": int(is_dup.sum()), "duplicate_paragraph_chars": dup_chars}


def exact_dedup(datasets: Mapping[str, Sequence[str]] | Sequence[str], out_dir: str, config: ExactDedupConfig) -> dict:
    """Run map, reduce and collect over all shards of all datasets (global dedup).

    `datasets` maps a dataset name to its normalized shard paths; attribute files land in
    out_dir/<name>/<shard basename>. A plain list of paths is one unnamed dataset whose
    attributes land directly in out_dir.
    """
    if not isinstance(datasets, Mapping):
        datasets = {"": list(datasets)}
    # The reduce reads whole bucket directories: map files of an earlier run would join it.
    reset_dir(out_dir)
    docs = 0
    for name, paths in datasets.items():
        for path in paths:
            docs += exact_dedup_map(name, path, out_dir, config)["docs"]
    reduce_counts = [exact_dedup_reduce(b, out_dir, config) for b in range(config.num_buckets)]
    per_dataset = {}
    for name, paths in datasets.items():
        collected = [exact_dedup_collect(name, p, out_dir, config) for p in paths]
        per_dataset[name] = {
            "docs": sum(c["docs"] for c in collected),
            "duplicates": sum(c["duplicates"] for c in collected),
        }
    counts = {
        "docs": docs,
        "duplicates": sum(c["duplicates"] for c in reduce_counts),
        "unique": docs - sum(c["duplicates"] for c in reduce_counts),
        "duplicate_paragraphs": sum(c["duplicate_paragraphs"] for c in reduce_counts),
        "per_dataset": per_dataset,
    }
    assert sum(d["duplicates"] for d in per_dataset.values()) == counts["duplicates"]
    write_json(counts, join(out_dir, "_counts.json"))
    return counts
