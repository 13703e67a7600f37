"""Read users' documents from any fsspec path: .jsonl, .jsonl.gz, .jsonl.zst, .parquet, .txt.

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

Fast path: JSONL lines and Parquet rows are read a batch at a time (Arrow parses and checks
whole columns) and come out as one DocumentBatch when every record of the batch passes the
same rules and carries only the text and id fields. Any batch that does not (one bad line, a
metadata field, an id type Arrow cannot take) goes through the per-record path instead, so
the result is the same record for record; the fast path only decides how fast it gets there.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from marin_assets.numeric_checks import check_int
from marin_assets.datakit.byte_streams import byte_chunks, split_lines
from marin_assets.datakit.quarantine import QuarantineRecord
from marin_assets.knobs import knob

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
SUPPORTED_SUFFIXES = JSONL_SUFFIXES + (".parquet", ".txt")
SNIFF_BYTES = 8192
UTF8_BOM = b"\xef\xbb\xbf"
# Deeper JSON is quarantined: far below Python's recursion limit, so serializing a kept
# record's metadata later can never overflow the stack.
MAX_JSON_DEPTH = 100
# A JSONL batch holds at most this many bytes (plus one line of at most max_line_bytes) or lines.
BATCH_BYTES = 4 << 20
BATCH_LINES = 16384
# The characters for which str.isspace() is true (a test checks the list against Python):
# a text made only of these is empty_text.
PY_WHITESPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680"
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_NOT_WHITESPACE_RE = "[^" + "".join(f"\\x{{{ord(c):x}}}" for c in PY_WHITESPACE) + "]"  # RE2 syntax
UTF8_BOM = b"\xef\xbb\xbf"
# Lines with more opening brackets than this never reach Arrow's (recursive) JSON parser.
FAST_MAX_BRACKETS = 512
# Batches whose lines average more bytes than this are parsed line by line: measured here,
# Arrow reads ~1 KB lines 1.4x faster than json.loads, ~3 KB lines 1.1x, ~6 KB lines no faster.
FAST_MAX_MEAN_LINE_BYTES = 4096


@dataclass(frozen=True)
class ReaderConfig:
    text_field: str = "text"
    # When a record carries this field its value becomes source_id; otherwise "<file>:<line>".
    id_field: str = "id"
    # Marin shards are ~256 MiB; one document should never be a sizeable fraction of a shard.
    max_doc_bytes: int = knob(16 * 1024 * 1024, help="documents larger than this many UTF-8 bytes are quarantined as too_large")
    parquet_batch_rows: int = 4096

    def __post_init__(self):
        if not isinstance(self.text_field, str) or not self.text_field:
            raise ValueError("ReaderConfig.text_field must be a non-empty column name")
        if not isinstance(self.id_field, str) or not self.id_field:
            raise ValueError("ReaderConfig.id_field must be a non-empty column name")
        check_int("ReaderConfig.max_doc_bytes", self.max_doc_bytes, 1)
        check_int("ReaderConfig.parquet_batch_rows", self.parquet_batch_rows, 1)

    @property
    def max_line_bytes(self) -> int:
        """The longest JSONL line worth parsing (and the most a reader buffers): JSON escapes
        take at most 6 bytes per text byte (\\u001f), plus 64 KiB for the other fields."""
        return 6 * self.max_doc_bytes + 65536


@dataclass
class ReadStats:
    """What a reader met, counted where it reads (not where it yields), so that
    `records == kept + quarantined` is a check on the reader rather than a definition."""

    records: int = 0  # non-blank JSONL lines, Parquet rows, .txt files, whole-file failures
    blank_lines: int = 0  # blank JSONL lines: not records


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

    text: object  # pyarrow large_string Array, valid UTF-8, no nulls
    source_id: object  # pyarrow string Array, no nulls
    lines: Sequence[int]  # each record's line (JSONL) or row (Parquet), 1-based
    file: str

    def __len__(self) -> int:
        return len(self.text)

    def documents(self) -> Iterator[Document]:
        for text, source_id, line in zip(self.text.to_pylist(), self.source_id.to_pylist(), self.lines):
            yield Document(text, source_id, {}, self.file, line)


def list_input_files(path: str) -> list[str]:
    """The readable files under `path` (see ``scan_input``), sorted, as URLs."""
    return scan_input(path)[0]


def shown_name(name: str) -> str:
    """A file name as it is safe to print: control characters and undecodable bytes escaped,
    so a name cannot forge a log line (a newline) or break a UTF-8 terminal."""
    shown = name.encode("utf-8", "backslashreplace").decode("utf-8")
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in shown)


def scan_input(path: str) -> tuple[list[str], dict[str, str]]:
    """(readable files, {skipped entry: why}) under `path` (a file or a directory, any fsspec URL).

    Inside a directory, names starting with "_" or "." are sidecars (_counts.json, _SUCCESS,
    .DS_Store, as in Hadoop/Spark layouts) and are not listed. On a local disk the same rules
    as the watched directory apply (watched_dir.scan), and an entry that breaks one is skipped
    and counted, never read: a symlink whose target leaves the input (or is not a regular
    file: a directory, a loop), a FIFO, socket or device (reading one would block), and a
    name that is not valid UTF-8 or holds control characters. Everything else is read or
    quarantined record by record.
    """
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    if _is_local(fs):
        return _scan_local(root, path)
    if not fs.exists(root):
        raise FileNotFoundError(f"input path does not exist: {path}")
    files = sorted(p for p in fs.find(root) if not _is_sidecar(p[len(root):])) if fs.isdir(root) else [root]
    return [fs.unstrip_protocol(p) for p in files], {}


def _scan_local(root: str, given: str) -> tuple[list[str], dict[str, str]]:
    import os

    if not os.path.lexists(root):
        raise FileNotFoundError(f"input path does not exist: {given}")
    if not os.path.isdir(root) or os.path.islink(root) and not os.path.isdir(os.path.realpath(root)):
        why = local_entry_problem(root, os.path.dirname(os.path.realpath(root)))
        if why:
            raise ValueError(f"input {shown_name(given)}: {why}")
        return [root], {}
    real_root = os.path.realpath(root)
    files, skipped = [], {}
    for folder, dirs, names in os.walk(root, followlinks=False):
        links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]  # reported, never descended
        dirs[:] = sorted(d for d in dirs if d not in links and not d.startswith(("_", ".")))
        for entry in sorted([*names, *links]):
            if entry.startswith(("_", ".")):
                continue
            full = os.path.join(folder, entry)
            why = local_entry_problem(full, real_root)
            if why:
                skipped[shown_name(os.path.relpath(full, root))] = why
            else:
                files.append(full)
    return sorted(files), skipped


def local_entry_problem(full: str, real_root: str) -> str | None:
    """Why a local input entry is not read, or None for a regular file we may read."""
    import os
    import stat

    name = os.path.basename(full)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "its name is not valid UTF-8"
    if not name.isprintable():
        return "its name holds control characters (a newline, a tab...)"
    real = os.path.realpath(full)
    if os.path.islink(full) and real != real_root and os.path.commonpath([real_root, real]) != real_root:
        return f"a symlink to {shown_name(real)}, outside the input (links are followed only inside it)"
    try:
        mode = os.stat(full).st_mode
    except OSError as e:
        return f"cannot be read ({e.strerror}: a broken or looping symlink?)"
    if stat.S_ISDIR(mode):
        return "a symlink to a directory (not followed)"
    if not stat.S_ISREG(mode):
        return "not a regular file (a FIFO, socket or device: reading it could block forever)"
    return None


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


def iter_path(
    path: str, config: ReaderConfig = ReaderConfig(), stats: ReadStats | None = None, batches: bool = False
) -> Iterator[Document | DocumentBatch | QuarantineRecord]:
    for file in list_input_files(path):
        yield from iter_file(file, config, stats, batches)


def iter_file(
    file: str, config: ReaderConfig = ReaderConfig(), stats: ReadStats | None = None, batches: bool = False, fast: bool = True
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
    else:
        stats.records += 1
        items = iter([QuarantineRecord(file, None, "unsupported_file_type", f"expected one of {SUPPORTED_SUFFIXES}")])
    for item in items:
        if isinstance(item, DocumentBatch) and not batches:
            yield from item.documents()
        else:
            yield item


def _check_text(text, file: str, line: int | None, config: ReaderConfig) -> QuarantineRecord | bytes:
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


def _source_id(value, file: str, line: int | None, config: ReaderConfig) -> str | QuarantineRecord:
    """The record's id as a string (str or int ids), or a quarantine record for other types."""
    if value is None:
        return f"{_short(file)}:{line}" if line is not None else _short(file)
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return str(value)
    return QuarantineRecord(file, line, "invalid_field", f"field {config.id_field!r} is {type(value).__name__}, not a string or integer")


def _short(file: str) -> str:
    return file.rstrip("/").rsplit("/", 1)[-1]


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
        # Long lines gain nothing from Arrow (parsing the text dominates either way) and pay
        # its checks, so a batch of them goes line by line.
        batch_fast = fast and pending_bytes <= FAST_MAX_MEAN_LINE_BYTES * len(pending)
        for pieces, lines, joined in _runs(pending, pending_lines, batch_fast):
            batch = _jsonl_batch(pieces, lines, joined, file, config) if joined is not None else None
            if batch is not None:
                yield batch
            else:
                for piece, n in zip(pieces, lines):
                    yield _parse_jsonl_line(piece, file, n, config)
        pending, pending_lines, pending_bytes = [], [], 0

    try:
        for piece in split_lines(byte_chunks(file), config.max_line_bytes):
            if first:
                first = False
                if isinstance(piece, bytes) and piece.startswith(UTF8_BOM):  # an editor's BOM is not part of record 1
                    piece = piece[len(UTF8_BOM):]
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


def _runs(pieces: list[bytes], lines: list[int], fast: bool) -> Iterator[tuple[list[bytes], list[int], bytes | None]]:
    """Split a batch into runs of lines Arrow may parse (with the lines joined by newlines)
    and lines it must not see (joined None), in order.

    Arrow's JSON parser recurses per nesting level (200,000 "[" overflow its stack) and
    crashes on a batch that holds no object (a lone `null`), so only lines that look like one
    object with at most FAST_MAX_BRACKETS opening brackets (anywhere, strings included) go
    to it; the others go to the per-line parser, which bounds depth itself.
    """
    if not pieces:
        return
    if not fast:
        yield pieces, lines, None
        return
    joined = b"\n".join(pieces)
    safe = _arrow_safe(joined, pieces)
    if all(safe):
        yield pieces, lines, joined
        return
    start = 0
    for i, ok in enumerate(safe):
        if not ok:
            if start < i:
                yield pieces[start:i], lines[start:i], b"\n".join(pieces[start:i])
            yield pieces[i : i + 1], lines[i : i + 1], None
            start = i + 1
    if start < len(pieces):
        yield pieces[start:], lines[start:], b"\n".join(pieces[start:])


def _arrow_safe(joined: bytes, pieces: list[bytes]) -> list[bool]:
    """Per line: one {...} object (JSON whitespace around it allowed) with at most
    FAST_MAX_BRACKETS opening brackets. `joined` is the lines joined by newlines: its
    bracket count bounds every line's, so the common batch costs two counts, not a call
    per line."""
    plain = [p[:1] == b"{" and p[-1:] == b"}" for p in pieces]
    safe = [True] * len(pieces)
    for i, ok in enumerate(plain):
        if not ok:  # padded with whitespace, or not an object at all
            body = pieces[i].strip(b" \t\r")  # JSON's whitespace (a line holds no newline)
            safe[i] = body[:1] == b"{" and body[-1:] == b"}"
    # Every safe line holds at least its own "{", so no line has more than this many.
    most = joined.count(b"[") + joined.count(b"{") - (sum(safe) - 1 if any(safe) else 0)
    if most > FAST_MAX_BRACKETS:
        safe = [ok and p.count(b"[") + p.count(b"{") <= FAST_MAX_BRACKETS for ok, p in zip(safe, pieces)]
    return safe


def _jsonl_batch(pieces: list[bytes], lines: list[int], data: bytes, file: str, config: ReaderConfig) -> DocumentBatch | None:
    """The lines (`data`: them joined by newlines) parsed by Arrow as one DocumentBatch, or
    None when any line needs the per-line path (Arrow refuses the batch, or a record fails a
    rule or has other fields).

    Arrow's parser is stricter than json.loads (no NaN, no duplicate keys, no lone
    surrogates, no integers past int64), so whatever it accepts json.loads reads the same;
    where the two could differ (a BOM in front, two objects on one line) we fall back.
    """
    import pyarrow as pa
    import pyarrow.json as pj

    if pieces[0].lstrip(b" \t\r").startswith(UTF8_BOM):  # Arrow skips a leading BOM, json.loads refuses it
        return None
    read_options = pj.ReadOptions(block_size=max(1 << 20, max(map(len, pieces)) + 2))
    table = None
    for id_type in (pa.string(), pa.int64()):  # a batch's ids are strings or integers (or absent)
        schema = pa.schema([(config.text_field, pa.string()), (config.id_field, id_type)])
        parse_options = pj.ParseOptions(explicit_schema=schema, newlines_in_values=False, unexpected_field_behavior="infer")
        try:
            table = pj.read_json(pa.BufferReader(data), read_options=read_options, parse_options=parse_options)
            break
        except Exception:  # noqa: BLE001 - ArrowInvalid, or a UnicodeDecodeError formatting its message
            continue
    if table is None or table.num_rows != len(pieces):  # two objects on one line are one bad line, not two rows
        return None
    return _fast_batch(table, lines, file, config)


def _fast_batch(table, lines: Sequence[int], file: str, config: ReaderConfig) -> DocumentBatch | None:
    """`table`'s rows as a DocumentBatch if every row passes _check_text and _source_id and has
    no other fields (so its metadata is {}); None to leave the rows to the per-record path."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = table.column_names
    if config.text_field == config.id_field or config.text_field not in names:
        return None
    if any(n not in (config.text_field, config.id_field) for n in names):
        return None
    text = table.column(config.text_field).combine_chunks()
    if not (pa.types.is_string(text.type) or pa.types.is_large_string(text.type)) or text.null_count:
        return None
    try:
        text.validate(full=True)  # UTF-8 (Arrow's check also refuses encoded surrogates)
    except pa.ArrowInvalid:
        return None
    if len(text) and pc.max(pc.binary_length(text)).as_py() > config.max_doc_bytes:
        return None
    if _has_nul(text) or not pc.all(pc.match_substring_regex(text, _NOT_WHITESPACE_RE)).as_py():
        return None
    source_id = _fast_source_ids(table.column(config.id_field).combine_chunks() if config.id_field in names else None, lines, file)
    if source_id is None:
        return None
    return DocumentBatch(text.cast(pa.large_string()), source_id, lines, file)


def string_array(values: Sequence[str] | Sequence[bytes], large: bool = False, utf8: bool = False):
    """A pyarrow (large_)string Array of `values` (str, or with `utf8` their valid UTF-8
    bytes), built from buffers.

    pa.array() on Python values imports pandas when it is installed (~1-2 s per process on
    a busy machine), which a normalize step never needs; this costs one encode per value.
    """
    import numpy as np
    import pyarrow as pa

    encoded = values if utf8 else [v.encode("utf-8") for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)), out=offsets[1:])
    if not large and offsets[-1] >= 2**31:
        raise ValueError(f"{offsets[-1]} bytes do not fit a string array; use large=True")
    kind = pa.large_string() if large else pa.string()
    offsets = offsets if large else offsets.astype(np.int32)
    return pa.Array.from_buffers(kind, len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))])


def repeated_string(value: str, n: int):
    """A pyarrow string Array holding `value` n times (pandas-free, see string_array)."""
    import numpy as np
    import pyarrow as pa

    data = value.encode("utf-8")
    offsets = np.arange(n + 1, dtype=np.int64) * len(data)
    if offsets[-1] >= 2**31:
        raise ValueError(f"{n} x {len(data)} bytes do not fit a string array")
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data * n)])


def _has_nul(text) -> bool:
    """Whether any string of a (large_)string Array holds a NUL (memchr over its data buffer)."""
    import numpy as np

    offsets, data = text.buffers()[1:3]
    if data is None:
        return False
    bounds = np.frombuffer(offsets, dtype=np.int64 if text.type == "large_string" else np.int32)
    lo, hi = int(bounds[text.offset]), int(bounds[text.offset + len(text)])
    return memoryview(data)[lo:hi].tobytes().find(b"\x00") >= 0


def _fast_source_ids(ids, lines: Sequence[int], file: str):
    """_source_id over a column: strings as they are, integers in decimal, nulls (or no
    column) "<file>:<line>"; None for any other type."""
    import pyarrow as pa
    import pyarrow.compute as pc

    short = _short(file)
    if ids is None or pa.types.is_null(ids.type):
        return string_array([f"{short}:{n}" for n in lines])
    if pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type):
        try:
            ids.validate(full=True)
        except pa.ArrowInvalid:
            return None
    elif not pa.types.is_integer(ids.type):
        return None
    ids = ids.cast(pa.string())
    if ids.null_count:
        fill = string_array([f"{short}:{n}" for n in lines])
        ids = pc.if_else(pc.is_valid(ids), ids, fill)
    return ids


def _parse_jsonl_line(raw: bytes, file: str, lineno: int, config: ReaderConfig) -> Document | QuarantineRecord:
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
    data = _check_text(text, file, lineno, config)
    if isinstance(data, QuarantineRecord):
        return data
    source_id = _source_id(record.pop(config.id_field, None), file, lineno, config)
    if isinstance(source_id, QuarantineRecord):
        return source_id
    return Document(text, source_id, record, file, lineno, data)


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
    data = _check_text(text, file, None, config)
    yield data if isinstance(data, QuarantineRecord) else Document(text, _short(file), {}, file, None, data)


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
            for batch in pf.iter_batches(batch_size=config.parquet_batch_rows):
                rows = range(row + 1, row + batch.num_rows + 1)
                fast_batch = _fast_batch(pa.Table.from_batches([batch]), rows, file, config) if fast and batch.num_rows else None
                if fast_batch is not None:
                    stats.records += batch.num_rows
                    row += batch.num_rows
                    yield fast_batch
                    continue
                records = batch.to_pylist()
                stats.records += len(records)
                for record in records:
                    row += 1
                    yield _parquet_row(record, file, row, config)
        except (pa.ArrowInvalid, pa.ArrowException, OSError) as e:
            stats.records += 1
            yield QuarantineRecord(file, row + 1, "truncated_file", f"{type(e).__name__}: {e}"[:300])


def _parquet_row(record: dict, file: str, row: int, config: ReaderConfig) -> Document | QuarantineRecord:
    text = record.pop(config.text_field)
    data = _check_text(text, file, row, config)
    if isinstance(data, QuarantineRecord):
        return data
    source_id = _source_id(record.pop(config.id_field, None), file, row, config)
    if isinstance(source_id, QuarantineRecord):
        return source_id
    try:
        metadata = _jsonable(record)
    except (ValueError, TypeError, RecursionError) as e:
        return QuarantineRecord(file, row, "invalid_field", f"metadata is not JSON-serializable: {e}"[:200])
    return Document(text, source_id, metadata, file, row, data)


def _jsonable(record: dict) -> dict:
    return json.loads(json.dumps(record, default=str))
