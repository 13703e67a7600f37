"""Read users' documents from any fsspec path: .jsonl, .jsonl.gz, .jsonl.zst, .parquet, .txt,
and web pages: .warc, .warc.gz and .html (web.py extracts their main text).

This module reads each format (JSONL lines through byte_streams' decompression, Parquet
batches, a .txt file whole; the BOM; whole-file failures) and counts the records. Its
neighbours hold the rest: which files a path holds (input_scan.py), what makes one record a
Document (records.py), the Arrow fast path (arrow_batches.py). The names other code imports
from here are re-exported.

The reader never drops a record silently. Every record it meets becomes either a Document
or a QuarantineRecord (file, line, reason), so `records in = kept + quarantined` holds for
every file; ReadStats counts the records where they are read, so callers can check that.
A per-line failure of any kind (bad UTF-8, bad JSON, a 5,000-digit integer, nesting deeper
than MAX_JSON_DEPTH, a lone surrogate in any field, an id of the wrong type) costs that line
only. A whole-file failure (truncated Parquet footer, binary blob, unknown type) counts as
one quarantined record with line=None; a truncated gzip/zstd stream keeps the lines read
before the break and quarantines the break itself.

Memory is bounded by the record limit, not by the input: decompression returns at most one
chunk per call, and a line longer than `max_line_bytes` is skipped up to its newline
without being buffered.

Fast path (arrow_batches.py): JSONL lines and Parquet rows are read a batch at a time, and a
batch of good records comes out as one DocumentBatch; the result is the same record for record.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from marin_assets.datakit.arrow_batches import PY_WHITESPACE, fast_batch, jsonl_records
from marin_assets.datakit.arrow_strings import repeated_string, string_array
from marin_assets.datakit.byte_streams import byte_chunks, split_lines
from marin_assets.datakit.input_scan import list_input_files, local_entry_problem, scan_input, shown_name
from marin_assets.datakit.parquet_pages import oversized_page
from marin_assets.datakit.quarantine import QuarantineRecord
from marin_assets.datakit.records import (
    MAX_JSON_DEPTH,
    UTF8_BOM,
    Document,
    DocumentBatch,
    ReaderConfig,
    check_text,
    parquet_row,
    short_name,
)
from marin_assets.datakit.web import HTML_SUFFIXES, WARC_SUFFIXES, iter_html, iter_warc

__all__ = [
    "JSONL_SUFFIXES",
    "MAX_JSON_DEPTH",
    "PY_WHITESPACE",
    "SUPPORTED_SUFFIXES",
    "Document",
    "DocumentBatch",
    "ReadStats",
    "ReaderConfig",
    "iter_file",
    "iter_path",
    "list_input_files",
    "local_entry_problem",
    "looks_binary",
    "repeated_string",
    "scan_input",
    "shown_name",
    "string_array",
]

_check_text = check_text  # the name tests/datakit/test_reader_robustness.py imports from here

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
SUPPORTED_SUFFIXES = JSONL_SUFFIXES + (".parquet", ".txt") + WARC_SUFFIXES + HTML_SUFFIXES
SNIFF_BYTES = 8192
# A JSONL batch holds at most this many bytes (plus one line of at most max_line_bytes) or lines.
BATCH_BYTES = 4 << 20
BATCH_LINES = 16384
_DEFAULT_CONFIG = ReaderConfig()  # frozen: one shared default, as a default argument would be


@dataclass
class ReadStats:
    """What a reader met, counted where it reads (not where it yields), so that
    `records == kept + quarantined` is a check on the reader rather than a definition."""

    records: int = 0  # non-blank JSONL lines, Parquet rows, .txt files, whole-file failures
    blank_lines: int = 0  # blank JSONL lines: not records
    other_records: int = 0  # WARC records that hold no page (warcinfo, request, metadata): not records


def looks_binary(head: bytes) -> bool:
    """A NUL byte plus a high share of control bytes: a blob, not text with one stray NUL."""
    if not head or b"\x00" not in head:
        return False
    control = sum(1 for b in head if b < 9 or 13 < b < 32)
    return control / len(head) > 0.05


def iter_path(
    path: str, config: ReaderConfig = _DEFAULT_CONFIG, stats: ReadStats | None = None, batches: bool = False
) -> Iterator[Document | DocumentBatch | QuarantineRecord]:
    for file in list_input_files(path):
        yield from iter_file(file, config, stats, batches)


def iter_file(
    file: str, config: ReaderConfig = _DEFAULT_CONFIG, stats: ReadStats | None = None, batches: bool = False, fast: bool = True
) -> Iterator[Document | DocumentBatch | QuarantineRecord]:
    """Every record of `file` as a Document or a QuarantineRecord; nothing per record raises.

    With `batches`, runs of good records may come as DocumentBatch (what normalize wants);
    without, they are unpacked into Documents. `fast=False` reads record by record only
    (the reference the fast path is tested against).
    """
    stats = stats if stats is not None else ReadStats()
    name = file.lower()
    if name.endswith(".parquet"):
        items = _iter_parquet(file, config, stats, fast)
    elif name.endswith(".txt"):
        items = _iter_txt(file, config, stats)
    elif name.endswith(JSONL_SUFFIXES):
        items = _iter_jsonl(file, config, stats, fast)
    elif name.endswith(WARC_SUFFIXES):
        items = iter_warc(file, config, stats)
    elif name.endswith(HTML_SUFFIXES):
        items = iter_html(file, config, stats)
    else:
        stats.records += 1
        items = iter([QuarantineRecord(file, None, "unsupported_file_type", f"expected one of {SUPPORTED_SUFFIXES}")])
    for item in items:
        if isinstance(item, DocumentBatch) and not batches:
            yield from item.documents()
        else:
            yield item


def _iter_jsonl(
    file: str, config: ReaderConfig, stats: ReadStats, fast: bool = True
) -> Iterator[Document | DocumentBatch | QuarantineRecord]:
    lineno = 0
    first = True
    pending: list[bytes] = []  # non-blank lines not yet parsed, a batch at a time
    pending_lines: list[int] = []
    pending_bytes = 0

    def drain():
        nonlocal pending, pending_lines, pending_bytes
        yield from jsonl_records(pending, pending_lines, pending_bytes, file, config, fast)
        pending, pending_lines, pending_bytes = [], [], 0

    try:
        for piece in split_lines(byte_chunks(file), config.max_line_bytes):
            if first:
                first = False
                if isinstance(piece, bytes) and piece.startswith(UTF8_BOM):  # an editor's BOM is not part of record 1
                    piece = piece[len(UTF8_BOM) :]
                head = piece[:SNIFF_BYTES] if isinstance(piece, bytes) else b""
                if looks_binary(head):
                    stats.records += 1
                    yield QuarantineRecord(file, None, "binary_file", "NUL and control bytes in the first 8 KiB")
                    return
            lineno += 1
            if isinstance(piece, int):  # a line over the limit, skipped without being buffered
                stats.records += 1
                yield from drain()
                yield QuarantineRecord(file, lineno, "too_large", f"line of {piece} bytes > {config.max_line_bytes}")
                continue
            if not piece.strip():
                stats.blank_lines += 1  # a blank line is not a record
                continue
            stats.records += 1
            pending.append(piece)
            pending_lines.append(lineno)
            pending_bytes += len(piece)
            if pending_bytes >= BATCH_BYTES or len(pending) >= BATCH_LINES:
                yield from drain()
        yield from drain()
    except Exception as e:  # noqa: BLE001 - gzip: EOFError/BadGzipFile/zlib.error; zstandard: ZstdError
        if not isinstance(e, (EOFError, OSError, ValueError)) and type(e).__name__ != "ZstdError":
            raise
        yield from drain()  # the lines read before the break are kept
        # Nothing decoded at all means the file is not what its name says; otherwise it broke off.
        reason = "truncated_file" if isinstance(e, EOFError) or lineno > 0 else "unreadable_file"
        stats.records += 1  # the break itself: one record that could not be read
        yield QuarantineRecord(file, lineno + 1, reason, f"{type(e).__name__}: {e}"[:300])


def _iter_txt(file: str, config: ReaderConfig, stats: ReadStats) -> Iterator[Document | QuarantineRecord]:
    import fsspec

    stats.records += 1  # a .txt file is one document
    fs, path = fsspec.core.url_to_fs(file)
    size = fs.size(path)
    if size is not None and size > config.max_doc_bytes:
        yield QuarantineRecord(file, None, "too_large", f"{size} bytes > max_doc_bytes={config.max_doc_bytes}")
        return
    with fs.open(path, "rb") as f:
        raw = f.read(config.max_doc_bytes + 1)  # a size the filesystem did not report is still bounded
    if len(raw) > config.max_doc_bytes:
        yield QuarantineRecord(file, None, "too_large", f"more than max_doc_bytes={config.max_doc_bytes} bytes")
        return
    if looks_binary(raw[:SNIFF_BYTES]):
        yield QuarantineRecord(file, None, "binary_file", "NUL and control bytes in the first 8 KiB")
        return
    try:
        text = raw.removeprefix(UTF8_BOM).decode("utf-8")
    except UnicodeDecodeError as e:
        yield QuarantineRecord(file, None, "invalid_utf8", str(e)[:200])
        return
    data = check_text(text, file, None, config)
    yield data if isinstance(data, QuarantineRecord) else Document(text, short_name(file), {}, file, None, data)


def _iter_parquet(
    file: str, config: ReaderConfig, stats: ReadStats, fast: bool = True
) -> Iterator[Document | DocumentBatch | QuarantineRecord]:
    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq

    with fsspec.open(file, "rb") as f:
        try:
            pf = pq.ParquetFile(f)
        except (pa.ArrowInvalid, pa.ArrowException, OSError) as e:
            stats.records += 1
            yield QuarantineRecord(file, None, "truncated_file", f"not a readable Parquet file: {e}"[:300])
            return
        if config.text_field not in pf.schema_arrow.names:
            stats.records += 1
            yield QuarantineRecord(file, None, "missing_text", f"no column {config.text_field!r}")
            return
        row = 0
        try:
            for run, refused in _row_group_runs(f, pf.metadata, config.max_line_bytes):
                if refused is not None:  # too large to decompress: every row counted, none read
                    n = pf.metadata.row_group(run[0]).num_rows
                    stats.records += n
                    yield from _refused_rows(file, run[0], range(row + 1, row + n + 1), refused)
                    row += n
                    continue
                for batch in pf.iter_batches(batch_size=config.parquet_batch_rows, row_groups=run):
                    rows = range(row + 1, row + batch.num_rows + 1)
                    batch_doc = (
                        fast_batch(pa.Table.from_batches([batch]), rows, file, config) if fast and batch.num_rows else None
                    )
                    if batch_doc is not None:
                        stats.records += batch.num_rows
                        row += batch.num_rows
                        yield batch_doc
                        continue
                    records = batch.to_pylist()
                    stats.records += len(records)
                    for record in records:
                        row += 1
                        yield parquet_row(record, file, row, config)
        except (pa.ArrowInvalid, pa.ArrowException, OSError, ValueError) as e:  # ValueError: a page header
            stats.records += 1
            yield QuarantineRecord(file, row + 1, "truncated_file", f"{type(e).__name__}: {e}"[:300])


def _refused_rows(file: str, group: int, rows: range, why: str) -> Iterator[QuarantineRecord]:
    where = f"row group {group} (rows {rows.start}-{rows.stop - 1})"
    for row in rows:
        yield QuarantineRecord(file, row, "too_large", f"{where}: {why}; its rows are not read"[:300])


def _row_group_runs(f, metadata, limit: int) -> Iterator[tuple[list[int], str | None]]:
    """The file's row groups in order, as (run of consecutive readable ones, None) and
    ([one that is not], why): one with a page over `limit` bytes uncompressed
    (parquet_pages.oversized_page), which Arrow would decompress whole to read any of its rows."""
    run: list[int] = []
    for index in range(metadata.num_row_groups):
        refused = oversized_page(f, metadata.row_group(index), limit)
        if refused is None:
            run.append(index)
            continue
        if run:
            yield run, None
            run = []
        yield [index], refused
    if run:
        yield run, None
