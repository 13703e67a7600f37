"""One record, judged: what a reader yields (Document, DocumentBatch), how it is configured
(ReaderConfig), and the per-record rules that make a JSONL line or a Parquet row a Document
or a QuarantineRecord saying why not. No rule raises on a bad record.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from marin_assets.datakit.quarantine import QuarantineRecord
from marin_assets.knobs import knob
from marin_assets.numeric_checks import check_int

if TYPE_CHECKING:
    import pyarrow as pa  # imported where a batch is made: a reader of .txt files never needs it

UTF8_BOM = b"\xef\xbb\xbf"  # an editor's byte order mark: not part of the first record
# Deeper JSON is quarantined: far below Python's recursion limit, so serializing a kept
# record's metadata later can never overflow the stack.
MAX_JSON_DEPTH = 100


@dataclass(frozen=True)
class ReaderConfig:
    text_field: str = "text"
    # When a record carries this field its value becomes source_id; otherwise "<file>:<line>".
    id_field: str = "id"
    # Marin shards are ~256 MiB; one document should never be a sizeable fraction of a shard.
    max_doc_bytes: int = knob(16 * 1024 * 1024, help="documents larger than this many UTF-8 bytes are quarantined as too_large")
    parquet_batch_rows: int = 4096
    # Which extractor turns a web page (.warc, .html) into text; not in the version of a shard
    # that holds no page (assets/datakit/normalized.py adds it to those that do).
    extractor: str = knob(
        "resiliparse", help="HTML main-text extractor for .warc/.html inputs: resiliparse or trafilatura", versioned=False
    )

    def __post_init__(self):
        if not isinstance(self.text_field, str) or not self.text_field:
            raise ValueError("ReaderConfig.text_field must be a non-empty column name")
        if not isinstance(self.id_field, str) or not self.id_field:
            raise ValueError("ReaderConfig.id_field must be a non-empty column name")
        check_int("ReaderConfig.max_doc_bytes", self.max_doc_bytes, 1)
        check_int("ReaderConfig.parquet_batch_rows", self.parquet_batch_rows, 1)
        if self.extractor not in ("resiliparse", "trafilatura"):
            raise ValueError(f"ReaderConfig.extractor must be resiliparse or trafilatura, got {self.extractor!r}")

    @property
    def max_line_bytes(self) -> int:
        """The longest JSONL line worth parsing (and the most a reader buffers): JSON escapes
        take at most 6 bytes per text byte (\\u001f), plus 64 KiB for the other fields."""
        return 6 * self.max_doc_bytes + 65536


@dataclass
class Document:
    text: str
    source_id: str
    metadata: dict = field(default_factory=dict)
    file: str = ""
    line: int | None = None
    # The text's UTF-8 bytes when the reader already has them (normalize hashes them).
    utf8: bytes | None = field(default=None, repr=False, compare=False)


@dataclass
class DocumentBatch:
    """Consecutive records of one file, column-wise, that all passed the per-record rules and
    have no fields besides text and id: exactly the Documents (empty metadata) the per-record
    path makes of them, in the same order, without a Python object per record."""

    text: pa.Array  # large_string, valid UTF-8, no nulls
    source_id: pa.Array  # string, no nulls
    lines: Sequence[int]  # each record's line (JSONL) or row (Parquet), 1-based
    file: str

    def __len__(self) -> int:
        return len(self.text)

    def documents(self) -> Iterator[Document]:
        for text, source_id, line in zip(self.text.to_pylist(), self.source_id.to_pylist(), self.lines, strict=True):
            yield Document(text, source_id, {}, self.file, line)


def check_text(text, file: str, line: int | None, config: ReaderConfig) -> QuarantineRecord | bytes:
    """The text's UTF-8 bytes if it can be a document, else why not (first failing rule wins:
    missing_text, nul_bytes, empty_text, too_large, invalid_utf8). The bytes are encoded
    once here and reused for the id hash, instead of once per check and once more later."""
    if not isinstance(text, str):
        return QuarantineRecord(file, line, "missing_text", f"field {config.text_field!r} is {type(text).__name__}")
    if "\x00" in text:
        return QuarantineRecord(file, line, "nul_bytes", "text contains NUL characters")
    if not text or text.isspace():  # what `not text.strip()` says, without copying the text
        return QuarantineRecord(file, line, "empty_text", "")
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as e:  # lone surrogates from \ud800 escapes in JSON
        size = len(text.encode("utf-8", errors="surrogatepass"))
        if size > config.max_doc_bytes:
            return QuarantineRecord(file, line, "too_large", f"{size} bytes > max_doc_bytes={config.max_doc_bytes}")
        return QuarantineRecord(file, line, "invalid_utf8", f"field {config.text_field!r}: {e}"[:200])
    if len(data) > config.max_doc_bytes:
        return QuarantineRecord(file, line, "too_large", f"{len(data)} bytes > max_doc_bytes={config.max_doc_bytes}")
    return data


def source_id_of(value, file: str, line: int | None, config: ReaderConfig) -> str | QuarantineRecord:
    """The record's id as a string (str or int ids), or a quarantine record for other types."""
    if value is None:
        return f"{short_name(file)}:{line}" if line is not None else short_name(file)
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return str(value)
    return QuarantineRecord(
        file, line, "invalid_field", f"field {config.id_field!r} is {type(value).__name__}, not a string or integer"
    )


def short_name(file: str) -> str:
    """The file's last path component: what a record without an id is named after."""
    return file.rstrip("/").rsplit("/", 1)[-1]


def parse_jsonl_line(raw: bytes, file: str, lineno: int, config: ReaderConfig) -> Document | QuarantineRecord:
    """One non-blank line -> a Document, or a QuarantineRecord saying why not (never raises)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return QuarantineRecord(file, lineno, "invalid_utf8", str(e)[:200])
    try:
        record = json.loads(line)
    except RecursionError:
        return QuarantineRecord(file, lineno, "malformed_json", "nested too deeply to parse")
    except ValueError as e:  # JSONDecodeError, and integers over Python's digit limit
        return QuarantineRecord(file, lineno, "malformed_json", str(e)[:200])
    if not isinstance(record, dict):
        return QuarantineRecord(file, lineno, "malformed_json", f"expected an object, got {type(record).__name__}")
    problem = _json_problem(record)
    if problem is not None:
        reason = "invalid_utf8" if "surrogate" in problem else "malformed_json"
        return QuarantineRecord(file, lineno, reason, problem)
    text = record.pop(config.text_field, None)
    data = check_text(text, file, lineno, config)
    if isinstance(data, QuarantineRecord):
        return data
    source_id = source_id_of(record.pop(config.id_field, None), file, lineno, config)
    if isinstance(source_id, QuarantineRecord):
        return source_id
    return Document(text, source_id, record, file, lineno, data)


def parquet_row(record: dict, file: str, row: int, config: ReaderConfig) -> Document | QuarantineRecord:
    """One Parquet row (as a dict holding the text column) -> a Document, or why not."""
    text = record.pop(config.text_field)
    data = check_text(text, file, row, config)
    if isinstance(data, QuarantineRecord):
        return data
    source_id = source_id_of(record.pop(config.id_field, None), file, row, config)
    if isinstance(source_id, QuarantineRecord):
        return source_id
    try:
        metadata = _jsonable(record)
    except (ValueError, TypeError, RecursionError) as e:
        return QuarantineRecord(file, row, "invalid_field", f"metadata is not JSON-serializable: {e}"[:200])
    return Document(text, source_id, metadata, file, row, data)


def _json_problem(record) -> str | None:
    """Why a parsed JSON value cannot be stored: nesting deeper than MAX_JSON_DEPTH, or a lone
    surrogate (a \\ud800 escape) in any key or string. Iterative, so depth cannot overflow;
    scalars are checked in place and ASCII strings in O(1), so a flat record costs little."""
    stack = [(record, 1)]
    while stack:
        container, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return f"nested deeper than {MAX_JSON_DEPTH} levels"
        if type(container) is dict:
            for key in container:
                if not _encodable(key):
                    return f"key {key!r} is not valid UTF-8 (lone surrogate)"
            items = container.values()
        else:
            items = container
        for item in items:
            if type(item) is str:
                if not _encodable(item):
                    return f"a string value is not valid UTF-8 (lone surrogate): {item[:40]!r}"
            elif type(item) is dict or type(item) is list:
                stack.append((item, depth + 1))
    return None


def _encodable(text: str) -> bool:
    if text.isascii():  # O(1) in CPython; a surrogate is never ASCII
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _jsonable(record: dict) -> dict:
    return json.loads(json.dumps(record, default=str))
