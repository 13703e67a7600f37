"""The telemetry store: immutable Parquet segments per run and hour, plus a small JSON index.

Layout under ``root`` (a local path or any fsspec URL)::

    index.json                                  cache: one summary per live segment, retired files
    segments/<run>/<YYYYMMDDTHH>/s-<ns>-<id>.parquet   a flushed segment (written once, never changed)
    segments/<run>/<YYYYMMDDTHH>/c-<ns>-<id>.parquet   a compacted segment (footer lists what it replaces)
    _staging/                                   local only: segments being written (then renamed)
    _compact/                                   the compaction lease
    _ingest/<run>/                              the lease one metrics.jsonl ingest into <run> holds
    _quarantine/segments/...                    damaged segments that ``repair`` moved out of the store

Truth is the set of segment files; the index only saves footer reads. A reader lists
``segments/``, takes summaries from the index (or from the footer of a file the index does
not know yet, e.g. one whose writer was killed before the index update), drops every file
that another listed segment ``replaces``, then prunes by run, metric, step and time range and
hands the survivors to a lazy ``polars`` scan with the same predicates pushed down.

Why that order makes the rules hold:
- a segment appears by one rename (local) or one PUT (object stores), so a killed writer
  leaves complete segments only, plus at most a staging file that readers never list;
- a compacted segment appears, with its ``replaces`` list, in one step, so from that instant
  every reader drops the replaced files: rows are never counted twice, and never missed;
- replaced files are deleted only ``grace_s`` after the swap, so a query planned just
  before a compaction still finds its files (``query`` also re-plans once if one vanished).

A damaged segment (truncated by a crash or a full disk, corrupt, not a segment at all) is never
skipped quietly: a query that would read it raises ``DamagedSegmentError`` naming each such
file (the CLI exits 3), since an answer without its rows would look complete. ``repair``
decodes every file, moves the damaged ones to ``_quarantine/`` and reports the rows lost (a
damaged merged segment whose inputs are still on disk loses none: they count again).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import math
import os
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from marin_assets.knobs import knob
from marin_assets.store.fsutil import filesystem, is_local, join, read_json, write_json_atomic
from marin_assets.store.lease import Lease
from marin_assets.store.names import validate_segment
from marin_assets.telemetry.segments import (
    READ_ERRORS,
    SCHEMA,
    SegmentInfo,
    SourceRange,
    empty_frame,
    encode,
    normalise,
    read_footer,
    summarise,
)

INDEX_FORMAT = 1
STAGING_MAX_AGE_S = 3600.0  # a staging file this old belongs to a dead writer
QUARANTINE = "_quarantine"


@dataclass(frozen=True)
class CompactionConfig:
    """How ``TelemetryStore.compact`` merges. Knobs (marin_assets/knobs.py): `marin telemetry
    compact` flags and ``compact``'s defaults."""

    target_rows: int = knob(1_000_000, help="merge small segments of a run and hour into ones of about this many rows")
    grace_s: float = knob(300.0, help="keep replaced files this long (seconds) for queries already planned")

    def __post_init__(self) -> None:
        if self.target_rows < 2:
            raise ValueError(f"target_rows must be at least 2, got {self.target_rows}")
        if not (math.isfinite(self.grace_s) and self.grace_s >= 0):
            raise ValueError(f"grace_s must be a finite number >= 0, got {self.grace_s}")


_COMPACTION = CompactionConfig()


class DamagedSegmentError(RuntimeError):
    """Segment files that cannot be read; ``problems`` maps each path to the reason."""

    def __init__(self, url: str, problems: dict[str, str]):
        self.problems = dict(sorted(problems.items()))
        named = "; ".join(f"{path} ({why})" for path, why in self.problems.items())
        super().__init__(f"{url}: {len(problems)} damaged segment(s): {named}; "
                         "`marin telemetry repair` quarantines them")


@dataclass
class CompactionReport:
    merged: int = 0  # input segments replaced
    written: int = 0  # merged segments written
    rows: int = 0  # rows rewritten (equal before and after)
    deleted: int = 0  # replaced files removed (those past the grace period)
    live_segments: int = 0  # segments a query sees after compaction


@dataclass
class RepairReport:
    live_segments: int = 0
    rows: int = 0
    unindexed: list[str] = field(default_factory=list)  # found on disk, added to the index
    missing: list[str] = field(default_factory=list)  # in the index, gone from disk, dropped
    stale_staging: list[str] = field(default_factory=list)  # dead writers' partial files, removed
    # unreadable segments moved to _quarantine/: {"path", "reason", "rows" (the index's count, or None)}
    damaged: list[dict] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)  # inputs of a damaged merged segment, live again
    rows_lost: int | None = 0  # damaged rows not restored; None when the index did not know a count


def _names(value: str | Iterable[str] | None, what: str) -> frozenset[str] | None:
    if value is None:
        return None
    values = [value] if isinstance(value, str) else list(value)
    if not values:
        raise ValueError(f"{what}: give at least one name or none at all")
    return frozenset(validate_segment(v, what) for v in values)


def check_steps(steps: tuple[int | None, int | None] | None) -> tuple[int | None, int | None]:
    """An inclusive step range; either end may be None (open)."""
    if steps is None:
        return (None, None)
    lo, hi = steps
    for end in (lo, hi):
        if end is not None and (isinstance(end, bool) or not isinstance(end, int) or end < 0):
            raise ValueError(f"step range ends must be non-negative integers, got {steps!r}")
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"step range {lo}:{hi} is empty (start > end)")
    return (lo, hi)


def check_times(times: tuple[float | None, float | None] | None) -> tuple[float | None, float | None]:
    if times is None:
        return (None, None)
    lo, hi = (None if t is None else float(t) for t in times)
    for end in (lo, hi):
        if end is not None and not math.isfinite(end):
            raise ValueError(f"time range ends must be finite, got {times!r}")
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"time range {lo}:{hi} is empty (start > end)")
    return (lo, hi)


class TelemetryStore:
    """Append-only metric rows in immutable Parquet segments; lazy, pruned polars queries."""

    def __init__(self, root: str):
        self.url = root
        self.fs, self.root = filesystem(root)
        self.local = is_local(self.fs)

    # ---- paths ------------------------------------------------------------------------
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
        return sorted(p[len(prefix):] if p.startswith(prefix) else p for p in found if p.endswith(".parquet"))

    # ---- writing ----------------------------------------------------------------------
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
                raise RuntimeError(f"{self.url}: another ingest into run {run!r} held its lease for "
                                   f"{timeout_s:.0f}s; try again later")
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
        _fsync_dir(os.path.dirname(dest))

    # ---- index ------------------------------------------------------------------------
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
                str(entry["path"]), float(entry["since"])
        except (KeyError, TypeError, ValueError):
            return empty  # a damaged index: every segment's own footer still tells the truth
        return index

    def _update_index(self, add: Iterable[SegmentInfo] = (), remove: Iterable[str] = (),
                      retire: Iterable[str] = ()) -> None:
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
            index = {"format": INDEX_FORMAT, "segments": sorted(segments.values(), key=lambda e: e["path"]),
                     "retired": sorted(retired.values(), key=lambda r: r["path"])}
            self.fs.makedirs(self.root, exist_ok=True)
            write_json_atomic(self.fs, self._abs("index.json"), index)

    def _footer(self, rel: str) -> SegmentInfo:
        with self.fs.open(self._abs(rel), "rb") as f:
            return read_footer(f, rel)

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
                    damaged[path] = _reason(err)
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

    # ---- queries ----------------------------------------------------------------------
    def scan(self, run: str | Iterable[str] | None = None, metric: str | Iterable[str] | None = None,
             steps: tuple[int | None, int | None] | None = None,
             times: tuple[float | None, float | None] | None = None) -> pl.LazyFrame:
        """A lazy frame of the matching rows; only segments whose summary overlaps are scanned."""
        runs, metrics = _names(run, "run"), _names(metric, "metric name")
        steps, times = check_steps(steps), check_times(times)
        selected = self._select(runs, metrics, steps, times)
        if not selected:
            return empty_frame()
        frame = self._scan_files([s.path for s in selected])
        predicates = []
        if runs is not None and any(s.run not in runs for s in selected):
            predicates.append(_one_of("run", runs))  # (never true today: a segment holds one run)
        if metrics is not None:
            predicates.append(_one_of("metric", metrics))
        if steps[0] is not None:
            predicates.append(pl.col("step") >= steps[0])
        if steps[1] is not None:
            predicates.append(pl.col("step") <= steps[1])
        if times[0] is not None:
            predicates.append(pl.col("time") >= times[0])
        if times[1] is not None:
            predicates.append(pl.col("time") <= times[1])
        return frame.filter(*predicates) if predicates else frame

    def _select(self, runs: frozenset[str] | None, metrics: frozenset[str] | None,
                steps: tuple[int | None, int | None], times: tuple[float | None, float | None]) -> list[SegmentInfo]:
        return [s for s in self.segments() if s.overlaps(runs, metrics, steps, times)]

    def _scan_files(self, rels: list[str]) -> pl.LazyFrame:
        paths = [self._abs(r) for r in rels]
        if self.local:
            return pl.scan_parquet(paths, hive_partitioning=False)
        import pyarrow.dataset as ds
        from pyarrow.fs import FSSpecHandler, PyFileSystem

        dataset = ds.dataset(paths, filesystem=PyFileSystem(FSSpecHandler(self.fs)), format="parquet", schema=SCHEMA)
        return pl.scan_pyarrow_dataset(dataset)

    def query(self, run: str | Iterable[str] | None = None, metric: str | Iterable[str] | None = None,
              steps: tuple[int | None, int | None] | None = None,
              times: tuple[float | None, float | None] | None = None, latest: bool = False) -> pl.DataFrame:
        """The matching rows, collected and sorted by (run, metric, step, time, value, phase).

        latest: keep one row per (run, metric, step), the one logged last (by time; rows
        without a time count as oldest). A run resumed from a checkpoint logs the steps after
        it again; this shows the resumed values only. Rows are still all kept in the store.
        """
        runs, metrics = _names(run, "run"), _names(metric, "metric name")
        steps, times = check_steps(steps), check_times(times)
        for attempt in (1, 2):
            try:
                frame = self.scan(runs, metrics, steps, times).collect()
                break
            except READ_ERRORS as err:
                # A compaction past its grace period deleted a planned file: plan again.
                if attempt == 1 and _is_missing_file(err):
                    continue
                self._raise_if_damaged(self._select(runs, metrics, steps, times))
                raise
        frame = frame.sort(["run", "metric", "step", "time", "value", "phase"], nulls_last=False)
        if latest:
            frame = frame.unique(subset=["run", "metric", "step"], keep="last", maintain_order=True)
        return frame

    def _raise_if_damaged(self, infos: Iterable[SegmentInfo]) -> None:
        """Decode each segment in full; raise DamagedSegmentError naming those that fail."""
        damaged = {}
        for info in infos:
            try:
                checked = self._read_checked(info.path)
            except FileNotFoundError:
                continue  # retired and deleted meanwhile: not damage
            except READ_ERRORS as err:
                damaged[info.path] = _reason(err)
                continue
            if info.sha256 not in (None, checked.sha256):
                damaged[info.path] = "size or sha256 differs from the index"
        if damaged:
            raise DamagedSegmentError(self.url, damaged)

    def _read_checked(self, rel: str) -> SegmentInfo:
        """The footer summary of a segment, with its size and sha256, once every row decodes and
        the row count matches the footer. Raises one of READ_ERRORS for a damaged file."""
        data = self.fs.cat_file(self._abs(rel))
        info = read_footer(io.BytesIO(data), rel)
        rows = pq.read_table(io.BytesIO(data)).num_rows
        if rows != info.rows:
            raise ValueError(f"holds {rows} rows, its footer says {info.rows}")
        return replace(info, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())

    def runs(self) -> list[str]:
        return sorted({s.run for s in self.segments()})

    # ---- compaction -------------------------------------------------------------------
    def compact(self, target_rows: int = _COMPACTION.target_rows, grace_s: float = _COMPACTION.grace_s) -> CompactionReport:
        """Merge small segments of the same run and hour into ones of about ``target_rows``.

        Answers do not change: the merged segment holds exactly the rows of the segments it
        replaces, and names them in its footer, so readers drop them the moment it appears.
        Replaced files are deleted once they have been retired for ``grace_s`` seconds.
        """
        CompactionConfig(target_rows, grace_s)  # the checks, before the lease
        lease = Lease(self.fs, self._abs("_compact"))
        if not lease.acquire():
            raise RuntimeError(f"{self.url}: another compaction holds the lease; try again later")
        try:
            report = CompactionReport()
            live, entries, listed, damaged = self._snapshot()
            if damaged:
                raise DamagedSegmentError(self.url, damaged)
            self._heal_index(live, entries)
            listed_set = set(listed)
            for pack in _packs(live, target_rows):
                self._merge(pack, listed_set)
                report.merged += len(pack)
                report.written += 1
                report.rows += sum(s.rows for s in pack)
            report.deleted = self._delete_retired(grace_s)
            report.live_segments = len(self.segments())
            return report
        finally:
            lease.release()

    def _merge(self, pack: list[SegmentInfo], listed: set[str]) -> SegmentInfo:
        table = normalise(pa.concat_tables([self._read_table(s.path) for s in pack]))
        expected = sum(s.rows for s in pack)
        if table.num_rows != expected:
            raise RuntimeError(f"compaction read {table.num_rows} rows from {len(pack)} segments "
                               f"whose summaries say {expected}; run `repair` first")
        # Keep naming files that the inputs replaced and that still exist, so deleting an
        # input later can never bring one of its own predecessors back to life.
        replaces = sorted({s.path for s in pack} | {r for s in pack for r in s.replaces if r in listed})
        window = pack[0].path.split("/")[2]
        sources = tuple(r for s in pack for r in s.sources)  # the merged rows came from the same bytes
        info = summarise(table, self._new_path(pack[0].run, "c", window), tuple(replaces), created=time.time(),
                         sources=sources)
        data, info = encode(table, info)
        self._put(info.path, data)  # from here on readers see the merged rows and not the inputs
        self._update_index(add=[info], remove=replaces, retire=replaces)
        return info

    def _read_table(self, rel: str) -> pa.Table:
        try:
            with self.fs.open(self._abs(rel), "rb") as f:
                return pq.read_table(f)
        except FileNotFoundError:
            raise
        except READ_ERRORS as err:
            raise DamagedSegmentError(self.url, {rel: _reason(err)}) from err

    def _heal_index(self, live: list[SegmentInfo], entries: dict[str, SegmentInfo]) -> None:
        index = self.read_index()
        indexed = {e["path"] for e in index["segments"]}
        unindexed = [s for s in live if s.path not in indexed]
        gone = [p for p in indexed if p not in entries]
        if unindexed or gone:
            self._update_index(add=unindexed, remove=gone)

    def _delete_retired(self, grace_s: float) -> int:
        now = time.time()
        with self._index_lock():
            index = self.read_index()
            due = [r for r in index["retired"] if now - float(r["since"]) >= grace_s]
            for r in due:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(self._abs(r["path"]))
            index["retired"] = [r for r in index["retired"] if r not in due]
            if due:
                write_json_atomic(self.fs, self._abs("index.json"), index)
        return len(due)

    # ---- repair and verification ------------------------------------------------------
    def repair(self) -> RepairReport:
        """Rebuild the index from the segment files, each decoded in full; move damaged files to
        ``_quarantine/`` (reporting the rows lost); drop dead staging files."""
        report = RepairReport()
        with self._index_lock():
            index = self.read_index()
            old = {e["path"]: SegmentInfo.from_json(e) for e in index["segments"]}
            entries, damaged = {}, {}
            for path in self._list_segment_files():
                try:
                    entries[path] = self._read_checked(path)
                except FileNotFoundError:
                    continue  # retired and deleted meanwhile
                except READ_ERRORS as err:
                    damaged[path] = _reason(err)
            for path in damaged:
                self._quarantine(path)
            superseded = {r for info in entries.values() for r in info.replaces}
            live = [e for p, e in entries.items() if p not in superseded]
            now = time.time()
            new_index = {"format": INDEX_FORMAT, "segments": [e.to_json() for e in live],
                         "retired": [{"path": p, "since": now} for p in entries if p in superseded]}
            self.fs.makedirs(self.root, exist_ok=True)
            write_json_atomic(self.fs, self._abs("index.json"), new_index)
        report.live_segments = len(live)
        report.rows = sum(e.rows for e in live)
        report.unindexed = sorted(e.path for e in live if e.path not in old)
        report.missing = sorted(p for p in old if p not in entries and p not in damaged)
        self._account_damage(report, damaged, old, live, superseded)
        report.stale_staging = self._remove_stale_staging()
        return report

    def _quarantine(self, rel: str) -> None:
        """Move a damaged segment out of ``segments/`` (kept, not deleted, for a post-mortem)."""
        dest = self._abs(f"{QUARANTINE}/{rel}")
        self.fs.makedirs(dest.rsplit("/", 1)[0], exist_ok=True)
        self.fs.mv(self._abs(rel), dest)

    @staticmethod
    def _account_damage(report: RepairReport, damaged: dict[str, str], old: dict[str, SegmentInfo],
                        live: list[SegmentInfo], superseded: set[str]) -> None:
        """Rows lost: what the index said each damaged live segment held, less the rows of the
        merged inputs that count again now that the segment replacing them is gone."""
        lost: int | None = 0
        inputs = {r for p in damaged if p in old for r in old[p].replaces}
        for path, why in damaged.items():
            rows = old[path].rows if path in old else None
            report.damaged.append({"path": path, "reason": why, "rows": rows,
                                   "moved_to": f"{QUARANTINE}/{path}"})
            if path in superseded:
                continue  # a readable merged segment holds its rows
            lost = None if rows is None or lost is None else lost + rows
        restored = [e for e in live if e.path in inputs]
        report.restored = sorted(e.path for e in restored)
        report.rows_lost = None if lost is None else lost - sum(e.rows for e in restored)

    def _remove_stale_staging(self) -> list[str]:
        staging = self._abs("_staging")
        if not self.local or not os.path.isdir(staging):
            return []
        removed = []
        for name in sorted(os.listdir(staging)):
            path = os.path.join(staging, name)
            if time.time() - os.path.getmtime(path) >= STAGING_MAX_AGE_S:
                os.remove(path)
                removed.append(name)
        return removed

    def verify(self) -> list[str]:
        """Problems found (empty when healthy): each live segment must read, match its index
        entry's size and checksum, and hold the rows and ranges its summary claims."""
        live, entries, listed, damaged = self._snapshot()
        problems = [f"{path}: unreadable ({why})" for path, why in damaged.items()]
        indexed = {e["path"]: e for e in self.read_index()["segments"]}
        for path in indexed:
            if path not in entries:
                problems.append(f"{path}: in the index but not on disk")
        for info in live:
            if info.path not in indexed:
                problems.append(f"{info.path}: on disk but not in the index (repair adds it)")
                continue
            data = self.fs.cat_file(self._abs(info.path))
            entry = indexed[info.path]
            if entry.get("bytes") not in (None, len(data)) or entry.get("sha256") not in (
                    None, hashlib.sha256(data).hexdigest()):
                problems.append(f"{info.path}: size or sha256 differs from the index")
                continue
            try:
                table = pq.read_table(io.BytesIO(data))
                actual = summarise(normalise(table), info.path, info.replaces, info.created)
            except Exception as err:  # noqa: BLE001 - any read failure is the finding itself
                problems.append(f"{info.path}: unreadable ({err})")
                continue
            if (actual.rows, actual.step_min, actual.step_max, actual.metrics) != (
                    info.rows, info.step_min, info.step_max, info.metrics):
                problems.append(f"{info.path}: rows/steps/metrics differ from its summary")
        return problems


def _packs(live: list[SegmentInfo], target_rows: int) -> list[list[SegmentInfo]]:
    """Groups of >= 2 small segments of one run and hour, each about target_rows rows."""
    groups: dict[tuple[str, str], list[SegmentInfo]] = defaultdict(list)
    for s in live:
        if s.rows < target_rows:
            groups[(s.run, s.path.split("/")[2])].append(s)
    packs = []
    for _, members in sorted(groups.items()):
        current: list[SegmentInfo] = []
        for s in sorted(members, key=lambda s: (s.step_min, s.path)):
            current.append(s)
            if sum(m.rows for m in current) >= target_rows:
                packs.append(current)
                current = []
        packs.append(current)
    return [p for p in packs if len(p) >= 2]


def _one_of(column: str, names: frozenset[str]) -> pl.Expr:
    """``==`` for one name: polars prunes row groups with it more cheaply than with is_in."""
    return pl.col(column) == next(iter(names)) if len(names) == 1 else pl.col(column).is_in(sorted(names))


def _reason(err: Exception) -> str:
    """One line: the exception's type and first line (pyarrow/polars messages run long)."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}: {text}"[:300]


def _is_missing_file(err: Exception) -> bool:
    return isinstance(err, FileNotFoundError) or "No such file" in str(err) or "not found" in str(err).lower()


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
