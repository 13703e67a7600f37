import json

import pyarrow.parquet as pq
import pytest
import xxhash

from marin_assets.datakit.normalize import NormalizeConfig, normalize
from marin_assets.datakit.quarantine import read_quarantine
from marin_assets.datakit.shards import list_shards, read_table


def test_contract_columns_ids_order_and_shard_names(tmp_path, write_jsonl):
    texts = [f"document {i}: " + "word " * i for i in range(25)]
    write_jsonl(tmp_path / "in.jsonl", [{"text": t, "id": f"src-{i}", "lang": "en"} for i, t in enumerate(texts)] + ["{oops"])
    counts = normalize(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), NormalizeConfig(source="demo", shard_docs=10))
    assert counts["docs_in"] == 26 and counts["docs_out"] == 25 and counts["quarantined"] == 1
    assert counts["quarantine_reasons"] == {"malformed_json": 1}
    shards = list_shards(str(tmp_path / "out"))
    assert [s.rsplit("/", 1)[1] for s in shards] == [f"part-0000{i}-of-00003.parquet" for i in range(3)]
    rows = []
    for s in shards:
        table = read_table(s)
        assert table.column_names == ["id", "text", "source", "source_id", "metadata"]
        rows += table.to_pylist()
    assert len(rows) == 25
    # Rows keep the input order (the corpus order fuzzy dedup's survivor rule follows).
    assert [r["source_id"] for r in rows] == [f"src-{i}" for i in range(25)]
    for r in rows:
        assert r["id"] == xxhash.xxh3_128_hexdigest(r["text"].encode("utf-8"))
        assert r["source"] == "demo"
        assert r["text"] == texts[int(r["source_id"].split("-")[1])]
        assert json.loads(r["metadata"]) == {"lang": "en"}
    [q] = read_quarantine(str(tmp_path / "out"))
    assert q.line == 26 and q.reason == "malformed_json"


def test_shards_close_by_bytes(tmp_path, write_jsonl):
    write_jsonl(tmp_path / "in.jsonl", [{"text": f"{i} " + "x" * 100} for i in range(10)])
    counts = normalize(str(tmp_path), str(tmp_path / "out"), NormalizeConfig(source="s", shard_bytes=250))
    assert counts["shards"] == 4  # 3 docs (>=250 bytes) per shard, 10 docs
    sizes = [pq.ParquetFile(p).metadata.num_rows for p in list_shards(str(tmp_path / "out"))]
    assert sizes == [3, 3, 3, 1]


def test_memory_filesystem_roundtrip():
    import fsspec

    with fsspec.open("memory://dk_norm/in/a.jsonl", "w") as f:
        f.write('{"text": "b"}\n{"text": "a"}\n')
    counts = normalize("memory://dk_norm/in", "memory://dk_norm/out", NormalizeConfig(source="mem"))
    [shard] = list_shards("memory://dk_norm/out")
    assert shard.startswith("memory://") and counts["docs_out"] == 2
    assert sorted(read_table(shard).column("text").to_pylist()) == ["a", "b"]


def test_config_validation():
    with pytest.raises(ValueError, match="source"):
        NormalizeConfig(source="a/b")
    with pytest.raises(ValueError, match="shard_docs"):
        NormalizeConfig(source="a", shard_docs=0)


def test_rerun_into_the_same_dir_replaces_shards(tmp_path, write_jsonl):
    write_jsonl(tmp_path / "in.jsonl", [{"text": f"doc {i}"} for i in range(6)])
    normalize(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), NormalizeConfig(source="s", shard_docs=2))
    assert len(list_shards(str(tmp_path / "out"))) == 3
    normalize(str(tmp_path / "in.jsonl"), str(tmp_path / "out"), NormalizeConfig(source="s", shard_docs=4))
    assert [p.rsplit("/", 1)[1] for p in list_shards(str(tmp_path / "out"))] == [
        "part-00000-of-00002.parquet", "part-00001-of-00002.parquet",
    ]  # fmt: skip


def test_a_normalize_step_does_not_import_pandas(tmp_path):
    """pa.array() on Python values imports pandas (seconds per process); normalize builds its
    Arrow columns from buffers, on the fast path and the per-line one."""
    import subprocess
    import sys

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{"text": "fast path", "id": 1}\n{"text": "b"}\n')
    (tmp_path / "in" / "b.jsonl").write_text('{"text": "per-line path", "lang": "en"}\n{oops\n')
    code = (
        "import sys\n"
        "from marin_assets.datakit.normalize import NormalizeConfig, normalize\n"
        f"counts = normalize({str(tmp_path / 'in')!r}, {str(tmp_path / 'out')!r}, NormalizeConfig(source='s'))\n"
        "print(counts['docs_out'], counts['quarantined'], 'pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["3", "1", "False"]


def test_string_arrays_built_from_buffers_equal_pa_array():
    import pyarrow as pa

    from marin_assets.datakit.readers import repeated_string, string_array

    values = ["", "a", "é😀", "x" * 1000]
    assert string_array(values).equals(pa.array(values, pa.string()))
    assert string_array(values, large=True).equals(pa.array(values, pa.large_string()))
    assert string_array([]).equals(pa.array([], pa.string()))
    assert repeated_string("{}", 3).equals(pa.array(["{}"] * 3, pa.string()))
    assert repeated_string("s", 0).equals(pa.array([], pa.string()))


def test_doc_ids_of_an_arrow_column_equal_doc_id_of_each_text():
    import pyarrow as pa

    from marin_assets.datakit.normalize import doc_id, doc_ids

    texts = ["a", "é😀 text", "x" * 5000, "last"]
    for kind in (pa.string(), pa.large_string()):
        array = pa.array(["skipped"] + texts, kind).slice(1)  # offsets that do not start at 0
        assert doc_ids(array) == [doc_id(t) for t in texts]
    assert doc_ids(pa.array([], pa.string())) == []
