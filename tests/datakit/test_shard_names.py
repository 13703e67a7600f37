"""Shard files are recognised by their whole name (issue 10, item 9: no `$`-with-newline matches)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_assets.datakit.shards import list_shards


def test_list_shards_matches_whole_basenames(tmp_path):
    for name in [
        "part-00000-of-00002.parquet",
        "part-00001-of-00002.parquet",
        "part-00000-of-00002.parquet\n",
        "xpart-00000-of-00002.parquet",
        "part-00000-of-00002.parquet.tmp",
        "part-0-of-2.parquet",
    ]:
        (tmp_path / name).write_bytes(b"")
    assert [p.rsplit("/", 1)[-1] for p in list_shards(str(tmp_path))] == [
        "part-00000-of-00002.parquet",
        "part-00001-of-00002.parquet",
    ]


def test_committed_listings_and_json_are_read_once_and_reread_when_a_local_file_changes(tmp_path, monkeypatch):
    import json
    import os

    from marin_assets.datakit import shards

    (tmp_path / "owners").mkdir()
    (tmp_path / "owners" / "band-000.json").write_text(json.dumps({"a": 1}))
    calls = []
    real_list_dir = shards.list_dir
    monkeypatch.setattr(shards, "list_dir", lambda *a, **k: calls.append(a) or real_list_dir(*a, **k))
    first = shards.list_committed_dir(str(tmp_path / "owners"), "band-")
    assert [p.rsplit("/", 1)[-1] for p in first] == ["band-000.json"]
    assert shards.list_committed_dir(str(tmp_path / "owners"), "band-") == first and len(calls) == 1
    assert shards.read_committed_json(first[0]) == {"a": 1}
    # A scratch directory rewritten in place (a library caller, not a committed artifact):
    # the directory's and the file's mtimes move, so neither is served stale.
    (tmp_path / "owners" / "band-001.json").write_text(json.dumps({"b": 2}))
    later = os.stat(tmp_path / "owners").st_mtime_ns + 10_000_000
    os.utime(tmp_path / "owners", ns=(later, later))
    assert [p.rsplit("/", 1)[-1] for p in shards.list_committed_dir(str(tmp_path / "owners"), "band-")] == [
        "band-000.json",
        "band-001.json",
    ]
    (tmp_path / "owners" / "band-000.json").write_text(json.dumps({"a": 10}))
    os.utime(tmp_path / "owners" / "band-000.json", ns=(later, later))
    assert shards.read_committed_json(first[0]) == {"a": 10}
    assert shards.list_committed_dir(str(tmp_path / "missing")) == ()


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 30), st.integers(0, 60), st.lists(st.integers(0, 59), max_size=25))
def test_read_rows_reads_any_rows_in_order_from_any_row_groups(tmp_path_factory, group_rows, num_rows, wanted):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from marin_assets.datakit.readers import string_array
    from marin_assets.datakit.shards import read_rows, write_table

    path = str(tmp_path_factory.mktemp("rows") / "t.parquet")
    write_table(pa.table({"id": string_array([f"d{i}" for i in range(num_rows)])}), path, row_group_size=group_rows)
    assert num_rows == 0 or pq.ParquetFile(path).num_row_groups == -(-num_rows // group_rows)
    if any(r >= num_rows for r in wanted):
        with pytest.raises(ValueError, match=f"which has {num_rows} rows"):
            read_rows(path, wanted)
        return
    assert read_rows(path, wanted, ["id"]).column("id").to_pylist() == [f"d{r}" for r in wanted]
