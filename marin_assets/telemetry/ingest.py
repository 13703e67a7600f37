"""Load a training ``metrics.jsonl`` (marin_assets/train/metrics.py) into the telemetry store.

Each line is one step: ``{"step": 12, "loss": 2.31, "lr": 0.001, "skipped": false,
"phase": "warmup", "counts": {"spikes": 0}, ...}``. It becomes one row per metric:
numbers (bools as 0/1) keep their key, nested objects are flattened with dots
(``counts.spikes``), the strings the logger writes for non-finite floats ("nan", "inf",
"-inf") become null values, ``phase`` fills the phase column and ``time`` (if present) the
time column. Nothing is dropped silently: lines that are not JSON objects or lack a valid
step are quarantined with their line number and reason, and fields that are not metrics
(other strings, lists, invalid names) are counted per field.
"""

from __future__ import annotations

import functools
import json
import math
import numbers
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from marin_assets.store.names import validate_segment
from marin_assets.telemetry.store import TelemetryStore
from marin_assets.telemetry.writer import NO_TIME, TelemetryWriter

NONFINITE_STRINGS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "infinity": math.inf,
                     "-infinity": -math.inf}
RESERVED = {"step", "phase", "time"}
MAX_QUARANTINE_KEPT = 100  # the first reasons are kept verbatim; the count is always exact


@dataclass
class IngestReport:
    path: str
    run: str
    lines: int = 0  # non-blank lines read
    steps: int = 0  # lines that became at least one row
    values: int = 0  # rows written (one per metric per step)
    nonfinite: int = 0  # of those, stored as null
    empty: int = 0  # lines with a valid step and no metric at all
    quarantined: int = 0
    quarantine: list[str] = field(default_factory=list)  # "line N: reason", first 100
    ignored_fields: dict[str, int] = field(default_factory=dict)  # "field (reason)" -> count
    segments: int = 0

    def to_json(self) -> dict:
        return dict(self.__dict__)


def import_metrics_jsonl(root: str | TelemetryStore, run: str, path: str | Path, *, append: bool = False,
                         flush_rows: int = 500_000) -> IngestReport:
    """Append every step of ``path`` to ``run``. Refuses a run that already has rows unless
    ``append`` (importing the same file twice would count every step twice)."""
    store = root if isinstance(root, TelemetryStore) else TelemetryStore(root)
    validate_segment(run, "run")
    if not append:
        existing = sum(s.rows for s in store.segments() if s.run == run)
        if existing:
            raise ValueError(f"run {run!r} already has {existing} rows in {store.url}; pass append=True "
                             "(--append) to add more (the same file twice would count every step twice)")
    report = IngestReport(path=str(path), run=run)
    ignored: Counter[str] = Counter()
    with open(path, encoding="utf-8", newline="\n") as f, TelemetryWriter(store, run, flush_rows=flush_rows,
                                                            flush_seconds=1e9) as writer:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            report.lines += 1
            parsed = _parse_line(line, ignored)
            if isinstance(parsed, str):
                report.quarantined += 1
                if len(report.quarantine) < MAX_QUARANTINE_KEPT:
                    report.quarantine.append(f"line {number}: {parsed}")
                continue
            step, metrics, time, phase = parsed
            if not metrics:
                report.empty += 1
                continue
            writer.log(step, metrics, time=time, phase=phase)
            report.steps += 1
            report.values += len(metrics)
            report.nonfinite += sum(1 for v in metrics.values() if not math.isfinite(v))
    report.segments = len(writer.segments)
    report.ignored_fields = dict(sorted(ignored.items()))
    return report


def _parse_line(line: str, ignored: Counter) -> tuple | str:
    """(step, metrics, time, phase), or the reason the line is quarantined."""
    try:
        row = json.loads(line)
    except ValueError as err:
        return f"not JSON ({err.msg})"
    if not isinstance(row, dict):
        return f"not a JSON object ({type(row).__name__})"
    step = row.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return f"step must be a non-negative integer, got {step!r}"
    phase = row.get("phase")
    if phase is not None and not isinstance(phase, str):
        ignored["phase (not a string)"] += 1
        phase = None
    time = row.get("time", NO_TIME)
    if time is not NO_TIME and (isinstance(time, bool) or not isinstance(time, numbers.Real)
                                or not math.isfinite(time)):
        ignored["time (not a finite number)"] += 1
        time = NO_TIME
    metrics: dict[str, float] = {}
    _flatten(row, "", metrics, ignored)
    return step, metrics, time, phase


def _flatten(obj: dict, prefix: str, out: dict[str, float], ignored: Counter) -> None:
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if not prefix and key in RESERVED:
            continue
        if isinstance(value, dict):
            _flatten(value, f"{name}.", out, ignored)
            continue
        number = _as_number(value)
        if number is None:
            ignored[f"{name} (not a number)"] += 1
            continue
        if not _valid_name(name):
            ignored[f"{name} (invalid metric name)"] += 1
            continue
        out[name] = number


@functools.lru_cache(maxsize=4096)
def _valid_name(name: str) -> bool:
    try:
        validate_segment(name, "metric name")
    except ValueError:
        return False
    return True


def _as_number(value) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, str):
        return NONFINITE_STRINGS.get(value.strip().lower())
    return None
