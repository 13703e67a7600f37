"""The artifact store: versioned directories with status, provenance and atomic commit.

Layout of one artifact::

    $MARIN_PREFIX/<asset/key>/<partition>/<version16>/
        STATUS.json        {"status": "RUNNING" | "SUCCESS" | "FAILED", ...}
        provenance.json    config, upstream versions, code version, counts, durations
        manifest.json      files under data/ with sizes (and sha256 up to DIGEST_MAX_BYTES),
                           plus the stage's counts
        data/              the artifact itself
        .staging-<id>/     only while a run computes; renamed to data/ on commit
        .work/             scratch that survives a killed attempt (e.g. training
                           checkpoints to resume from); removed after SUCCESS

An artifact is complete exactly when STATUS.json says SUCCESS. It is written last, after
data/, manifest and provenance, so a run killed at any point leaves something that does
not look complete, and the next run cleans it up and recomputes the same version. A SUCCESS
whose data/ no longer matches its manifest (a file deleted, truncated or rewritten after the
commit) is not served either: ``load`` treats it as absent, so the next run recomputes it.

Pointers (``<asset/key>/<partition>/LATEST.json``) name a version, and a version's directory
follows from the store's own layout: a pointer is read relative to the store it lies in,
so a prefix copied with ``cp -r`` (or to another bucket) reads only its own files.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from marin_assets.store.fsutil import filesystem, is_local, join, list_files, read_json, sha256_of, unstrip, write_json_atomic
from marin_assets.store.lease import Lease, LeaseConfig, LeaseLost, SystemClock
from marin_assets.store.names import partition_segment, validate_asset_key
from marin_assets.store.versioning import short_version

SUCCESS, RUNNING, FAILED = "SUCCESS", "RUNNING", "FAILED"
# Files up to this size get a sha256 in the manifest, checked wherever an artifact is verified (every
# cache hit and up-to-date check, a trainer's first read of a shard); a bigger file is checked by its
# size alone, since hashing it would read the whole store on every rerun. Metadata, ledgers, offsets
# and small shards fall under it. Measured here: sha256 of 8 MiB 6.5 ms; checking a tokenized shard
# artifact of 12 small files 0.7 ms; a trainer's first-read check of one shard split 4.8 ms (local disk).
DIGEST_MAX_BYTES = 8 << 20
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ArtifactRef:
    """What flows between assets: where a committed artifact is and what it holds."""

    asset_key: str
    partition: str | None
    version: str
    path: str  # URL of the version directory
    manifest: Mapping[str, Any] = field(default_factory=dict)

    @property
    def data_path(self) -> str:
        return join(self.path, "data")

    @property
    def counts(self) -> Mapping[str, Any]:
        return self.manifest.get("counts", {})

    def files(self, suffix: str = "") -> list[str]:
        """URLs of the data files (optionally only those ending in ``suffix``)."""
        return [join(self.data_path, f["path"]) for f in self.manifest.get("files", []) if f["path"].endswith(suffix)]

    def to_json(self) -> dict[str, Any]:
        return {
            "asset_key": self.asset_key,
            "partition": self.partition,
            "version": self.version,
            "path": self.path,
            "manifest": dict(self.manifest),
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> ArtifactRef:
        return cls(value["asset_key"], value.get("partition"), value["version"], value["path"], value.get("manifest", {}))


@dataclass(frozen=True)
class Materialization:
    ref: ArtifactRef
    cache_hit: bool
    duration_s: float


class ArtifactStore:
    """Content-versioned artifacts under one prefix (local path or fsspec URL)."""

    def __init__(self, prefix: str, lease: LeaseConfig | None = None, poll_s: float = 0.5, clock=None):
        self.prefix = prefix
        self.fs, self.root = filesystem(prefix)
        self.lease_config = lease or LeaseConfig()
        self.poll_s = poll_s
        self.clock = clock or SystemClock()  # monotonic() and sleep(); tests pass a FakeClock

    # ---- paths ------------------------------------------------------------------
    def partition_dir(self, asset_key: str, partition: str | None) -> str:
        return join(self.root, *validate_asset_key(asset_key), partition_segment(partition))

    def version_dir(self, asset_key: str, partition: str | None, version: str) -> str:
        return join(self.partition_dir(asset_key, partition), short_version(version))

    def scratch_dir(self, asset_key: str, partition: str | None, version: str) -> str:
        """Per-version scratch kept across failed attempts, so long work can resume."""
        return unstrip(self.fs, join(self.version_dir(asset_key, partition, version), ".work"))

    # ---- reads ------------------------------------------------------------------
    def _status_record(self, vdir: str, version: str) -> dict | None:
        """STATUS.json of ``version`` in ``vdir``; refuse a SUCCESS of another full version.

        Directories are named by the first 16 hex digits only, so two versions can share
        one. A committed artifact of the other version must never be served as this one.
        """
        record = read_json(self.fs, join(vdir, "STATUS.json"))
        if not isinstance(record, dict):
            return None
        if record.get("version") != version:
            if record.get("status") == SUCCESS:
                raise RuntimeError(
                    f"{vdir} holds version {record.get('version')}, not {version} "
                    f"(collision of the {len(short_version(version))}-character short hash); refusing to use or overwrite it"
                )
            return None  # a RUNNING/FAILED leftover of the other version is not ours
        return record

    def status(self, asset_key: str, partition: str | None, version: str) -> str | None:
        record = self._status_record(self.version_dir(asset_key, partition, version), version)
        return None if record is None else record.get("status")

    def load(self, asset_key: str, partition: str | None, version: str) -> ArtifactRef | None:
        """The committed artifact of this version, or None if there is no SUCCESS, or if its files
        no longer match its manifest (then the next materialize recomputes it; the reason is logged)."""
        vdir = self.version_dir(asset_key, partition, version)
        status = self._status_record(vdir, version)
        if not status or status.get("status") != SUCCESS:
            return None
        manifest = read_json(self.fs, join(vdir, "manifest.json"))
        if not isinstance(manifest, dict):
            manifest, damage = {}, "manifest.json: missing"
        else:
            damage = files_damage(self.fs, join(vdir, "data"), manifest.get("files", []))
        if damage is not None:
            log.warning("%s: not the committed artifact any more (%s); it will be recomputed", unstrip(self.fs, vdir), damage)
            return None
        return ArtifactRef("/".join(validate_asset_key(asset_key)), partition, version, unstrip(self.fs, vdir), manifest)

    def damage(self, ref: ArtifactRef) -> str | None:
        """How ``ref``'s files differ from its manifest ('PATH: reason'), or None when they match."""
        vdir = self.version_dir(ref.asset_key, ref.partition, ref.version)
        return files_damage(self.fs, join(vdir, "data"), ref.manifest.get("files", []))

    # ---- the protocol -------------------------------------------------------------
    def materialize(
        self,
        asset_key: str,
        partition: str | None,
        version: str,
        compute: Callable[[str], Mapping[str, Any] | None],
        provenance: Mapping[str, Any],
        wait_timeout_s: float = 24 * 3600,
    ) -> Materialization:
        """Return the SUCCESS artifact of ``version``, computing it at most once.

        ``compute(staging_url)`` writes the artifact's files under ``staging_url`` and
        returns counts (rows, docs, tokens...) that go into the manifest.
        """
        clock = self.clock
        start = clock.monotonic()
        vdir = self.version_dir(asset_key, partition, version)
        deadline = start + wait_timeout_s
        # One Lease for all polls: it remembers what it saw, which is how it judges staleness.
        lease = Lease(self.fs, vdir, self.lease_config, clock=clock)
        while True:
            ref = self.load(asset_key, partition, version)
            if ref is not None:
                return Materialization(ref, True, clock.monotonic() - start)
            if lease.acquire():
                try:
                    ref = self.load(asset_key, partition, version)
                    if ref is not None:  # finished by another run while we waited
                        return Materialization(ref, True, clock.monotonic() - start)
                    ref = self._compute_and_commit(asset_key, partition, version, vdir, compute, provenance, lease)
                    return Materialization(ref, False, clock.monotonic() - start)
                finally:
                    lease.release()
            if clock.monotonic() > deadline:
                raise TimeoutError(f"gave up after {wait_timeout_s:.0f}s waiting for another run to finish {vdir}")
            clock.sleep(self.poll_s)

    def _compute_and_commit(self, asset_key, partition, version, vdir, compute, provenance, lease) -> ArtifactRef:
        self._clean_leftovers(vdir)
        # advisory (no fsync): lost in a machine crash, the directory just has no SUCCESS
        write_json_atomic(self.fs, join(vdir, "STATUS.json"), {"status": RUNNING, "version": version}, durable=False)
        staging = join(vdir, f".staging-{uuid.uuid4().hex[:12]}")
        self.fs.makedirs(staging, exist_ok=True)
        started = time.monotonic()
        try:
            counts = dict(compute(unstrip(self.fs, staging)) or {})
            compute_s = time.monotonic() - started
            manifest = self._commit(vdir, staging, version, counts, provenance, compute_s, lease)
        except BaseException as err:
            self._mark_failed(vdir, version, err, lease)
            raise
        return ArtifactRef("/".join(validate_asset_key(asset_key)), partition, version, unstrip(self.fs, vdir), manifest)

    def _commit(self, vdir, staging, version, counts, provenance, compute_s, lease) -> dict:
        """data/, then manifest and provenance, then SUCCESS: a failure at any step leaves
        no SUCCESS, so the next run recomputes. The lease is checked before the first and
        the last step (a holder that lost it must not publish)."""
        try:
            lease.check()
        except LeaseLost as err:
            raise LeaseLost(f"{err}; not committing {vdir}") from None
        data_dir = join(vdir, "data")
        self._publish_staging(staging, data_dir)
        files = file_records(self.fs, data_dir)
        manifest = {"files": files, "total_bytes": sum(f["bytes"] for f in files), "counts": counts}
        write_json_atomic(self.fs, join(vdir, "manifest.json"), manifest)
        write_json_atomic(
            self.fs,
            join(vdir, "provenance.json"),
            {**provenance, "version": version, "counts": counts, "compute_seconds": round(compute_s, 3)},
        )
        try:
            lease.check()
        except LeaseLost as err:
            raise LeaseLost(f"{err}; not marking {vdir} SUCCESS") from None
        write_json_atomic(self.fs, join(vdir, "STATUS.json"), {"status": SUCCESS, "version": version})
        if self.fs.exists(join(vdir, ".work")):
            self.fs.rm(join(vdir, ".work"), recursive=True)
        return manifest

    def _publish_staging(self, staging: str, data_dir: str) -> None:
        """Move the staged files to data/. Object stores have no empty directories: a stage that wrote
        nothing has no staging "dir" to move (``mv`` raises FileNotFoundError on GCS), and its data/ is
        empty by having no objects under it."""
        if is_local(self.fs):
            os.rename(staging, data_dir)  # atomic on one filesystem
        elif self.fs.find(staging):
            self.fs.mv(staging, data_dir, recursive=True)
        elif self.fs.exists(staging):  # an empty pseudo-directory (memory://): not left behind as a leftover
            self.fs.rm(staging, recursive=True)

    def _mark_failed(self, vdir: str, version: str, err: BaseException, lease: Lease) -> None:
        """Record FAILED, unless the lease is gone: then the directory belongs to another run."""
        if not lease.held():
            return
        write_json_atomic(
            self.fs,
            join(vdir, "STATUS.json"),
            {"status": FAILED, "version": version, "error": f"{type(err).__name__}: {err}"[:2000]},
            durable=False,
        )

    def _clean_leftovers(self, vdir: str) -> None:
        """Remove what a killed run left (staging dirs, a partial data/) before recomputing."""
        if not self.fs.exists(vdir):
            return
        for path in self.fs.ls(vdir, detail=False):
            name = path.rstrip("/").rsplit("/", 1)[-1]
            if name.startswith(".staging-") or name in ("data", "manifest.json", "provenance.json"):
                self.fs.rm(path, recursive=True)

    # ---- pointers: which version of an asset partition is current ------------------
    def write_pointer(self, ref: ArtifactRef) -> None:
        """LATEST.json names the version; its ``path`` is written relative to the store (for people
        reading it: ``read_pointer`` derives the directory from the version)."""
        vdir = self.version_dir(ref.asset_key, ref.partition, ref.version)
        record = {**ref.to_json(), "path": vdir[len(self.root.rstrip("/")) + 1 :]}
        write_json_atomic(self.fs, join(self.partition_dir(ref.asset_key, ref.partition), "LATEST.json"), record)

    def read_pointer(self, asset_key: str, partition: str | None) -> ArtifactRef | None:
        """The current version's ref, its directory in *this* store: an older pointer's absolute
        ``path`` (into another copy of the prefix, when this one was copied) is not followed."""
        record = read_json(self.fs, join(self.partition_dir(asset_key, partition), "LATEST.json"))
        if record is None:
            return None
        ref = ArtifactRef.from_json(record)
        key = "/".join(validate_asset_key(asset_key))
        if ref.asset_key != key or ref.partition != partition:
            raise ValueError(
                f"{join(self.partition_dir(asset_key, partition), 'LATEST.json')}: names {ref.asset_key} "
                f"partition {ref.partition!r}, not {key} partition {partition!r}"
            )
        vdir = self.version_dir(key, partition, ref.version)
        return ArtifactRef(key, partition, ref.version, unstrip(self.fs, vdir), ref.manifest)


def file_records(fs, data_dir: str) -> list[dict]:
    """The manifest's record of every file under ``data_dir``: path, bytes, and sha256 when it is
    at most DIGEST_MAX_BYTES."""
    return [
        {"path": path, "bytes": size, **({"sha256": sha256_of(fs, join(data_dir, path))} if size <= DIGEST_MAX_BYTES else {})}
        for path, size in list_files(fs, data_dir)
    ]


def files_damage(fs, data_dir: str, files, under: str = "") -> str | None:
    """The first way the files under ``data_dir`` (only those under ``under``, when given) differ
    from their manifest records, as 'PATH: reason'; None when each is there with its size and
    (where the record has one) its sha256. One listing, then a hash per small file."""
    prefix = under.strip("/") + "/" if under else ""
    present = dict(list_files(fs, join(data_dir, prefix)))  # paths relative to data_dir/prefix
    for record in files:
        path = record.get("path")
        if not isinstance(path, str) or not path.startswith(prefix):
            continue
        size = present.get(path[len(prefix) :])
        if size is None:
            return f"{path}: missing (the manifest lists it, {record.get('bytes')} bytes)"
        if size != record.get("bytes"):
            return f"{path}: {size} bytes, the manifest says {record.get('bytes')}"
        if "sha256" in record and sha256_of(fs, join(data_dir, path)) != record["sha256"]:
            return f"{path}: its sha256 differs from the manifest's (rewritten after the commit)"
    return None


def artifact_damage(data_url: str, under: str = "") -> str | None:
    """For a reader handed a path, not a ref: when ``data_url`` is a committed artifact's data/
    folder (its parent holds STATUS.json), how its files under ``under`` differ from its manifest;
    None when they match, or when the folder is not in an artifact store (nothing to check against)."""
    fs, data_dir = filesystem(data_url)
    vdir = data_dir.rsplit("/", 1)[0]
    if data_dir.rsplit("/", 1)[-1] != "data" or read_json(fs, join(vdir, "STATUS.json")) is None:
        return None
    manifest = read_json(fs, join(vdir, "manifest.json"))
    if not isinstance(manifest, dict):
        return f"{join(vdir, 'manifest.json')}: missing or not an object"
    return files_damage(fs, data_dir, manifest.get("files", []), under)


def dumps_ref(ref: ArtifactRef) -> str:
    return json.dumps(ref.to_json(), sort_keys=True)
