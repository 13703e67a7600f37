"""The reader's fast path: JSONL lines and Parquet rows checked a batch at a time by Arrow.

A batch comes out as one DocumentBatch only when every record of it passes the per-record
rules (records.py) and carries only the text and id fields; any other batch (one bad line,
a metadata field, an id type Arrow cannot take) goes through the per-record path instead,
so the result is the same record for record: the fast path only decides how fast it gets there.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from marin_assets.datakit.arrow_strings import string_array
from marin_assets.datakit.quarantine import QuarantineRecord
from marin_assets.datakit.records import UTF8_BOM, Document, DocumentBatch, ReaderConfig, parse_jsonl_line, short_name

# The characters for which str.isspace() is true (a test checks the list against Python):
# a text made only of these is empty_text.
PY_WHITESPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680"
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_NOT_WHITESPACE_RE = "[^" + "".join(f"\\x{{{ord(c):x}}}" for c in PY_WHITESPACE) + "]"  # RE2 syntax
# Lines with more opening brackets than this never reach Arrow's (recursive) JSON parser.
FAST_MAX_BRACKETS = 512
# Batches whose lines average more bytes than this are parsed line by line: measured here,
# Arrow reads ~1 KB lines 1.4x faster than json.loads, ~3 KB lines 1.1x, ~6 KB lines no faster.
FAST_MAX_MEAN_LINE_BYTES = 4096


def jsonl_records(
    pieces: list[bytes], lines: list[int], size: int, file: str, config: ReaderConfig, fast: bool = True
) -> Iterator[Document | DocumentBatch | QuarantineRecord]:
    """The non-blank JSONL lines `pieces` (numbered `lines`, `size` bytes in all) as records,
    in order: runs Arrow takes as DocumentBatch, every other line parsed on its own."""
    # Long lines gain nothing from Arrow (parsing the text dominates either way) and pay
    # its checks, so a batch of them goes line by line.
    batch_fast = fast and size <= FAST_MAX_MEAN_LINE_BYTES * len(pieces)
    for run, run_lines, joined in _runs(pieces, lines, batch_fast):
        batch = _jsonl_batch(run, run_lines, joined, file, config) if joined is not None else None
        if batch is not None:
            yield batch
        else:
            for piece, n in zip(run, run_lines, strict=True):
                yield parse_jsonl_line(piece, file, n, config)


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
        safe = [ok and p.count(b"[") + p.count(b"{") <= FAST_MAX_BRACKETS for ok, p in zip(safe, pieces, strict=True)]
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
    return fast_batch(table, lines, file, config)


def fast_batch(table, lines: Sequence[int], file: str, config: ReaderConfig) -> DocumentBatch | None:
    """`table`'s rows as a DocumentBatch if every row passes check_text and source_id_of and
    has no other fields (so its metadata is {}); None to leave the rows to the per-record path."""
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
    # pyarrow.compute makes its functions at import time, so the type checker cannot see max, all, ...
    if len(text) and pc.max(pc.binary_length(text)).as_py() > config.max_doc_bytes:  # pyright: ignore[reportAttributeAccessIssue]
        return None
    if _has_nul(text) or not pc.all(pc.match_substring_regex(text, _NOT_WHITESPACE_RE)).as_py():  # pyright: ignore[reportAttributeAccessIssue]
        return None
    ids = table.column(config.id_field).combine_chunks() if config.id_field in names else None
    source_id = _fast_source_ids(ids, lines, file)
    if source_id is None:
        return None
    return DocumentBatch(text.cast(pa.large_string()), source_id, lines, file)


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
    """source_id_of over a column: strings as they are, integers in decimal, nulls (or no
    column) "<file>:<line>"; None for any other type."""
    import pyarrow as pa
    import pyarrow.compute as pc

    short = short_name(file)
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
        ids = pc.if_else(pc.is_valid(ids), ids, fill)  # pyright: ignore[reportAttributeAccessIssue]  (see fast_batch)
    return ids
