"""Repair and verification of a telemetry store: rebuild the index from the segment files, each
decoded in full; move damaged segments to ``_quarantine/`` and count the rows lost (a damaged
merged segment whose inputs are still on disk loses none); remove dead writers' staging files;
``verify`` lists every disagreement between the files and the index without changing anything.
"""

from __future__ import annotations

import hashlib
import io
import os
import time
from dataclasses import dataclass, field
from typing import cast

import pyarrow.parquet as pq

from marin_assets.store.fsutil import write_json_atomic
from marin_assets.telemetry.segments import READ_ERRORS, SegmentInfo, normalise, summarise
from marin_assets.telemetry.store_files import INDEX_FORMAT, StoreFiles, damage_reason

STAGING_MAX_AGE_S = 3600.0  # a staging file this old belongs to a dead writer
QUARANTINE = "_quarantine"


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


class StoreRepair(StoreFiles):
    """``repair`` (rebuild the index, quarantine damage) and ``verify`` (report only)."""

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
                    damaged[path] = damage_reason(err)
            for path in damaged:
                self._quarantine(path)
            superseded = {r for info in entries.values() for r in info.replaces}
            live = [e for p, e in entries.items() if p not in superseded]
            now = time.time()
            new_index = {
                "format": INDEX_FORMAT,
                "segments": [e.to_json() for e in live],
                "retired": [{"path": p, "since": now} for p in entries if p in superseded],
            }
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
    def _account_damage(
        report: RepairReport, damaged: dict[str, str], old: dict[str, SegmentInfo], live: list[SegmentInfo], superseded: set[str]
    ) -> None:
        """Rows lost: what the index said each damaged live segment held, less the rows of the
        merged inputs that count again now that the segment replacing them is gone."""
        lost: int | None = 0
        inputs = {r for p in damaged if p in old for r in old[p].replaces}
        for path, why in damaged.items():
            rows = old[path].rows if path in old else None
            report.damaged.append({"path": path, "reason": why, "rows": rows, "moved_to": f"{QUARANTINE}/{path}"})
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
            data = cast(bytes, self.fs.cat_file(self._abs(info.path)))  # fsspec types it str | bytes
            entry = indexed[info.path]
            if entry.get("bytes") not in (None, len(data)) or entry.get("sha256") not in (None, hashlib.sha256(data).hexdigest()):
                problems.append(f"{info.path}: size or sha256 differs from the index")
                continue
            try:
                table = pq.read_table(io.BytesIO(data))
                actual = summarise(normalise(table), info.path, info.replaces, info.created)
            except Exception as err:  # noqa: BLE001 - any read failure is the finding itself
                problems.append(f"{info.path}: unreadable ({err})")
                continue
            if (actual.rows, actual.step_min, actual.step_max, actual.metrics) != (
                info.rows,
                info.step_min,
                info.step_max,
                info.metrics,
            ):
                problems.append(f"{info.path}: rows/steps/metrics differ from its summary")
        return problems
