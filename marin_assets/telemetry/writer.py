"""The per-step writer: ``TelemetryWriter(root, run).log(step, {"loss": 2.3})``.

Rows are buffered in memory and flushed as one immutable segment when ``flush_rows`` metric
values are buffered, when ``flush_seconds`` have passed since the last flush (checked at the
next ``log``), on ``flush()``, and on ``close()`` / leaving the ``with`` block. A killed
process therefore loses at most what it logged since its last flush.

Non-finite values (NaN, +-inf) are stored as null, not rejected: a diverging run is exactly
when its telemetry matters, so the row (run, metric, step, time) is kept and says "this step
had no finite value", while means and minima over the column are not poisoned by NaN.
Steps are refused at ``log`` when negative or beyond int64 (the step column's type), so one
bad step can never make every later flush of the buffer fail.
"""

from __future__ import annotations

import itertools
import math
import numbers
import time as _time
from collections import defaultdict
from collections.abc import Mapping

import numpy as np
import pyarrow as pa

from marin_assets.store.names import validate_segment
from marin_assets.telemetry.segments import INT64_MAX, SCHEMA, SegmentInfo, SourceRange, finite_or_null, validate_metric_name
from marin_assets.telemetry.store import TelemetryStore

_PLAIN_NUMBERS = (float, int)
NO_TIME = object()  # pass as time= when the moment is unknown (an imported file): stored as null


class TelemetryWriter:
    """Buffered appends of one run's metrics; ``segments`` lists what each flush wrote."""

    def __init__(self, root: str | TelemetryStore, run: str, *, flush_rows: int = 100_000, flush_seconds: float = 60.0):
        self.store = root if isinstance(root, TelemetryStore) else TelemetryStore(root)
        self.run = validate_segment(run, "run")
        if isinstance(flush_rows, bool) or not isinstance(flush_rows, int) or flush_rows < 1:
            raise ValueError(f"flush_rows must be a positive integer, got {flush_rows!r}")
        if not (isinstance(flush_seconds, (int, float)) and math.isfinite(flush_seconds) and flush_seconds > 0):
            raise ValueError(f"flush_seconds must be a finite number > 0, got {flush_seconds!r}")
        self.flush_rows = flush_rows
        self.flush_seconds = float(flush_seconds)
        self.segments: list[SegmentInfo] = []
        self.nonfinite = 0  # values stored as null
        self._known_names: set[str] = set()
        self._reset()

    def _reset(self) -> None:
        self._steps: list[int] = []
        self._times: list[float | None] = []
        self._phases: list[str | None] = []
        self._metrics: list[dict] = []
        self._buffered = 0
        self._last_flush = _time.monotonic()

    # ---- the call the trainer makes each step -------------------------------------------
    def log(self, step: int, metrics: Mapping[str, float], *, time: float | None = None, phase: str | None = None) -> None:
        """Buffer one step's metrics. ``time`` defaults to now (unix seconds)."""
        # Plain int/float/str take the fast paths (this runs once per training step); the
        # rest goes through the full checks, which name the run, step and field they refuse.
        if type(step) is not int or not 0 <= step <= INT64_MAX:
            step = self._checked_step(step)
        if time is None:
            time = _time.time()
        elif type(time) is not float or not math.isfinite(time):
            time = self._checked_time(step, time)
        if phase is not None and type(phase) is not str:
            raise ValueError(f"run {self.run} step {step}: phase must be a string, got {phase!r}")
        known = self._known_names
        for name, value in metrics.items():
            if name not in known:
                validate_metric_name(name)
                known.add(name)
            if type(value) not in _PLAIN_NUMBERS:
                _check_number(self.run, step, name, value)
        if not metrics:
            return
        self._steps.append(step)
        self._times.append(time)
        self._phases.append(phase)
        self._metrics.append(dict(metrics))
        self._buffered += len(metrics)
        if self._buffered >= self.flush_rows or _time.monotonic() - self._last_flush >= self.flush_seconds:
            self.flush()

    def _checked_step(self, step) -> int:
        if isinstance(step, bool) or not isinstance(step, numbers.Integral) or not 0 <= int(step) <= INT64_MAX:
            raise ValueError(f"run {self.run}: step must be a non-negative integer below 2**63, got {step!r}")
        return int(step)

    def _checked_time(self, step: int, time) -> float:
        if time is NO_TIME:
            return math.nan
        if isinstance(time, bool) or not isinstance(time, numbers.Real) or not math.isfinite(time):
            raise ValueError(f"run {self.run} step {step}: time must be a finite number, got {time!r}")
        return float(time)

    @property
    def buffered(self) -> int:
        """Metric values logged and not yet flushed."""
        return self._buffered

    def flush(self, sources: tuple[SourceRange, ...] = ()) -> SegmentInfo | None:
        """Write what is buffered as one segment (None when nothing is buffered); ``sources``:
        the ingested byte ranges the buffered rows came from (segments.py)."""
        if not self._buffered:
            self._last_flush = _time.monotonic()
            return None
        table = self._table()
        info = self.store.append(table, sources=sources)
        self.nonfinite += table.column("value").null_count
        self._reset()  # only once written: a failed write keeps the rows for the next try
        self.segments.append(info)
        return info

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> TelemetryWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()  # also on an exception: what was logged before it is worth keeping

    # ---- buffer -> columns ----------------------------------------------------------------
    def _table(self) -> pa.Table:
        """Long format, vectorised per group of steps that logged the same metric names;
        metric and phase go through integer codes so no per-value Python strings are made."""
        groups: dict[tuple[str, ...], list[int]] = defaultdict(list)
        for i, m in enumerate(self._metrics):
            groups[tuple(m)].append(i)
        names = sorted({name for key in groups for name in key})
        name_code = {name: code for code, name in enumerate(names)}
        phases = sorted({p for p in self._phases if p is not None})
        phase_code = {None: -1, **{p: code for code, p in enumerate(phases)}}
        steps = np.asarray(self._steps, dtype=np.int64)
        times = np.asarray(self._times, dtype=np.float64)
        row_phase = np.fromiter((phase_code[p] for p in self._phases), dtype=np.int32, count=len(self._phases))
        cols: dict[str, list] = {"metric": [], "step": [], "value": [], "time": [], "phase": []}
        for key, rows in groups.items():
            rows_arr = np.asarray(rows)
            k, n = len(key), len(rows)
            flat = itertools.chain.from_iterable(self._metrics[i].values() for i in rows)
            cols["value"].append(np.fromiter(flat, dtype=np.float64, count=n * k).reshape(n, k).T.ravel())
            cols["metric"].append(np.repeat(np.asarray([name_code[name] for name in key], dtype=np.int32), n))
            cols["step"].append(np.tile(steps[rows_arr], k))
            cols["time"].append(np.tile(times[rows_arr], k))
            cols["phase"].append(np.tile(row_phase[rows_arr], k))
        total = sum(len(v) for v in cols["value"])
        phase_idx = np.concatenate(cols["phase"])
        return pa.table(
            {
                "run": _decoded(np.zeros(total, dtype=np.int32), [self.run]),
                "metric": _decoded(np.concatenate(cols["metric"]), names),
                "step": pa.array(np.concatenate(cols["step"]), type=pa.int64()),
                "value": finite_or_null(np.concatenate(cols["value"])),
                "time": finite_or_null(np.concatenate(cols["time"])),
                "phase": _decoded(np.maximum(phase_idx, 0), phases or [""], null=phase_idx < 0),
            },
            schema=SCHEMA,
        )


def _decoded(codes: np.ndarray, dictionary: list[str], null: np.ndarray | None = None) -> pa.Array:
    """A plain string column from integer codes into ``dictionary`` (null where ``null``)."""
    indices = pa.array(codes, type=pa.int32(), mask=null if null is not None and null.any() else None)
    return pa.DictionaryArray.from_arrays(indices, pa.array(dictionary, type=pa.string())).cast(pa.string())


def _check_number(run: str, step, name: str, value) -> None:
    """Accept bools (as 0/1) and numpy/other real numbers; refuse anything else by name."""
    if isinstance(value, (bool, np.bool_)) or isinstance(value, numbers.Real):
        return
    raise ValueError(f"run {run} step {step} metric {name!r}: value must be a real number, got {type(value).__name__} {value!r}")
