"""Shard files are recognised by their whole name (issue 10, item 9: no `$`-with-newline matches)."""

from __future__ import annotations

from marin_assets.datakit.shards import list_shards


def test_list_shards_matches_whole_basenames(tmp_path):
    for name in ["part-00000-of-00002.parquet", "part-00001-of-00002.parquet", "part-00000-of-00002.parquet\n",
                 "xpart-00000-of-00002.parquet", "part-00000-of-00002.parquet.tmp", "part-0-of-2.parquet"]:
        (tmp_path / name).write_bytes(b"")
    assert [p.rsplit("/", 1)[-1] for p in list_shards(str(tmp_path))] == [
        "part-00000-of-00002.parquet", "part-00001-of-00002.parquet"]


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
    assert [p.rsplit("/", 1)[-1] for p in shards.list_committed_dir(str(tmp_path / "owners"), "band-")] == ["band-000.json", "band-001.json"]
    (tmp_path / "owners" / "band-000.json").write_text(json.dumps({"a": 10}))
    os.utime(tmp_path / "owners" / "band-000.json", ns=(later, later))
    assert shards.read_committed_json(first[0]) == {"a": 10}
    assert shards.list_committed_dir(str(tmp_path / "missing")) == ()
