"""The artifact store: versioned directories with status, provenance and atomic commit.

Layout of one artifact::

    $MARIN_PREFIX/<asset/key>/<partition>/<version16>/
        STATUS.json        {"status": "RUNNING" | "SUCCESS" | "FAILED", ...}
        provenance.json    config, upstream versions, code version, counts, durations
        manifest.json      files under data/ with sizes, plus the stage's counts
        data/              the artifact itself
        .staging-<id>/     only while a run computes; renamed to data/ on commit
        .work/             scratch that survives a killed attempt (e.g. training
                           checkpoints to resume from); removed after SUCCESS

An artifact is complete exactly when STATUS.json says SUCCESS. It is written last, after
data/, manifest and provenance, so a run killed at any point leaves something that does
not look complete, and the next run cleans it up and recomputes the same version.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from marin_assets.store.fsutil import filesystem, is_local, join, list_files, read_json, unstrip, write_json_atomic
from marin_assets.store.lease import Lease, LeaseConfig, LeaseLost, SystemClock
from marin_assets.store.names import partition_segment, validate_asset_key
from marin_assets.store.versioning import short_version

SUCCESS, RUNNING, FAILED = "SUCCESS", "RUNNING", "FAILED"


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
    def from_json(cls, value: Mapping[str, Any]) -> "ArtifactRef":
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
        """The committed artifact of this version, or None if there is no SUCCESS."""
        vdir = self.version_dir(asset_key, partition, version)
        status = self._status_record(vdir, version)
        if not status or status.get("status") != SUCCESS:
            return None
        manifest = read_json(self.fs, join(vdir, "manifest.json")) or {}
        return ArtifactRef("/".join(validate_asset_key(asset_key)), partition, version, unstrip(self.fs, vdir), manifest)

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
        files = list_files(self.fs, data_dir)
        manifest = {
            "files": [{"path": p, "bytes": b} for p, b in files],
            "total_bytes": sum(b for _, b in files),
            "counts": counts,
        }
        write_json_atomic(self.fs, join(vdir, "manifest.json"), manifest)
        write_json_atomic(
            self.fs, join(vdir, "provenance.json"), {**provenance, "version": version, "counts": counts, "compute_seconds": round(compute_s, 3)}
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
            self.fs, join(vdir, "STATUS.json"), {"status": FAILED, "version": version, "error": f"{type(err).__name__}: {err}"[:2000]},
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
        write_json_atomic(self.fs, join(self.partition_dir(ref.asset_key, ref.partition), "LATEST.json"), ref.to_json())

    def read_pointer(self, asset_key: str, partition: str | None) -> ArtifactRef | None:
        record = read_json(self.fs, join(self.partition_dir(asset_key, partition), "LATEST.json"))
        return None if record is None else ArtifactRef.from_json(record)


def dumps_ref(ref: ArtifactRef) -> str:
    return json.dumps(ref.to_json(), sort_keys=True)
