"""The files of a telemetry store and nothing else: segments written whole (staging file + fsync +
rename, or one PUT), the JSON index kept beside them, and the listing that says which segments
are live (store.py describes the layout and why its order keeps queries exact).

Queries, compaction and repair (queries.py, compaction.py, repair.py) build on this class;
TelemetryStore (store.py) is all of them together.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import os
import time
import uuid
from collections.abc import Iterable
from dataclasses import replace
from typing import cast

import pyarrow as pa
import pyarrow.parquet as pq

from marin_assets.store.fsutil import filesystem, fsync_dir, is_local, join, read_json, write_json_atomic
from marin_assets.store.lease import Lease
from marin_assets.store.names import validate_segment
from marin_assets.telemetry.segments import READ_ERRORS, SegmentInfo, SourceRange, encode, normalise, read_footer, summarise

INDEX_FORMAT = 1


class DamagedSegmentError(RuntimeError):
    """Segment files that cannot be read; ``problems`` maps each path to the reason."""

    def __init__(self, url: str, problems: dict[str, str]):
        self.problems = dict(sorted(problems.items()))
        named = "; ".join(f"{path} ({why})" for path, why in self.problems.items())
        super().__init__(f"{url}: {len(problems)} damaged segment(s): {named}; `marin telemetry repair` quarantines them")


def damage_reason(err: Exception) -> str:
    """One line: the exception's type and first line (pyarrow/polars messages run long)."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}: {text}"[:300]


class StoreFiles:
    """A telemetry store's segment files and index: write a segment, list the live ones."""

    def __init__(self, root: str):
        self.url = root
        self.fs, self.root = filesystem(root)
        self.local = is_local(self.fs)
        if self.fs.isfile(self.root):  # every later listing and write would fail deep inside, one by one
            raise ValueError(f"telemetry store root {root} is a file, not a directory")

    def _abs(self, rel: str) -> str:
        return join(self.root, rel)

    def _new_path(self, run: str, kind: str, window: str | None = None) -> str:
        window = window or time.strftime("%Y%m%dT%H", time.gmtime())
        return f"segments/{run}/{window}/{kind}-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.parquet"

    def _list_segment_files(self) -> list[str]:
        top = self._abs("segments")
        if not self.fs.exists(top):
            return []
        prefix = self.root.rstrip("/") + "/"
        found = self.fs.find(top)
        return sorted(p[len(prefix) :] if p.startswith(prefix) else p for p in found if p.endswith(".parquet"))

    def append(self, table: pa.Table, sources: Iterable[SourceRange] = ()) -> SegmentInfo:
        """Write ``table`` (SCHEMA columns, one run, >= 1 row) as one new segment; ``sources``
        are the ingested byte ranges whose rows it holds (see segments.py)."""
        table = normalise(table)
        if table.num_rows == 0:
            raise ValueError("refusing to write an empty segment")
        run = validate_segment(str(table.column("run")[0]), "run")
        info = summarise(table, self._new_path(run, "s"), created=time.time(), sources=tuple(sources))
        return self._publish(table, info)

    @contextlib.contextmanager
    def ingest_lease(self, run: str, timeout_s: float = 600.0):
        """Hold ``run``'s ingest lease (waiting up to ``timeout_s``), so that two ingests into one
        run never both decide that a file's rows are new. Yields the Lease (``check()`` it)."""
        lease = Lease(self.fs, self._abs(f"_ingest/{validate_segment(run, 'run')}"))
        deadline = time.monotonic() + timeout_s
        while not lease.acquire():
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"{self.url}: another ingest into run {run!r} held its lease for {timeout_s:.0f}s; try again later"
                )
            time.sleep(0.05)
        try:
            yield lease
        finally:
            lease.release()

    def _publish(self, table: pa.Table, info: SegmentInfo) -> SegmentInfo:
        data, info = encode(table, info)
        self._put(info.path, data)
        self._update_index(add=[info])
        return info

    def _put(self, rel: str, data: bytes) -> None:
        """Make a whole segment appear at once: staging file + fsync + rename, or one PUT."""
        dest = self._abs(rel)
        if not self.local:
            self.fs.pipe_file(dest, data)  # a single PUT: object stores show all of it or nothing
            return
        staging_dir = self._abs("_staging")
        os.makedirs(staging_dir, exist_ok=True)
        staging = os.path.join(staging_dir, os.path.basename(rel) + ".tmp")
        with open(staging, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        os.replace(staging, dest)
        fsync_dir(os.path.dirname(dest))

    @contextlib.contextmanager
    def _index_lock(self):
        """Serialise index read-modify-writes. Object stores get no lock: a lost update only
        costs a footer read later, because readers reconcile the index with the listing."""
        if not self.local:
            yield
            return
        os.makedirs(self.root, exist_ok=True)
        fd = os.open(self._abs(".index.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def read_index(self) -> dict:
        """The index (format, segment summaries, retired files), or an empty one when it is
        missing, unreadable or of another format: a cache, so losing it costs only footer reads."""
        try:
            index = read_json(self.fs, self._abs("index.json"))
        except ValueError:
            index = None  # unreadable JSON: treat as absent; the listing still has every segment
        empty = {"format": INDEX_FORMAT, "segments": [], "retired": []}
        if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT:
            return empty
        try:
            for entry in index["segments"]:
                SegmentInfo.from_json(entry)
            for entry in index["retired"]:
                _ = str(entry["path"]), float(entry["since"])
        except (KeyError, TypeError, ValueError):
            return empty  # a damaged index: every segment's own footer still tells the truth
        return index

    def _update_index(self, add: Iterable[SegmentInfo] = (), remove: Iterable[str] = (), retire: Iterable[str] = ()) -> None:
        with self._index_lock():
            index = self.read_index()
            segments = {e["path"]: e for e in index["segments"]}
            for path in remove:
                segments.pop(path, None)
            for info in add:
                segments[info.path] = info.to_json()
            retired = {r["path"]: r for r in index["retired"]}
            now = time.time()
            for path in retire:
                retired.setdefault(path, {"path": path, "since": now})
            index = {
                "format": INDEX_FORMAT,
                "segments": sorted(segments.values(), key=lambda e: e["path"]),
                "retired": sorted(retired.values(), key=lambda r: r["path"]),
            }
            self.fs.makedirs(self.root, exist_ok=True)
            write_json_atomic(self.fs, self._abs("index.json"), index)

    def _footer(self, rel: str) -> SegmentInfo:
        with self.fs.open(self._abs(rel), "rb") as f:
            return read_footer(f, rel)

    def _read_checked(self, rel: str) -> SegmentInfo:
        """The footer summary of a segment, with its size and sha256, once every row decodes and
        the row count matches the footer. Raises one of READ_ERRORS for a damaged file."""
        data = cast(bytes, self.fs.cat_file(self._abs(rel)))  # fsspec types it str | bytes; a whole file is bytes
        info = read_footer(io.BytesIO(data), rel)
        rows = pq.read_table(io.BytesIO(data)).num_rows
        if rows != info.rows:
            raise ValueError(f"holds {rows} rows, its footer says {info.rows}")
        return replace(info, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())

    def _snapshot(self) -> tuple[list[SegmentInfo], dict[str, SegmentInfo], list[str], dict[str, str]]:
        """(live segments, every summarised listed segment by path, listed paths, unindexed
        files whose footer cannot be read -> reason)."""
        index = self.read_index()
        known = {e["path"]: SegmentInfo.from_json(e) for e in index["segments"]}
        retired = {r["path"] for r in index["retired"]}
        listed = self._list_segment_files()
        entries: dict[str, SegmentInfo] = {}
        damaged: dict[str, str] = {}
        for path in listed:
            if path in known:
                entries[path] = known[path]
            elif path not in retired:  # a retired file is superseded by an indexed segment
                try:
                    entries[path] = self._footer(path)
                except FileNotFoundError:
                    continue  # deleted between listing and reading: a compaction retired it
                except READ_ERRORS as err:
                    damaged[path] = damage_reason(err)
        superseded = {r for info in entries.values() for r in info.replaces}
        live = [info for path, info in entries.items() if path not in superseded]
        return live, entries, listed, damaged

    def segments(self) -> list[SegmentInfo]:
        """The live segments (what a query over everything reads), sorted by path. Raises
        DamagedSegmentError for an unindexed file without a readable footer: it could hold
        rows of any run, so no answer is complete without it."""
        live, _, _, damaged = self._snapshot()
        if damaged:
            raise DamagedSegmentError(self.url, damaged)
        return live

    def runs(self) -> list[str]:
        """The runs that have live segments, sorted."""
        return sorted({s.run for s in self.segments()})
