"""Load a training ``metrics.jsonl`` (marin_assets/train/metrics.py) into the telemetry store.

Each line is one step: ``{"step": 12, "loss": 2.31, "lr": 0.001, "skipped": false,
"phase": "warmup", "counts": {"spikes": 0}, ...}``. It becomes one row per metric:
numbers (bools as 0/1) keep their key, nested objects are flattened with dots
(``counts.spikes``), the strings the logger writes for non-finite floats ("nan", "inf",
"-inf") become null values, as do numbers beyond float64, ``phase`` fills the phase column
and ``time`` (if present) the time column. Nothing is dropped silently: lines that are not
UTF-8 JSON objects or lack a valid step (an integer in 0..2**63-1, the int64 step column) are
quarantined with their line number and reason, and fields that are not metrics (other strings,
lists, invalid names) are counted per field.

Ingesting is idempotent. Every segment it writes names the byte ranges of the file its rows
came from, with their sha256 (segments.py). Holding the run's ingest lease, an ingest first
finds which of the run's recorded ranges this file still holds byte for byte and reads only
the rest: the same file again adds nothing, a grown file adds its new lines, two ingests at
once add it once, and a rerun after a failed one adds what that one did not write. A run
that has rows, none of them from this file, is refused unless ``append``. An unterminated
last line that is not JSON yet (a write in progress) is reported as deferred, not consumed,
so the next ingest reads it whole. Lines that give no row are recorded with the segment
flushed after them; when none is (bad lines after an ingest's last row), a later ingest reads
and reports them again (they still add nothing). Segments written before sources were
recorded name none, so a file ingested then is not recognised.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import numbers
import os
import stat
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from marin_assets.store.names import validate_segment
from marin_assets.telemetry.segments import INT64_MAX, SourceRange, validate_metric_name
from marin_assets.telemetry.store import TelemetryStore
from marin_assets.telemetry.writer import NO_TIME, TelemetryWriter

NONFINITE_STRINGS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "infinity": math.inf, "-infinity": -math.inf}
RESERVED = {"step", "phase", "time"}
MAX_QUARANTINE_KEPT = 100  # the first reasons are kept verbatim; the count is always exact
_NO_AUTO_FLUSH = 2**62  # the ingester flushes itself, at line ends, so each segment knows its byte ranges
# A metrics line is a few KB; a longer one means the file is not a metrics.jsonl, and reading
# on to its newline would hold all of it (a 10 GB file without one, say).
MAX_LINE_BYTES = 16 * 1024 * 1024


@dataclass
class IngestReport:
    path: str
    run: str
    lines: int = 0  # non-blank lines read (lines the run already holds are not read again)
    steps: int = 0  # lines that became at least one row
    values: int = 0  # rows written (one per metric per step)
    nonfinite: int = 0  # of those, stored as null
    empty: int = 0  # lines with a valid step and no metric at all
    quarantined: int = 0
    quarantine: list[str] = field(default_factory=list)  # "line N: reason", first 100
    ignored_fields: dict[str, int] = field(default_factory=dict)  # "field (reason)" -> count
    segments: int = 0
    already_ingested_bytes: int = 0  # bytes of the file whose rows the run held before (skipped)
    deferred: list[str] = field(default_factory=list)  # "line N: reason": a torn last line, left for later

    def to_json(self) -> dict:
        return dict(self.__dict__)


def import_metrics_jsonl(
    root: str | TelemetryStore,
    run: str,
    path: str | Path,
    *,
    append: bool = False,
    flush_rows: int = 500_000,
    lock_timeout_s: float = 600.0,
) -> IngestReport:
    """Add the rows of ``path`` that ``run`` does not hold yet (see the module docstring).
    Refuses a run that already has rows, none from this file, unless ``append``."""
    store = root if isinstance(root, TelemetryStore) else TelemetryStore(root)
    validate_segment(run, "run")
    if isinstance(flush_rows, bool) or not isinstance(flush_rows, int) or flush_rows < 1:
        raise ValueError(f"flush_rows must be a positive integer, got {flush_rows!r}")
    report = IngestReport(path=str(path), run=run)
    with _open_regular(path) as f, store.ingest_lease(run, lock_timeout_s) as lease:
        held = [s for s in store.segments() if s.run == run]
        covered = _covered_ranges(f, [r for s in held for r in s.sources])
        if held and not covered and not append:
            raise ValueError(
                f"run {run!r} already has {sum(s.rows for s in held)} rows in {store.url}, none from "
                f"{path}; pass append=True (--append) to add this file's rows as well"
            )
        report.already_ingested_bytes = sum(end - start for start, end in covered)
        writer = TelemetryWriter(store, run, flush_rows=_NO_AUTO_FLUSH, flush_seconds=1e9)
        _read_new_lines(f, covered, writer, report, flush_rows, lease.check)
    return report


def _open_regular(path: str | Path) -> BinaryIO:
    """``path`` opened for reading; ValueError unless it is a regular file. A device never ends
    (/dev/zero) and a FIFO blocks until a writer comes, so the check is on the opened descriptor
    (O_NONBLOCK: opening a FIFO does not wait), not on a name that could change in between."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError(f"{path}: not a regular file (a device, FIFO, socket or directory); give a metrics.jsonl file")
    return os.fdopen(fd, "rb")


def _read_new_lines(
    f: BinaryIO,
    covered: list[tuple[int, int]],
    writer: TelemetryWriter,
    report: IngestReport,
    flush_rows: int,
    check_lease: Callable[[], None],
) -> None:
    """Ingest every line outside ``covered``; each flush names the byte ranges it consumed. On an
    error the buffered rows are dropped with their ranges, so a rerun reads those lines again."""
    ignored: Counter[str] = Counter()
    consumed = _ConsumedRanges()
    f.seek(0)
    offset, k = 0, 0
    for number, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), start=1):
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            raise ValueError(
                f"{report.path}: line {number} runs past {MAX_LINE_BYTES} bytes without a newline; "
                "not a metrics.jsonl (its lines are a few KB)"
            )
        start, offset = offset, offset + len(raw)
        while k < len(covered) and covered[k][1] <= start:
            k += 1
        if k < len(covered) and covered[k][0] <= start:
            consumed.close()
            if offset <= covered[k][1]:
                continue  # the run holds this line's rows already
            start, raw = covered[k][1], raw[covered[k][1] - start :]  # only the line's head was ingested
        if not raw.endswith(b"\n") and _deferred_tail(raw, number, report):
            break  # not consumed: the next ingest reads the whole line once it is written
        consumed.add(start, raw)
        _ingest_line(raw, number, writer, report, ignored)
        if writer.buffered >= flush_rows:
            check_lease()
            writer.flush(consumed.take())
    if writer.buffered:
        check_lease()
        writer.flush(consumed.take())
    report.segments = len(writer.segments)
    report.ignored_fields = dict(sorted(ignored.items()))


def _deferred_tail(raw: bytes, number: int, report: IngestReport) -> bool:
    """Leave this unterminated last line for a later ingest? Yes when blank or not JSON yet (a
    write in progress, most likely; reported as deferred). A complete JSON line is read now."""
    if not raw.strip():
        return True
    try:
        json.loads(raw.decode("utf-8"))
    except ValueError as err:  # UnicodeDecodeError is one too: a multi-byte character cut short
        report.lines += 1
        report.deferred.append(f"line {number}: unterminated last line, not JSON yet ({err}); left for a later ingest")
        return True
    return False


def _ingest_line(raw: bytes, number: int, writer: TelemetryWriter, report: IngestReport, ignored: Counter) -> None:
    if not raw.strip():
        return
    report.lines += 1
    parsed = _parse_line(raw, ignored)
    if isinstance(parsed, str):
        report.quarantined += 1
        if len(report.quarantine) < MAX_QUARANTINE_KEPT:
            report.quarantine.append(f"line {number}: {parsed}")
        return
    step, metrics, time, phase = parsed
    if not metrics:
        report.empty += 1
        return
    writer.log(step, metrics, time=time, phase=phase)
    report.steps += 1
    report.values += len(metrics)
    report.nonfinite += sum(1 for v in metrics.values() if not math.isfinite(v))


class _ConsumedRanges:
    """The byte ranges read since the last flush, each with the sha256 of its bytes."""

    def __init__(self) -> None:
        self._done: list[SourceRange] = []
        self._start: int | None = None
        self._end = 0
        self._hash = hashlib.sha256()

    def add(self, start: int, raw: bytes) -> None:
        if self._start is not None and start != self._end:
            self.close()
        if self._start is None:
            self._start, self._end, self._hash = start, start, hashlib.sha256()
        self._hash.update(raw)
        self._end = start + len(raw)

    def close(self) -> None:
        if self._start is not None:
            self._done.append((self._start, self._end, self._hash.hexdigest()))
            self._start = None

    def take(self) -> tuple[SourceRange, ...]:
        self.close()
        done, self._done = tuple(self._done), []
        return done


def _covered_ranges(f: BinaryIO, recorded: Iterable[SourceRange]) -> list[tuple[int, int]]:
    """The recorded ranges that this file holds byte for byte at the same offsets, each starting
    a line or continuing a held range (the rest of a line whose head an earlier ingest read,
    when it was a complete JSON line still missing its newline), merged into disjoint (start,
    end) pairs in order."""
    size = os.fstat(f.fileno()).st_size
    held: list[tuple[int, int]] = []
    for start, end, digest in sorted(set(recorded)):
        continues = any(held_end == start for _, held_end in held)
        if end <= size and (continues or _starts_line(f, start)) and _sha256(f, start, end) == digest:
            held.append((start, end))
    merged: list[tuple[int, int]] = []
    for start, end in held:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _starts_line(f: BinaryIO, offset: int) -> bool:
    if offset == 0:
        return True
    f.seek(offset - 1)
    return f.read(1) == b"\n"


def _sha256(f: BinaryIO, start: int, end: int) -> str:
    f.seek(start)
    digest, left = hashlib.sha256(), end - start
    while left > 0:
        chunk = f.read(min(left, 1 << 20))
        if not chunk:
            break
        digest.update(chunk)
        left -= len(chunk)
    return digest.hexdigest()


def _parse_line(raw: bytes, ignored: Counter) -> tuple | str:
    """(step, metrics, time, phase), or the reason the line is quarantined."""
    try:
        row = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        return f"not UTF-8 ({err.reason} at byte {err.start})"
    except ValueError as err:
        return f"not JSON ({getattr(err, 'msg', err)})"
    if not isinstance(row, dict):
        return f"not a JSON object ({type(row).__name__})"
    step = row.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return f"step must be a non-negative integer, got {step!r}"
    if step > INT64_MAX:
        digits = str(step)
        shown = digits if len(digits) <= 30 else f"{digits[:12]}... ({len(digits)} digits)"
        return f"step {shown} is beyond int64 (the largest step is 2**63-1)"
    phase = row.get("phase")
    if phase is not None and not isinstance(phase, str):
        ignored["phase (not a string)"] += 1
        phase = None
    time = row.get("time", NO_TIME)
    if time is not NO_TIME and (
        isinstance(time, bool) or not isinstance(time, numbers.Real) or not math.isfinite(_as_float(time))
    ):
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
        validate_metric_name(name)
    except ValueError:
        return False
    return True


def _as_number(value) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Real):
        return _as_float(value)
    if isinstance(value, str):
        return NONFINITE_STRINGS.get(value.strip().lower())
    return None


def _as_float(value: numbers.Real) -> float:
    """float(value), with integers beyond float64 as +-inf (the same as a JSON 1e400)."""
    try:
        return float(value)
    except OverflowError:
        return -math.inf if value <= 0 else math.inf  # typeshed's numbers.Real has __le__ but no __gt__
