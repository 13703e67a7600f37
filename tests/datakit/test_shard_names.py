"""Shard files are recognised by their whole name (issue 10, item 9: no `$`-with-newline matches)."""

from __future__ import annotations

from marin_assets.datakit.shards import list_shards


def test_list_shards_matches_whole_basenames(tmp_path):
    for name in ["part-00000-of-00002.parquet", "part-00001-of-00002.parquet", "part-00000-of-00002.parquet\n",
                 "xpart-00000-of-00002.parquet", "part-00000-of-00002.parquet.tmp", "part-0-of-2.parquet"]:
        (tmp_path / name).write_bytes(b"")
    assert [p.rsplit("/", 1)[-1] for p in list_shards(str(tmp_path))] == [
        "part-00000-of-00002.parquet", "part-00001-of-00002.parquet"]
