"""Readers: one bad line costs one line; memory is bounded by the record limit (issue 10, items 5 and 6)."""

from __future__ import annotations

import gzip
import json
import os
import tempfile
import tracemalloc
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marin_assets.datakit.normalize import NormalizeConfig, normalize
from marin_assets.datakit.quarantine import QuarantineRecord, read_quarantine
from marin_assets.datakit.readers import MAX_JSON_DEPTH, Document, ReaderConfig, ReadStats, iter_file


def read_all(path, config=ReaderConfig()):
    stats = ReadStats()
    items = list(iter_file(str(path), config, stats))
    docs = [i for i in items if isinstance(i, Document)]
    bad = [i for i in items if isinstance(i, QuarantineRecord)]
    return docs, bad, stats


# Each line fails in a different way; none may cost more than itself.
BAD_LINES = [
    (b'{"text": "big int", "n": ' + b"7" * 5000 + b"}", "malformed_json"),  # over Python's int digit limit
    (b"[" * 200_000 + b"]" * 200_000, "malformed_json"),  # RecursionError inside json.loads
    (b'{"text": "deep", "m": ' + b"[" * (MAX_JSON_DEPTH + 5) + b"]" * (MAX_JSON_DEPTH + 5) + b"}", "malformed_json"),
    (b'{"text": "surrogate id", "id": "\\ud800"}', "invalid_utf8"),
    (b'{"text": "surrogate in metadata", "author": "x\\udfff"}', "invalid_utf8"),
    (b'{"text": "surrogate key", "\\ud834": 1}', "invalid_utf8"),
    (b'{"text": "surrogate nested", "tags": [{"k": "\\udc00"}]}', "invalid_utf8"),
    (b'{"text": "list id", "id": [1, 2]}', "invalid_field"),
    (b'{"text": "bool id", "id": true}', "invalid_field"),
    (b'{"text": 12345}', "missing_text"),
    (b'{"text": ["a", "b"]}', "missing_text"),
    (b'"just a string"', "malformed_json"),
    (b'{"text": "\\ud800 lone in text"}', "invalid_utf8"),
]


def test_every_per_line_failure_costs_that_line_only(tmp_path):
    path = tmp_path / "hostile.jsonl"
    good = [json.dumps({"text": f"good {i}", "id": i}).encode() for i in range(len(BAD_LINES) + 1)]
    lines = []
    for i, (bad, _) in enumerate(BAD_LINES):
        lines += [good[i], bad]
    lines.append(good[-1])
    path.write_bytes(b"\n".join(lines) + b"\n")

    docs, bad, stats = read_all(path)
    assert [d.text for d in docs] == [f"good {i}" for i in range(len(good))]
    assert [(b.line, b.reason) for b in bad] == [(2 * i + 2, reason) for i, (_, reason) in enumerate(BAD_LINES)]
    assert stats.records == len(lines) == len(docs) + len(bad)
    # The deep-but-parseable record names its depth; the surrogate ones say which kind of field.
    assert "nested deeper than 100" in bad[2].detail
    assert "key" in bad[5].detail and "list" in bad[7].detail


def test_normalize_counts_lines_read_not_kept_plus_quarantined(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"text": "a"}\n\n' + BAD_LINES[1][0] + b'\n{"text": "b", "id": "\\ud800"}\n   \n{"text": "c"}')
    counts = normalize(str(path), str(tmp_path / "out"), NormalizeConfig(source="s"))
    assert counts["docs_in"] == 4 and counts["blank_lines"] == 2
    assert counts["docs_out"] == 2 and counts["quarantined"] == 2
    assert counts["quarantine_reasons"] == {"invalid_utf8": 1, "malformed_json": 1}
    assert [(q.line, q.reason) for q in read_quarantine(str(tmp_path / "out"))] == [(3, "malformed_json"), (4, "invalid_utf8")]


def test_normalize_refuses_a_reader_that_loses_a_record(tmp_path):
    from marin_assets.datakit.normalize import normalize_documents

    stats = ReadStats(records=3)  # the reader says it met 3 records but hands over 2
    items = [Document("a", "1"), QuarantineRecord("f", 2, "empty_text")]
    with pytest.raises(RuntimeError, match="records read != kept \\+ quarantined"):
        normalize_documents(items, str(tmp_path / "out"), NormalizeConfig(source="s"), stats)


def test_parquet_rows_of_the_wrong_type_are_quarantined_one_by_one(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"text": ["ok one", "ok two", "ok three"], "id": [[1], None, [2, 3]]}), path)
    docs, bad, stats = read_all(path)
    assert [d.text for d in docs] == ["ok two"] and docs[0].source_id == "p.parquet:2"
    assert [(b.line, b.reason) for b in bad] == [(1, "invalid_field"), (3, "invalid_field")]
    assert stats.records == 3


# ---------------------------------------------------------------- memory: item 6

BOMB_BYTES = 128 * 1024 * 1024  # one line, no newline, far above any sane limit
PEAK_BOUND = 24 * 1024 * 1024  # what the reader may hold: a few 1 MiB chunks, never the line


def _bomb(path, compressor) -> None:
    block = b"a" * (1 << 20)
    with open(path, "wb") as f:
        f.write(compressor.compress(b'{"text": "before"}\n'))
        for _ in range(BOMB_BYTES // len(block)):
            f.write(compressor.compress(block))
        f.write(compressor.compress(b'\n{"text": "after the bomb"}\n'))
        f.write(compressor.flush())


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst", ".jsonl"])
def test_a_line_without_newline_is_skipped_without_buffering_it(tmp_path, suffix):
    path = tmp_path / f"bomb{suffix}"
    if suffix == ".jsonl.gz":
        _bomb(path, zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS))
    elif suffix == ".jsonl.zst":
        _bomb(path, zstandard.ZstdCompressor(level=1).compressobj())
    else:
        _bomb(path, type("Plain", (), {"compress": staticmethod(lambda b: b), "flush": staticmethod(lambda: b"")})())
    if suffix != ".jsonl":
        assert os.path.getsize(path) < BOMB_BYTES // 100  # a small file that expands 100x and more
    tracemalloc.start()
    try:
        docs, bad, stats = read_all(path, ReaderConfig(max_doc_bytes=1000))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [d.text for d in docs] == ["before", "after the bomb"]  # reading goes on after the long line
    assert [(b.line, b.reason) for b in bad] == [(2, "too_large")]
    assert f"line of {BOMB_BYTES} bytes" in bad[0].detail
    assert stats.records == 3
    assert peak < PEAK_BOUND, f"reader held {peak / 2**20:.1f} MiB for a {BOMB_BYTES / 2**20:.0f} MiB line"


def test_gzip_chunks_are_bounded_per_call():
    from marin_assets.datakit.readers import _gzip_chunks

    import io

    data = gzip.compress(b"x" * (8 << 20))  # 8 MiB from ~8 KiB: one read, many bounded outputs
    sizes = [len(c) for c in _gzip_chunks(io.BytesIO(data), 1 << 16)]
    assert sum(sizes) == 8 << 20 and max(sizes) <= 1 << 16


def test_zstd_walker_bounds_blocks_and_detects_cuts():
    import io

    from marin_assets.datakit.readers import ZSTD_BLOCK_MAX, _zstd_chunks

    payload = b"y" * (4 << 20) + b"".join(b"%d\n" % i for i in range(50_000))
    frame = zstandard.ZstdCompressor(write_checksum=True).compress(payload)
    skippable = (0x184D2A50).to_bytes(4, "little") + (5).to_bytes(4, "little") + b"12345"
    stream = frame + skippable + zstandard.ZstdCompressor().compress(b"tail\n")
    chunks = list(_zstd_chunks(io.BytesIO(stream), 1 << 20))
    assert b"".join(chunks) == payload + b"tail\n" and max(map(len, chunks)) <= ZSTD_BLOCK_MAX
    for cut in (3, 5, len(frame) // 2, len(frame) - 2):  # inside magic, header, a block, the checksum
        with pytest.raises(EOFError):
            list(_zstd_chunks(io.BytesIO(frame[:cut]), 1 << 20))
    with pytest.raises(ValueError, match="not zstd data"):
        list(_zstd_chunks(io.BytesIO(b"definitely not zstd"), 1 << 20))


# ---------------------------------------------------------------- properties

SMALL = ReaderConfig(max_doc_bytes=200)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)
records = st.one_of(
    json_values,
    st.fixed_dictionaries({"text": json_values}, optional={"id": json_values, "meta": json_values}),
    st.fixed_dictionaries({"text": st.text(max_size=300)}, optional={"id": st.one_of(st.text(), st.integers())}),
)


def _check_invariants(path: str, name: str) -> None:
    docs, bad, stats = read_all(path, SMALL)
    assert stats.records == len(docs) + len(bad)
    for d in docs:
        d.text.encode("utf-8")  # every kept text is valid UTF-8
        json.dumps(d.metadata)  # and its metadata serializes
    out = os.path.join(os.path.dirname(path), "out")
    counts = normalize(path, out, NormalizeConfig(source=name, reader=SMALL))
    assert counts["docs_in"] == stats.records == counts["docs_out"] + counts["quarantined"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=2000), suffix=st.sampled_from([".jsonl", ".jsonl.gz", ".jsonl.zst", ".txt", ".parquet"]))
def test_arbitrary_bytes_never_raise_and_every_record_is_counted(data, suffix):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "in" + suffix)
        with open(path, "wb") as f:
            f.write(data)
        _check_invariants(path, "bytes")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(records, max_size=8), compress=st.sampled_from(["", "gz", "zst"]), ascii_only=st.booleans())
def test_arbitrary_json_values_never_raise_and_every_record_is_counted(values, compress, ascii_only):
    body = b"".join(json.dumps(v, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass") + b"\n" for v in values)
    if compress == "gz":
        body = gzip.compress(body)
    elif compress == "zst":
        body = zstandard.ZstdCompressor().compress(body)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "in.jsonl" + (f".{compress}" if compress else ""))
        with open(path, "wb") as f:
            f.write(body)
        _check_invariants(path, "json")
        docs, bad, stats = read_all(path, SMALL)
        assert stats.records == len(values)  # one record per line, every line accounted for


def _check_text_reference(text, config):
    """The text rules as they were written before the single-encode rewrite (the spec)."""
    if not isinstance(text, str):
        return "missing_text"
    if "\x00" in text:
        return "nul_bytes"
    if not text.strip():
        return "empty_text"
    if len(text.encode("utf-8", errors="surrogatepass")) > config.max_doc_bytes:
        return "too_large"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "invalid_utf8"
    return None


@settings(max_examples=400, deadline=None)
@given(
    text=st.one_of(st.none(), st.integers(), st.text(alphabet=st.sampled_from(["a", "é", "😀", " ", "\t", "\n", "\u3000", "\x00", "\ud800", "\udfff"]), max_size=12)),
    limit=st.integers(min_value=1, max_value=20),
)
def test_check_text_keeps_the_rules_and_their_order(text, limit):
    from marin_assets.datakit.quarantine import QuarantineRecord
    from marin_assets.datakit.readers import ReaderConfig, _check_text

    config = ReaderConfig(max_doc_bytes=limit)
    got = _check_text(text, "f.jsonl", 3, config)
    expected = _check_text_reference(text, config)
    if expected is None:
        assert got == text.encode("utf-8")  # the bytes normalize hashes, encoded once
    else:
        assert isinstance(got, QuarantineRecord) and got.reason == expected and got.line == 3
