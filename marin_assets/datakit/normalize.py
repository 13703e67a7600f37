"""Normalize: raw documents from any reader -> Parquet shards with the DataKit contract.

Columns: id (xxh3-128 hex of the UTF-8 text), text, source, source_id, metadata (JSON).
Rows are sorted by id inside each shard; files are part-00000-of-000NN.parquet. A shard
closes when it reaches `shard_docs` documents or `shard_bytes` bytes of text, whichever
comes first, so memory stays bounded by one shard.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from marin_assets.numeric_checks import check_int
from marin_assets.datakit.quarantine import QuarantineRecord, QuarantineWriter
from marin_assets.datakit.readers import Document, ReaderConfig, ReadStats, iter_path
from marin_assets.datakit.shards import join, reset_dir, shard_name, write_json

SCHEMA_FIELDS = ("id", "text", "source", "source_id", "metadata")


@dataclass(frozen=True)
class NormalizeConfig:
    source: str
    shard_docs: int = 100_000
    shard_bytes: int = 256 * 1024 * 1024
    reader: ReaderConfig = field(default_factory=ReaderConfig)

    def __post_init__(self):
        if not self.source or "/" in self.source:
            raise ValueError(f"NormalizeConfig.source must be a non-empty name without '/', got {self.source!r}")
        check_int("NormalizeConfig.shard_docs", self.shard_docs, 1)
        check_int("NormalizeConfig.shard_bytes", self.shard_bytes, 1)


def doc_id(text: str) -> str:
    import xxhash

    return xxhash.xxh3_128_hexdigest(text.encode("utf-8"))


def schema():
    import pyarrow as pa

    return pa.schema(
        [
            ("id", pa.string()),
            ("text", pa.large_string()),
            ("source", pa.string()),
            ("source_id", pa.string()),
            ("metadata", pa.string()),
        ]
    )


def _shard_table(rows: list[tuple[str, str, str, str]], source: str):
    import pyarrow as pa

    rows.sort(key=lambda r: (r[0], r[2]))  # by id, then source_id so equal texts are stable
    return pa.table(
        {
            "id": [r[0] for r in rows],
            "text": [r[1] for r in rows],
            "source": [source] * len(rows),
            "source_id": [r[2] for r in rows],
            "metadata": [r[3] for r in rows],
        },
        schema=schema(),
    )


def normalize_documents(
    items: Iterable[Document | QuarantineRecord], out_dir: str, config: NormalizeConfig, read_stats: ReadStats | None = None
) -> dict:
    """Write `items` as normalized shards + _quarantine.jsonl + _counts.json; return the counts.

    With `read_stats` (filled by the reader as it reads), docs_in is the number of records
    the reader met and a record that was neither kept nor quarantined is an error.
    """
    import fsspec
    import xxhash

    from marin_assets.datakit.shards import write_table

    fs, root = fsspec.core.url_to_fs(out_dir)
    reset_dir(out_dir)
    quarantine = QuarantineWriter(out_dir)
    temp_paths: list[str] = []
    rows: list[tuple[str, str, str, str]] = []
    rows_bytes = 0
    docs_out = 0
    text_bytes = 0

    def flush():
        nonlocal rows, rows_bytes
        if rows:
            path = join(out_dir, f"tmp-{len(temp_paths):05d}.parquet")
            write_table(_shard_table(rows, config.source), path)
            temp_paths.append(path)
        rows, rows_bytes = [], 0

    for item in items:
        if isinstance(item, QuarantineRecord):
            quarantine.write(item)
            continue
        data = item.utf8 if item.utf8 is not None else item.text.encode("utf-8")
        metadata = json.dumps(item.metadata, sort_keys=True) if item.metadata else "{}"  # the common case, ~10 us less
        rows.append((xxhash.xxh3_128_hexdigest(data), item.text, item.source_id, metadata))
        rows_bytes += len(data)
        text_bytes += len(data)
        docs_out += 1
        if len(rows) >= config.shard_docs or rows_bytes >= config.shard_bytes:
            flush()
    flush()

    # Only now is the shard count known: rename tmp-i to part-i-of-N.
    total = len(temp_paths)
    for i, path in enumerate(temp_paths):
        fs.mv(fsspec.core.url_to_fs(path)[1], fsspec.core.url_to_fs(join(out_dir, shard_name(i, total)))[1])
    reasons = quarantine.close()
    quarantined = sum(reasons.values())
    counts = {
        "source": config.source,
        "docs_in": read_stats.records if read_stats is not None else docs_out + quarantined,
        "docs_out": docs_out,
        "quarantined": quarantined,
        "quarantine_reasons": reasons,
        "shards": total,
        "text_bytes": text_bytes,
    }
    if read_stats is not None:
        counts["blank_lines"] = read_stats.blank_lines
    if counts["docs_in"] != counts["docs_out"] + counts["quarantined"]:
        raise RuntimeError(f"normalize {config.source}: records read != kept + quarantined: {counts}")
    write_json(counts, join(out_dir, "_counts.json"))
    return counts


def normalize(input_paths: list[str] | str, out_dir: str, config: NormalizeConfig) -> dict:
    """Read every file under `input_paths` (fsspec URLs / local dirs) and normalize them."""
    if isinstance(input_paths, str):
        input_paths = [input_paths]

    stats = ReadStats()

    def items():
        for path in input_paths:
            yield from iter_path(path, config.reader, stats)

    return normalize_documents(items(), out_dir, config, stats)


