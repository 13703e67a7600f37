"""gs:// listings must be fresh: what another process (here another filesystem instance) writes is seen."""

from __future__ import annotations

import fsspec

from marin_assets.store.fsutil import filesystem, read_json


def test_a_file_written_by_another_instance_is_seen_and_a_rewritten_one_reads_whole(gcs_prefix):
    fs, root = filesystem(gcs_prefix)  # the project's way of opening a prefix
    other = fsspec.filesystem("gs", skip_instance_cache=True)  # as another process would have it
    other.pipe_file(f"{root}/.lease/00000001.json", b'{"beat": 0}')
    assert fs.ls(f"{root}/.lease", detail=False) == [f"{root}/.lease/00000001.json"]  # a listing gcsfs could cache
    other.pipe_file(f"{root}/.lease/00000002.json", b"{}")
    other.pipe_file(f"{root}/.lease/00000001.json", b'{"beat": 12345}')
    assert fs.exists(f"{root}/.lease/00000002.json")
    assert len(fs.ls(f"{root}/.lease", detail=False)) == 2
    assert read_json(fs, f"{root}/.lease/00000001.json") == {"beat": 12345}
