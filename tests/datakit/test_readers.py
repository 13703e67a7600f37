import gzip
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from marin_assets.datakit.quarantine import QuarantineRecord
from marin_assets.datakit.readers import Document, ReaderConfig, iter_file, iter_path, list_input_files


def split(items):
    docs = [i for i in items if isinstance(i, Document)]
    bad = [i for i in items if isinstance(i, QuarantineRecord)]
    return docs, bad


def test_jsonl_bad_lines_are_quarantined_and_the_rest_proceeds(tmp_path):
    path = tmp_path / "mixed.jsonl"
    with open(path, "wb") as f:
        f.write(json.dumps({"text": "first good", "id": 7, "lang": "en"}).encode() + b"\n")
        f.write(b'{"text": "bad \xff\xfe utf8"}\n')  # line 2
        f.write(json.dumps({"text": "nul \u0000 inside"}).encode() + b"\n")  # line 3
        f.write(json.dumps({"text": "   \n "}).encode() + b"\n")  # line 4
        f.write(b'{"text": "unterminated\n')  # line 5
        f.write(json.dumps({"body": "no text field"}).encode() + b"\n")  # line 6
        f.write(b"\n")  # blank: not a record
        f.write(json.dumps({"text": "x" * 200}).encode() + b"\n")  # line 8, too large below
        f.write(json.dumps({"text": "last good"}).encode() + b"\n")  # line 9
    docs, bad = split(list(iter_file(str(path), ReaderConfig(max_doc_bytes=100))))
    assert [d.text for d in docs] == ["first good", "last good"]
    assert docs[0].source_id == "7" and docs[0].metadata == {"lang": "en"}
    assert docs[1].source_id == "mixed.jsonl:9"
    assert [(b.line, b.reason) for b in bad] == [
        (2, "invalid_utf8"), (3, "nul_bytes"), (4, "empty_text"), (5, "malformed_json"), (6, "missing_text"), (8, "too_large"),
    ]  # fmt: skip
    assert all(b.file == str(path) for b in bad)


def test_truncated_gzip_keeps_lines_before_the_break(tmp_path):
    full = tmp_path / "full.jsonl.gz"
    with gzip.open(full, "wt") as f:
        for i in range(2000):
            f.write(json.dumps({"text": f"document number {i} " * 5}) + "\n")
    data = full.read_bytes()
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: len(data) // 2])
    docs, bad = split(list(iter_file(str(cut))))
    assert 0 < len(docs) < 2000
    assert [d.text for d in docs] == [f"document number {i} " * 5 for i in range(len(docs))]
    assert len(bad) == 1 and bad[0].reason == "truncated_file" and bad[0].line == len(docs) + 1


def test_zstd_jsonl_is_read(tmp_path):
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "hello zstd"}\n{"text": "again"}\n'))
    docs, bad = split(list(iter_file(str(path))))
    assert [d.text for d in docs] == ["hello zstd", "again"] and bad == []


def test_truncated_parquet_is_quarantined_whole(tmp_path):
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"text": ["a doc", "", None, "another"], "id": ["a", "b", "c", "d"]}), good)
    docs, bad = split(list(iter_file(str(good))))
    assert [d.source_id for d in docs] == ["a", "d"]
    assert [(b.line, b.reason) for b in bad] == [(2, "empty_text"), (3, "missing_text")]
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(good.read_bytes()[:-20])
    docs, bad = split(list(iter_file(str(cut))))
    assert docs == [] and [(b.line, b.reason) for b in bad] == [(None, "truncated_file")]


def test_binary_file_and_unknown_type(tmp_path):
    blob = tmp_path / "image.txt"
    blob.write_bytes(os.urandom(4096) + b"\x00" * 64)
    docs, bad = split(list(iter_file(str(blob))))
    assert docs == [] and bad[0].reason == "binary_file"
    binary_jsonl = tmp_path / "data.jsonl"
    binary_jsonl.write_bytes(bytes(range(256)) * 16)
    assert [b.reason for b in iter_file(str(binary_jsonl))] == ["binary_file"]
    other = tmp_path / "notes.docx"
    other.write_bytes(b"PK\x03\x04")
    assert [b.reason for b in iter_file(str(other))] == ["unsupported_file_type"]


def test_txt_documents_and_default_max_size(tmp_path):
    (tmp_path / "a.txt").write_text("plain text document\n")
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:  # a 50 MB document: over the 16 MiB default, never read into memory
        f.truncate(50 * 1024 * 1024)
    docs, bad = split(list(iter_path(str(tmp_path))))
    assert [d.source_id for d in docs] == ["a.txt"]
    assert [(b.file.endswith("big.txt"), b.reason) for b in bad] == [(True, "too_large")]


def test_directory_walk_skips_sidecars(tmp_path, write_jsonl):
    write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}])
    (tmp_path / "_counts.json").write_text("{}")
    (tmp_path / ".hidden").write_text("x")
    (tmp_path / "sub").mkdir()
    write_jsonl(tmp_path / "sub" / "b.jsonl", [{"text": "y"}])
    assert [os.path.basename(p) for p in list_input_files(str(tmp_path))] == ["a.jsonl", "b.jsonl"]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        list_input_files(str(tmp_path / "missing"))


def test_memory_filesystem(tmp_path):
    import fsspec

    with fsspec.open("memory://dk_reader/in/a.jsonl", "w") as f:
        f.write('{"text": "from memory"}\n')
    docs, bad = split(list(iter_path("memory://dk_reader/in")))
    assert [d.text for d in docs] == ["from memory"] and bad == []


def test_config_is_validated():
    with pytest.raises(ValueError, match="max_doc_bytes"):
        ReaderConfig(max_doc_bytes=0)


def test_truncated_zstd_is_reported_not_silently_short(tmp_path):
    data = "".join(json.dumps({"text": f"doc {i} " * 20}) + "\n" for i in range(3000)).encode()
    frame = zstandard.ZstdCompressor().compress(data)
    path = tmp_path / "cut.jsonl.zst"
    path.write_bytes(frame[: len(frame) // 2])
    docs, bad = split(list(iter_file(str(path))))
    assert 0 < len(docs) < 3000
    assert [(b.line, b.reason) for b in bad] == [(len(docs) + 1, "truncated_file")]
    # two concatenated frames are one valid stream
    path.write_bytes(frame + zstandard.ZstdCompressor().compress(b'{"text": "second frame"}\n'))
    docs, bad = split(list(iter_file(str(path))))
    assert len(docs) == 3001 and docs[-1].text == "second frame" and bad == []


def test_file_that_is_not_gzip_is_unreadable(tmp_path):
    path = tmp_path / "plain.jsonl.gz"
    path.write_bytes(b'{"text": "not compressed"}\n')
    assert [(b.line, b.reason) for b in iter_file(str(path))] == [(1, "unreadable_file")]
