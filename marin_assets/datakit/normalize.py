"""Normalize: raw documents from any reader -> Parquet shards with the DataKit contract.

Columns: id (xxh3-128 hex of the UTF-8 text), text, source, source_id, metadata (JSON).
Rows keep the order of the input (files in sorted order, records in file order), so a
document's place in the corpus is its (shard, row) here and its (shard key, row) in the
sharded graph alike (fuzzy dedup keeps the earliest copy). Files are
part-00000-of-000NN.parquet; a shard closes when it reaches `shard_docs` documents or
`shard_bytes` bytes of text, whichever comes first, so memory stays bounded by one shard.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from marin_assets.datakit.arrow_strings import repeated_string, string_array
from marin_assets.datakit.quarantine import QuarantineRecord, QuarantineWriter
from marin_assets.datakit.readers import Document, DocumentBatch, ReaderConfig, ReadStats, iter_path
from marin_assets.datakit.shards import join, reset_dir, shard_name, write_json, write_table
from marin_assets.numeric_checks import check_int

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


def doc_ids(texts) -> list[str]:
    """doc_id of every string of a pyarrow (large_)string Array, hashed from Arrow's UTF-8
    buffer in place (no Python string per text)."""
    import xxhash

    bounds = _offsets(texts).tolist()
    data_buffer = texts.buffers()[2]
    data = memoryview(data_buffer) if data_buffer is not None else memoryview(b"")
    digest = xxhash.xxh3_128_hexdigest
    return [digest(data[a:b]) for a, b in zip(bounds, bounds[1:])]


def _offsets(texts):
    """The len+1 byte offsets of a pyarrow (large_)string Array's strings in its data buffer
    (read from the buffer: to_numpy() and pa.compute calls that convert would import pandas)."""
    import numpy as np

    width = np.int64 if texts.type == "large_string" else np.int32
    if texts.buffers()[1] is None:  # an empty array may have no offsets buffer
        return np.zeros(len(texts) + 1, dtype=np.int64)
    return np.frombuffer(texts.buffers()[1], dtype=width)[texts.offset : texts.offset + len(texts) + 1].astype(np.int64)


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


class _OpenShard:
    """The rows of the shard being filled, in arrival order, as Arrow column chunks.

    Single Documents collect in Python lists (one chunk when a batch or the flush comes);
    DocumentBatches are split at the row where the per-document rule closes the shard
    (`shard_docs` rows or `shard_bytes` bytes reached), so shards are the same either way.
    """

    def __init__(self, config: NormalizeConfig):
        self.config = config
        self.parts: list = []  # pyarrow Tables: id, text, source_id, metadata
        self.rows: list[tuple[str, bytes, str, str]] = []
        self.docs = 0
        self.bytes = 0

    def full(self) -> bool:
        return self.docs >= self.config.shard_docs or self.bytes >= self.config.shard_bytes

    def add_document(self, doc_hash: str, utf8: bytes, source_id: str, metadata: str) -> None:
        """One document, its text as the UTF-8 bytes the reader checked (not encoded again)."""
        self.rows.append((doc_hash, utf8, source_id, metadata))
        self.docs += 1
        self.bytes += len(utf8)

    def add_rows(self, part, sizes) -> int:
        """Take rows of `part` (a Table) from the front until the shard is full; return how many."""
        import numpy as np

        cum = np.cumsum(sizes)
        by_bytes = int(np.searchsorted(cum, self.config.shard_bytes - self.bytes, side="left")) + 1
        take = min(len(sizes), self.config.shard_docs - self.docs, by_bytes)
        self._rows_to_part()
        self.parts.append(part.slice(0, take))
        self.docs += take
        self.bytes += int(cum[take - 1])
        return take

    def _rows_to_part(self) -> None:
        import pyarrow as pa

        if self.rows:
            ids, texts, source_ids, metadata = zip(*self.rows)
            columns = [
                string_array(ids),
                string_array(texts, large=True, utf8=True),
                string_array(source_ids),
                string_array(metadata),
            ]
            self.parts.append(pa.Table.from_arrays(columns, schema=_part_schema()))
            self.rows = []

    def take_table(self, source: str):
        """The shard's rows in arrival order (corpus order: see the module docstring)."""
        import pyarrow as pa

        self._rows_to_part()
        table = pa.concat_tables(self.parts) if len(self.parts) > 1 else self.parts[0]
        self.parts, self.docs, self.bytes = [], 0, 0
        source_column = repeated_string(source, table.num_rows)
        columns = [table.column("id"), table.column("text"), source_column, table.column("source_id"), table.column("metadata")]
        return pa.Table.from_arrays(columns, schema=schema())


def _part_schema():
    import pyarrow as pa

    return pa.schema([("id", pa.string()), ("text", pa.large_string()), ("source_id", pa.string()), ("metadata", pa.string())])


def _batch_table(batch: DocumentBatch):
    """A DocumentBatch as a part of the open shard: its ids hashed, metadata "{}"."""
    import pyarrow as pa

    columns = [string_array(doc_ids(batch.text)), batch.text, batch.source_id, repeated_string("{}", len(batch))]
    return pa.Table.from_arrays(columns, schema=_part_schema())


def normalize_documents(
    items: Iterable[Document | DocumentBatch | QuarantineRecord],
    out_dir: str,
    config: NormalizeConfig,
    read_stats: ReadStats | None = None,
) -> dict:
    """Write `items` as normalized shards + _quarantine.jsonl + _counts.json; return the counts.

    With `read_stats` (filled by the reader as it reads), docs_in is the number of records
    the reader met and a record that was neither kept nor quarantined is an error.
    """
    import fsspec
    import numpy as np
    import xxhash

    fs, root = fsspec.core.url_to_fs(out_dir)
    reset_dir(out_dir)
    quarantine = QuarantineWriter(out_dir)
    temp_paths: list[str] = []
    shard = _OpenShard(config)
    docs_out = 0
    text_bytes = 0

    def flush():
        if shard.docs:
            path = join(out_dir, f"tmp-{len(temp_paths):05d}.parquet")
            write_table(shard.take_table(config.source), path)
            temp_paths.append(path)

    for item in items:
        if isinstance(item, QuarantineRecord):
            quarantine.write(item)
            continue
        if isinstance(item, DocumentBatch):
            part = _batch_table(item)
            sizes = np.diff(_offsets(item.text))  # UTF-8 bytes per text
            docs_out += len(item)
            text_bytes += int(sizes.sum())
            while part.num_rows:
                taken = shard.add_rows(part, sizes)
                part, sizes = part.slice(taken), sizes[taken:]
                if shard.full():
                    flush()
            continue
        data = item.utf8 if item.utf8 is not None else item.text.encode("utf-8")
        metadata = json.dumps(item.metadata, sort_keys=True) if item.metadata else "{}"  # the common case, ~10 us less
        shard.add_document(xxhash.xxh3_128_hexdigest(data), data, item.source_id, metadata)
        text_bytes += len(data)
        docs_out += 1
        if shard.full():
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
        if read_stats.other_records:
            counts["warc_other_records"] = read_stats.other_records  # warcinfo, request, metadata: no page
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
            yield from iter_path(path, config.reader, stats, batches=True)

    return normalize_documents(items(), out_dir, config, stats)
