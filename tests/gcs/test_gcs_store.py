"""The artifact store on gs:// (fake-gcs-server): commit, load, cache hit, empty stages, failed attempts."""

from __future__ import annotations

import hashlib
import json

import fsspec
import pytest

from marin_assets.store import FAILED, SUCCESS, ArtifactStore, compute_version


def _write_files(files: dict[str, bytes]):
    def compute(out_dir: str) -> dict:
        fs, root = fsspec.core.url_to_fs(out_dir)
        for name, data in files.items():
            with fs.open(f"{root}/{name}", "wb") as f:
                f.write(data)
        return {"files": len(files)}

    return compute


def test_commit_load_and_cache_hit_on_gcs(gcs_prefix):
    store = ArtifactStore(gcs_prefix)
    version = compute_version("a/b", "1", {"k": 1})
    calls: list[str] = []

    def compute(out_dir: str) -> dict:
        calls.append(out_dir)
        return _write_files({"part-0.txt": b"hello", "sub/part-1.bin": b"\x00" * 7})(out_dir)

    first = store.materialize("a/b", "p0", version, compute, {"why": "test"})
    second = store.materialize("a/b", "p0", version, compute, {"why": "test"})
    assert (first.cache_hit, second.cache_hit, len(calls)) == (False, True, 1)
    assert calls[0].startswith(f"{gcs_prefix}/a/b/p0/") and "/.staging-" in calls[0]
    assert first.ref == second.ref == store.load("a/b", "p0", version)
    assert first.ref.path.startswith("gs://")
    assert first.ref.manifest["files"] == [
        {"path": "part-0.txt", "bytes": 5, "sha256": hashlib.sha256(b"hello").hexdigest()},
        {"path": "sub/part-1.bin", "bytes": 7, "sha256": hashlib.sha256(b"\x00" * 7).hexdigest()},
    ]
    assert first.ref.manifest["total_bytes"] == 12 and first.ref.counts == {"files": 2}
    fs, _ = fsspec.core.url_to_fs(gcs_prefix)
    fs.rm(first.ref.files(".bin")[0])  # an object deleted after the commit: not a cache hit any more
    assert store.damage(first.ref) == "sub/part-1.bin: missing (the manifest lists it, 7 bytes)"
    assert store.load("a/b", "p0", version) is None
    assert not store.materialize("a/b", "p0", version, compute, {"why": "test"}).cache_hit and len(calls) == 2
    assert store.status("a/b", "p0", version) == SUCCESS
    fs, vdir = fsspec.core.url_to_fs(first.ref.path)
    assert fs.cat(first.ref.files(".txt")[0]) == b"hello"
    assert json.loads(fs.cat(f"{vdir}/provenance.json"))["version"] == version
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(vdir, detail=False))
    assert names == [".lease", "STATUS.json", "data", "manifest.json", "provenance.json"]  # no .staging-*, no .work


def test_a_stage_that_writes_no_files_commits_an_empty_data_dir_on_gcs(gcs_prefix):
    """GCS has no empty directories: the staging "dir" of a stage that wrote nothing does not exist."""
    store = ArtifactStore(gcs_prefix)
    version = compute_version("quality_model", "1", {"threshold": 0})
    first = store.materialize("quality_model", None, version, lambda out_dir: {"model": 0}, {})
    assert first.cache_hit is False
    assert first.ref.manifest == {"files": [], "total_bytes": 0, "counts": {"model": 0}}
    assert first.ref.files() == []
    loaded = store.load("quality_model", None, version)
    assert loaded == first.ref and store.status("quality_model", None, version) == SUCCESS
    assert store.materialize("quality_model", None, version, lambda out_dir: pytest.fail("recomputed"), {}).cache_hit


def test_a_failed_attempt_is_marked_and_the_rerun_commits_only_its_own_files(gcs_prefix):
    store = ArtifactStore(gcs_prefix)
    version = compute_version("a", "1", {})

    def broken(out_dir: str) -> dict:
        _write_files({"half.txt": b"partial"})(out_dir)
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        store.materialize("a", None, version, broken, {})
    assert store.status("a", None, version) == FAILED and store.load("a", None, version) is None
    result = store.materialize("a", None, version, _write_files({"ok.txt": b"ok"}), {})
    assert not result.cache_hit
    assert [f["path"] for f in result.ref.manifest["files"]] == ["ok.txt"]
    fs, vdir = fsspec.core.url_to_fs(result.ref.path)
    assert not [p for p in fs.find(vdir) if "/.staging-" in p]  # the failed attempt's staging was cleaned
