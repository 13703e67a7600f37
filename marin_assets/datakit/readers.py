"""Read users' documents from any fsspec path: .jsonl, .jsonl.gz, .jsonl.zst, .parquet, .txt.

The reader never drops a record silently. Every record it meets becomes either a Document
or a QuarantineRecord (file, line, reason), so `records in = kept + quarantined` holds for
every file. A whole-file failure (truncated Parquet footer, binary blob, unknown type)
counts as one quarantined record with line=None; a truncated gzip/zstd stream keeps the
lines read before the break and quarantines the break itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field

from marin_assets.datakit.quarantine import QuarantineRecord

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
SUPPORTED_SUFFIXES = JSONL_SUFFIXES + (".parquet", ".txt")
SNIFF_BYTES = 8192


@dataclass(frozen=True)
class ReaderConfig:
    text_field: str = "text"
    # When a record carries this field its value becomes source_id; otherwise "<file>:<line>".
    id_field: str = "id"
    # Documents above this many UTF-8 bytes are quarantined as too_large (Marin shards are
    # ~256 MiB; one document should never be a sizeable fraction of a shard).
    max_doc_bytes: int = 16 * 1024 * 1024
    parquet_batch_rows: int = 4096

    def __post_init__(self):
        if not self.text_field:
            raise ValueError("ReaderConfig.text_field must be a non-empty column name")
        if self.max_doc_bytes <= 0:
            raise ValueError(f"ReaderConfig.max_doc_bytes must be > 0, got {self.max_doc_bytes}")
        if self.parquet_batch_rows <= 0:
            raise ValueError(f"ReaderConfig.parquet_batch_rows must be > 0, got {self.parquet_batch_rows}")


@dataclass
class Document:
    text: str
    source_id: str
    metadata: dict = field(default_factory=dict)
    file: str = ""
    line: int | None = None


def list_input_files(path: str) -> list[str]:
    """All files under `path` (a file or a directory, any fsspec URL), sorted, as URLs.

    Inside a directory, names starting with "_" or "." are sidecars and are not listed.
    """
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    if not fs.exists(root):
        raise FileNotFoundError(f"input path does not exist: {path}")
    if fs.isdir(root):
        # Names starting with "_" or "." are sidecars (_counts.json, _SUCCESS, .DS_Store), as in
        # Hadoop/Spark layouts; everything else is read or quarantined.
        files = sorted(p for p in fs.find(root) if not _is_sidecar(p[len(root) :]))
    else:
        files = [root]
    return [fs.unstrip_protocol(p) if not _is_local(fs) else p for p in files]


def _is_sidecar(relative: str) -> bool:
    return any(part.startswith(("_", ".")) for part in relative.strip("/").split("/"))


def _is_local(fs) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def looks_binary(head: bytes) -> bool:
    """A NUL byte plus a high share of control bytes: a blob, not text with one stray NUL."""
    if not head or b"\x00" not in head:
        return False
    control = sum(1 for b in head if b < 9 or 13 < b < 32)
    return control / len(head) > 0.05


def iter_path(path: str, config: ReaderConfig = ReaderConfig()) -> Iterator[Document | QuarantineRecord]:
    for file in list_input_files(path):
        yield from iter_file(file, config)


def iter_file(file: str, config: ReaderConfig = ReaderConfig()) -> Iterator[Document | QuarantineRecord]:
    name = file.lower()
    if name.endswith(".parquet"):
        yield from _iter_parquet(file, config)
    elif name.endswith(".txt"):
        yield from _iter_txt(file, config)
    elif name.endswith(JSONL_SUFFIXES):
        yield from _iter_jsonl(file, config)
    else:
        yield QuarantineRecord(file, None, "unsupported_file_type", f"expected one of {SUPPORTED_SUFFIXES}")


def _check_text(text, file: str, line: int | None, config: ReaderConfig) -> QuarantineRecord | None:
    if not isinstance(text, str):
        return QuarantineRecord(file, line, "missing_text", f"field {config.text_field!r} is {type(text).__name__}")
    if "\x00" in text:
        return QuarantineRecord(file, line, "nul_bytes", "text contains NUL characters")
    if not text.strip():
        return QuarantineRecord(file, line, "empty_text", "")
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > config.max_doc_bytes:
        return QuarantineRecord(file, line, "too_large", f"{size} bytes > max_doc_bytes={config.max_doc_bytes}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # lone surrogates from \ud800 escapes in JSON
        return QuarantineRecord(file, line, "invalid_utf8", str(e)[:200])
    return None


def _short(file: str) -> str:
    return file.rstrip("/").rsplit("/", 1)[-1]


def _iter_jsonl(file: str, config: ReaderConfig) -> Iterator[Document | QuarantineRecord]:
    lineno = 0
    pending = b""
    first = True
    try:
        for chunk in _byte_chunks(file):
            if first:
                first = False
                if looks_binary(chunk[:SNIFF_BYTES]):
                    yield QuarantineRecord(file, None, "binary_file", "NUL and control bytes in the first 8 KiB")
                    return
            pending += chunk
            if b"\n" not in chunk:
                continue  # a long line still being read: don't rescan it per chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                lineno += 1
                item = _parse_jsonl_line(raw, file, lineno, config)
                if item is not None:
                    yield item
        if pending:
            lineno += 1
            item = _parse_jsonl_line(pending, file, lineno, config)
            if item is not None:
                yield item
    except Exception as e:  # noqa: BLE001 - gzip: EOFError/BadGzipFile/zlib.error; zstandard: ZstdError
        if not isinstance(e, (EOFError, OSError, ValueError)) and type(e).__name__ != "ZstdError":
            raise
        # Nothing decoded at all means the file is not what its name says; otherwise it broke off.
        reason = "truncated_file" if isinstance(e, EOFError) or lineno > 0 or pending else "unreadable_file"
        yield QuarantineRecord(file, lineno + 1, reason, f"{type(e).__name__}: {e}"[:300])


def _byte_chunks(file: str, size: int = 1 << 20) -> Iterator[bytes]:
    """Decompressed bytes of a .jsonl / .jsonl.gz / .jsonl.zst file, in chunks."""
    import fsspec

    if file.endswith(".zst"):
        with fsspec.open(file, "rb") as raw:
            yield from _zstd_chunks(raw, size)
        return
    with fsspec.open(file, "rb") as f:
        if file.endswith(".gz"):
            yield from _gzip_chunks(f, size)
            return
        while chunk := f.read(size):
            yield chunk


def _gzip_chunks(raw, size: int) -> Iterator[bytes]:
    """Stream-decompress gzip so every byte before a cut is yielded, then raise EOFError."""
    import zlib

    def new():
        return zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip header and trailer

    dobj, fed = new(), False
    while data := raw.read(size):
        while data:
            try:
                out = dobj.decompress(data)
            except zlib.error as e:
                raise ValueError(f"not valid gzip data: {e}") from e
            fed = True
            if out:
                yield out
            if dobj.eof:  # a member ended; gzip files may hold several
                data = dobj.unused_data
                dobj, fed = new(), False
            else:
                data = b""
    if fed and not dobj.eof:
        raise EOFError("gzip stream ended before its end-of-stream marker")


def _zstd_chunks(raw, size: int) -> Iterator[bytes]:
    """zstandard's stream reader ends quietly on a cut-off frame; this raises EOFError instead."""
    import zstandard

    dctx = zstandard.ZstdDecompressor()
    dobj, fed = dctx.decompressobj(), False
    while data := raw.read(size):
        while data:
            out = dobj.decompress(data)
            fed = True
            if out:
                yield out
            if dobj.eof:  # a frame ended; more frames may follow in the same file
                data = dobj.unused_data
                dobj, fed = dctx.decompressobj(), False
            else:
                data = b""
    if fed and not dobj.eof:
        raise EOFError("zstd stream ended in the middle of a frame")


def _parse_jsonl_line(raw: bytes, file: str, lineno: int, config: ReaderConfig):
    if not raw.strip():
        return None  # a blank line is not a record
    if len(raw) > config.max_doc_bytes * 2 + 1024:
        # Even with JSON escaping the text cannot fit under the limit; skip decoding it.
        return QuarantineRecord(file, lineno, "too_large", f"line of {len(raw)} bytes")
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return QuarantineRecord(file, lineno, "invalid_utf8", str(e)[:200])
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        return QuarantineRecord(file, lineno, "malformed_json", str(e)[:200])
    if not isinstance(record, dict):
        return QuarantineRecord(file, lineno, "malformed_json", f"expected an object, got {type(record).__name__}")
    text = record.pop(config.text_field, None)
    bad = _check_text(text, file, lineno, config)
    if bad is not None:
        return bad
    source_id = record.pop(config.id_field, None)
    source_id = str(source_id) if source_id is not None else f"{_short(file)}:{lineno}"
    return Document(text, source_id, record, file, lineno)


def _iter_txt(file: str, config: ReaderConfig) -> Iterator[Document | QuarantineRecord]:
    import fsspec

    fs, path = fsspec.core.url_to_fs(file)
    size = fs.size(path)
    if size is not None and size > config.max_doc_bytes:
        yield QuarantineRecord(file, None, "too_large", f"{size} bytes > max_doc_bytes={config.max_doc_bytes}")
        return
    with fs.open(path, "rb") as f:
        raw = f.read()
    if looks_binary(raw[:SNIFF_BYTES]):
        yield QuarantineRecord(file, None, "binary_file", "NUL and control bytes in the first 8 KiB")
        return
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        yield QuarantineRecord(file, None, "invalid_utf8", str(e)[:200])
        return
    bad = _check_text(text, file, None, config)
    yield bad if bad is not None else Document(text, _short(file), {}, file, None)


def _iter_parquet(file: str, config: ReaderConfig) -> Iterator[Document | QuarantineRecord]:
    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq

    with fsspec.open(file, "rb") as f:
        try:
            pf = pq.ParquetFile(f)
        except (pa.ArrowInvalid, pa.ArrowException, OSError) as e:
            yield QuarantineRecord(file, None, "truncated_file", f"not a readable Parquet file: {e}"[:300])
            return
        if config.text_field not in pf.schema_arrow.names:
            yield QuarantineRecord(file, None, "missing_text", f"no column {config.text_field!r}")
            return
        row = 0
        try:
            for batch in pf.iter_batches(batch_size=config.parquet_batch_rows):
                for record in batch.to_pylist():
                    row += 1
                    text = record.pop(config.text_field)
                    bad = _check_text(text, file, row, config)
                    if bad is not None:
                        yield bad
                        continue
                    source_id = record.pop(config.id_field, None)
                    source_id = str(source_id) if source_id is not None else f"{_short(file)}:{row}"
                    yield Document(text, source_id, _jsonable(record), file, row)
        except (pa.ArrowInvalid, pa.ArrowException, OSError) as e:
            yield QuarantineRecord(file, row + 1, "truncated_file", f"{type(e).__name__}: {e}"[:300])


def _jsonable(record: dict) -> dict:
    return json.loads(json.dumps(record, default=str))
