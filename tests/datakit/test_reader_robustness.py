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
    import io

    from marin_assets.datakit.byte_streams import _gzip_chunks

    data = gzip.compress(b"x" * (8 << 20))  # 8 MiB from ~8 KiB: one read, many bounded outputs
    sizes = [len(c) for c in _gzip_chunks(io.BytesIO(data), 1 << 16)]
    assert sum(sizes) == 8 << 20 and max(sizes) <= 1 << 16


def test_zstd_walker_bounds_blocks_and_detects_cuts():
    import io

    from marin_assets.datakit.byte_streams import ZSTD_BLOCK_MAX, _zstd_chunks

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
    text=st.one_of(
        st.none(),
        st.integers(),
        st.text(alphabet=st.sampled_from(["a", "é", "😀", " ", "\t", "\n", "\u3000", "\x00", "\ud800", "\udfff"]), max_size=12),
    ),
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


# ---------------------------------------------------------------- the fast (Arrow) path == the per-record path


def _items(path, config, fast, batches=False):
    stats = ReadStats()
    items = list(iter_file(str(path), config, stats, batches=batches, fast=fast))
    return items, stats


def _same_as_per_record(path, config=SMALL):
    """iter_file with the fast path yields what the per-record path yields, field by field."""
    fast, fast_stats = _items(path, config, True)
    slow, slow_stats = _items(path, config, False)
    key = lambda i: (type(i).__name__, i.text, i.source_id, i.metadata, i.file, i.line) if isinstance(i, Document) else i  # noqa: E731
    assert [key(i) for i in fast] == [key(i) for i in slow]
    assert (fast_stats.records, fast_stats.blank_lines) == (slow_stats.records, slow_stats.blank_lines)
    return fast


def test_python_whitespace_list_is_what_str_isspace_says():
    from marin_assets.datakit.readers import PY_WHITESPACE

    assert PY_WHITESPACE == "".join(chr(c) for c in range(0x110000) if chr(c).isspace())


def test_good_lines_come_as_one_batch_and_one_bad_line_costs_only_itself(tmp_path):
    from marin_assets.datakit.readers import DocumentBatch

    good = [{"text": f"doc {i} é😀", "id": f"s{i}"} for i in range(50)]
    path = tmp_path / "good.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in good))
    items, stats = _items(path, ReaderConfig(), True, batches=True)
    assert len(items) == 1 and isinstance(items[0], DocumentBatch) and len(items[0]) == 50  # the fast path ran
    assert items[0].text.to_pylist() == [r["text"] for r in good] and items[0].source_id.to_pylist() == [r["id"] for r in good]
    assert stats.records == 50

    long_lines = [{"text": "long " * 1000, "id": f"s{i}"} for i in range(3)]  # ~5 KB lines: json.loads is as fast
    path.write_text("".join(json.dumps(r) + "\n" for r in long_lines))
    items, _ = _items(path, ReaderConfig(), True, batches=True)
    assert [type(i).__name__ for i in items] == ["Document"] * 3

    lines = [json.dumps(r) for r in good]
    lines[20] = '{"text": "x", "id": "a", "extra": NaN}'  # json.loads takes NaN, Arrow does not: per-line path
    lines[30] = '{"text": "   "}'  # empty_text
    path.write_text("\n".join(lines) + "\n")
    docs, bad, stats = read_all(path)
    assert len(docs) == 49 and docs[20].metadata["extra"] != docs[20].metadata["extra"]  # NaN kept as metadata
    assert [(b.line, b.reason) for b in bad] == [(31, "empty_text")] and stats.records == 50
    _same_as_per_record(path)


# Lines the fast path must refuse (or get right) exactly as json.loads + the rules do.
EDGE_LINES = [
    b'\xef\xbb\xbf{"text": "bom first"}',  # Arrow skips a leading BOM; json.loads refuses it
    b'{"text": "a"} {"text": "b"}',  # two objects on one line: one malformed line
    b"null",  # crashes Arrow's reader when a batch holds no object
    b'{"text": "dup", "text": "last wins"}',
    b'{"text": "int id", "id": -0}',
    b'{"text": "big id", "id": 123456789012345678901234567890}',
    b'{"text": "float id", "id": 1.0}',
    b'{"text": "null id", "id": null}',
    b'{"text": "bad \xed\xa0\x80 surrogate bytes"}',
    b'{"text": "raw\ttab"}',
    b'{"text": "\\u2003\\u3000\\u0085"}',  # only Python whitespace: empty_text
    b'{"text": "\\u200b"}',  # zero-width space is not whitespace to Python
    b'{"te\\u0078t": "escaped key"}',
    b'{"text": "' + b"[" * 600 + b'"}',  # many brackets inside a string
    b' {"text": "padded"}\r',
]


@pytest.mark.parametrize("line", EDGE_LINES, ids=range(len(EDGE_LINES)))
def test_fast_path_edge_lines_match_the_per_line_path(tmp_path, line):
    path = tmp_path / "edge.jsonl"
    path.write_bytes(line + b"\n" + b'{"text": "neighbour", "id": 1}\n')
    _same_as_per_record(path, ReaderConfig())


def test_ids_mixing_strings_and_integers_in_one_batch(tmp_path):
    path = tmp_path / "ids.jsonl"
    path.write_text('{"text": "a", "id": 5}\n{"text": "b"}\n{"text": "c", "id": 7}\n{"text": "d", "id": "x"}\n')
    docs = _same_as_per_record(path)
    assert [d.source_id for d in docs] == ["5", "ids.jsonl:2", "7", "x"]


simple_records = st.fixed_dictionaries(
    {
        "text": st.text(
            alphabet=st.sampled_from(["a", "é", "😀", " ", "\t", "\u3000", "\x00", "\ud800", "[", "{", '"']), max_size=40
        )
    },
    optional={"id": st.one_of(st.none(), st.text(max_size=5), st.integers(-(2**70), 2**70), st.booleans())},
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(st.one_of(simple_records, simple_records, records), max_size=10), ascii_only=st.booleans(),
       blank=st.booleans())  # fmt: skip
def test_fast_path_matches_the_per_record_path_on_arbitrary_jsonl(values, ascii_only, blank):
    sep = b"\n\n" if blank else b"\n"
    body = sep.join(json.dumps(v, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass") for v in values)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "in.jsonl")
        with open(path, "wb") as f:
            f.write(body)
        _same_as_per_record(path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(st.one_of(st.none(), st.text(max_size=30)), max_size=12),
       ids=st.one_of(st.none(), st.just("str"), st.just("int")), batch_rows=st.integers(1, 5))  # fmt: skip
def test_fast_path_matches_the_per_record_path_on_parquet(texts, ids, batch_rows):
    columns = {
        "text": pa.array([t.encode("utf-8", "surrogatepass").decode("utf-8", "replace") if t else t for t in texts], pa.string())
    }
    if ids == "str":
        columns["id"] = pa.array([f"r{i}" if i % 3 else None for i in range(len(texts))], pa.string())
    elif ids == "int":
        columns["id"] = pa.array([i * 7 if i % 3 else None for i in range(len(texts))], pa.int32())
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "in.parquet")
        pq.write_table(pa.table(columns), path)
        _same_as_per_record(path, ReaderConfig(max_doc_bytes=20, parquet_batch_rows=batch_rows))


def test_normalize_writes_the_same_shards_with_and_without_the_fast_path(tmp_path):
    from marin_assets.datakit.normalize import normalize_documents
    from marin_assets.datakit.shards import list_shards, read_table

    lines = [json.dumps({"text": f"doc {i % 37} " + "w" * (i % 50), "id": f"k{i % 11}"}) for i in range(400)]
    lines[123] = '{"text": ""}'
    lines[300] = json.dumps({"text": "with meta", "lang": "en"})
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n")
    config = NormalizeConfig(source="s", shard_docs=64, shard_bytes=3000)  # closes by bytes and by docs
    fast = normalize(str(path), str(tmp_path / "fast"), config)
    stats = ReadStats()
    slow = normalize_documents(iter_file(str(path), config.reader, stats, fast=False), str(tmp_path / "slow"), config, stats)
    assert fast == slow and fast["shards"] > 3
    for a, b in zip(list_shards(str(tmp_path / "fast")), list_shards(str(tmp_path / "slow")), strict=True):
        assert read_table(a).equals(read_table(b))
    assert read_quarantine(str(tmp_path / "fast")) == read_quarantine(str(tmp_path / "slow"))


def _parquet_with_a_big_row(path, big_bytes, **options):
    """Row groups: 100 documents, then [a `big_bytes` text, "ok"], then 100 documents. The big
    text compresses to a few KB; it is built once, written and dropped."""
    small = [f"document {i} " + "word " * (i % 7) for i in range(100)]
    with pq.ParquetWriter(path, pa.schema([("text", pa.large_string())]), **options) as w:
        w.write_table(pa.table({"text": pa.array(small, pa.large_string())}))
        w.write_table(pa.table({"text": pa.array(["b" * big_bytes, "ok"], pa.large_string())}))
        w.write_table(pa.table({"text": pa.array(small, pa.large_string())}))
    return small


@pytest.mark.parametrize(
    "options",
    [
        dict(compression="gzip"),
        dict(compression="zstd", use_dictionary=False),
        dict(compression="snappy", data_page_version="2.0", use_dictionary=False),
    ],
)
def test_a_parquet_page_over_the_limit_is_refused_without_decompressing_it(tmp_path, options):
    """A 275 KB gzip Parquet holding one 256 MiB text peaked at 1.7 GB: Arrow decodes a page
    whole. The reader sizes the pages from their headers first (limit scaled down here: 64 KiB
    documents, so max_line_bytes = 448 KiB, against a 16 MiB text) and quarantines the rows of
    a row group it cannot read, each named; the other row groups are read."""
    from marin_assets.datakit.memory import peak_heap_bytes

    path = tmp_path / "bomb.parquet"
    small = _parquet_with_a_big_row(path, 16 << 20, **options)
    assert os.path.getsize(path) < 1 << 20
    config = ReaderConfig(max_doc_bytes=64 << 10)
    (docs, bad, stats), peak = peak_heap_bytes(lambda: read_all(path, config))
    assert [d.text for d in docs] == small + small
    assert [(b.file, b.line, b.reason) for b in bad] == [(str(path), 101, "too_large"), (str(path), 102, "too_large")]
    assert bad[0].detail.startswith("row group 1 (rows 101-102): column 'text' has a ")
    page = int(bad[0].detail.split(" page of ")[1].split()[0])
    assert 16 << 20 <= page < (16 << 20) + 100 and f"uncompressed > {config.max_line_bytes}," in bad[0].detail
    assert stats.records == 202  # records in = kept + quarantined
    assert peak < 4 << 20, f"reader held {peak / 2**20:.1f} MiB for a 16 MiB text"


def test_parquet_page_headers_account_for_every_byte_of_a_column_chunk(tmp_path):
    """The page walk against the footer: headers + pages = each chunk's uncompressed size, for
    dictionary and plain pages, v1 and v2, with statistics and a nested column."""
    from marin_assets.datakit.parquet_pages import page_sizes

    table = pa.table(
        {"text": [f"doc {i} " * (i % 50) for i in range(5000)], "id": list(range(5000)), "meta": [{"tags": [1, 2, None]}] * 5000}
    )
    for options in (
        dict(compression="gzip"),
        dict(compression="zstd", use_dictionary=False, data_page_version="2.0"),
        dict(compression="snappy", data_page_size=1000, write_statistics=True),
    ):
        path = tmp_path / "t.parquet"
        pq.write_table(table, path, row_group_size=2000, **options)
        metadata = pq.ParquetFile(path).metadata
        with open(path, "rb") as f:
            for rg in range(metadata.num_row_groups):
                for c in range(metadata.num_columns):
                    chunk = metadata.row_group(rg).column(c)
                    pages = list(page_sizes(f, chunk))
                    assert sum(size + header for _, size, header in pages) == chunk.total_uncompressed_size
                    assert {kind for kind, _, _ in pages} <= {0, 2, 3}
