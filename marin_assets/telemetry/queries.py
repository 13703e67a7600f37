"""Queries over a telemetry store: pick the live segments whose summaries overlap the request
(run, metric, step and time ranges), then scan only those with polars, the same predicates
pushed down. A query that meets a damaged segment raises DamagedSegmentError naming it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import polars as pl

from marin_assets.store.names import validate_segment
from marin_assets.telemetry.segments import READ_ERRORS, SCHEMA, SegmentInfo, empty_frame, validate_metric_name
from marin_assets.telemetry.store_files import DamagedSegmentError, StoreFiles, damage_reason


def _names(value: str | Iterable[str] | None, what: str) -> frozenset[str] | None:
    if value is None:
        return None
    values = [value] if isinstance(value, str) else list(value)
    if not values:
        raise ValueError(f"{what}: give at least one name or none at all")
    check = validate_metric_name if what == "metric name" else lambda v: validate_segment(v, what)
    return frozenset(check(v) for v in values)


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
    """An inclusive time range in unix seconds, ends finite; either end may be None (open)."""
    if times is None:
        return (None, None)
    lo, hi = (None if t is None else float(t) for t in times)
    for end in (lo, hi):
        if end is not None and not math.isfinite(end):
            raise ValueError(f"time range ends must be finite, got {times!r}")
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"time range {lo}:{hi} is empty (start > end)")
    return (lo, hi)


class StoreQueries(StoreFiles):
    """``scan`` (lazy) and ``query`` (collected) over the live segments."""

    def scan(
        self,
        run: str | Iterable[str] | None = None,
        metric: str | Iterable[str] | None = None,
        steps: tuple[int | None, int | None] | None = None,
        times: tuple[float | None, float | None] | None = None,
    ) -> pl.LazyFrame:
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

    def _select(
        self,
        runs: frozenset[str] | None,
        metrics: frozenset[str] | None,
        steps: tuple[int | None, int | None],
        times: tuple[float | None, float | None],
    ) -> list[SegmentInfo]:
        return [s for s in self.segments() if s.overlaps(runs, metrics, steps, times)]

    def _scan_files(self, rels: list[str]) -> pl.LazyFrame:
        paths = [self._abs(r) for r in rels]
        if self.local:
            return pl.scan_parquet(paths, hive_partitioning=False)
        import pyarrow.dataset as ds
        from pyarrow.fs import FSSpecHandler, PyFileSystem

        dataset = ds.dataset(paths, filesystem=PyFileSystem(FSSpecHandler(self.fs)), format="parquet", schema=SCHEMA)
        return pl.scan_pyarrow_dataset(dataset)

    def query(
        self,
        run: str | Iterable[str] | None = None,
        metric: str | Iterable[str] | None = None,
        steps: tuple[int | None, int | None] | None = None,
        times: tuple[float | None, float | None] | None = None,
        latest: bool = False,
    ) -> pl.DataFrame:
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
        # Bound: each attempt breaks or raises (only the first may continue), which the checker cannot follow.
        frame = frame.sort(["run", "metric", "step", "time", "value", "phase"], nulls_last=False)  # pyright: ignore[reportPossiblyUnboundVariable]
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
                damaged[info.path] = damage_reason(err)
                continue
            if info.sha256 not in (None, checked.sha256):
                damaged[info.path] = "size or sha256 differs from the index"
        if damaged:
            raise DamagedSegmentError(self.url, damaged)


def _one_of(column: str, names: frozenset[str]) -> pl.Expr:
    """``==`` for one name: polars prunes row groups with it more cheaply than with is_in."""
    return pl.col(column) == next(iter(names)) if len(names) == 1 else pl.col(column).is_in(sorted(names))


def _is_missing_file(err: Exception) -> bool:
    return isinstance(err, FileNotFoundError) or "No such file" in str(err) or "not found" in str(err).lower()
