"""One telemetry segment: an immutable Parquet file of (run, metric, step, value, time, phase) rows.

A segment carries its own summary (run, metric set, step and time ranges, row count, and the
segments it replaces) in the Parquet footer, so the store's index can always be rebuilt from
the segments alone: the index is a cache that lets queries skip files, never the truth.

A segment written by the metrics.jsonl ingester also names its ``sources``: the byte ranges
``(start, end, sha256 of those bytes)`` of the file whose rows it holds. That is how a second
ingest of the same (or a grown) file knows which rows the run already has (ingest.py), and it
survives compaction (a merged segment carries the union) and ``repair`` (it is in the footer).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, replace

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from marin_assets.store.names import validate_segment

FOOTER_KEY = b"marin.telemetry"
FORMAT = 1
# Rows are sorted by (metric, step) and split into row groups this size, so a step-range
# query reads only the row groups whose step statistics overlap the range.
ROW_GROUP_ROWS = 65_536
METRIC_NAME_MAX = 256


def validate_metric_name(name: str) -> str:
    """Return ``name`` if it is a valid metric name, else raise ValueError naming it.

    A metric name is never a path, but it is held to the same characters: one or more
    ``/``-separated parts (``moe/layer0/load_cv``, as wandb groups them), each a valid name
    segment (``store.names.validate_segment``), ``METRIC_NAME_MAX`` characters at most."""
    if not isinstance(name, str):
        raise ValueError(f"metric name must be a string, got {type(name).__name__}: {name!r}")
    if len(name) > METRIC_NAME_MAX:
        raise ValueError(f"invalid metric name {name[:40]!r}...: longer than {METRIC_NAME_MAX} characters")
    try:
        for part in name.split("/"):
            validate_segment(part, "metric name part")
    except ValueError as err:
        raise ValueError(f"invalid metric name {name!r}: {err}") from None
    return name


SCHEMA = pa.schema(
    [
        ("run", pa.string()),
        ("metric", pa.string()),
        ("step", pa.int64()),
        ("value", pa.float64()),  # null where the logged value was NaN or +-inf
        ("time", pa.float64()),  # unix seconds when the value was logged; null if unknown
        ("phase", pa.string()),
    ]
)
POLARS_SCHEMA = {
    "run": pl.String,
    "metric": pl.String,
    "step": pl.Int64,
    "value": pl.Float64,
    "time": pl.Float64,
    "phase": pl.String,
}
SORT_KEYS = [("metric", "ascending"), ("step", "ascending"), ("time", "ascending")]
INT64_MAX = 2**63 - 1
SourceRange = tuple[int, int, str]  # (start, end, sha256 hex of bytes[start:end]) of an ingested file
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# What reading a damaged (truncated, corrupt, foreign) segment raises: OSError and ValueError
# cover pyarrow's ArrowIOError/ArrowInvalid and bad footer JSON; polars raises ComputeError.
READ_ERRORS = (OSError, ValueError, KeyError, TypeError, pl.exceptions.ComputeError)


def _optional_finite(value, what: str) -> float | None:
    if value is None:
        return None
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{what} must be finite, got {value}")
    return value


@dataclass(frozen=True)
class SegmentInfo:
    """What the index knows about one segment (path is relative to the store root)."""

    path: str
    run: str
    metrics: tuple[str, ...]
    step_min: int
    step_max: int
    time_min: float | None
    time_max: float | None
    rows: int
    replaces: tuple[str, ...] = ()
    bytes: int | None = None
    sha256: str | None = None
    created: float = 0.0
    sources: tuple[SourceRange, ...] = ()  # ingested byte ranges whose rows this segment holds

    def __post_init__(self) -> None:
        validate_segment(self.run, "run")
        for metric in self.metrics:
            validate_metric_name(metric)
        if not self.path.startswith("segments/") or ".." in self.path or not self.path.endswith(".parquet"):
            raise ValueError(f"segment path {self.path!r} must be segments/.../*.parquet without '..'")
        if self.rows <= 0:
            raise ValueError(f"segment {self.path}: rows must be positive, got {self.rows}")
        if not 0 <= self.step_min <= self.step_max:
            raise ValueError(f"segment {self.path}: step range {self.step_min}..{self.step_max} is invalid")
        tmin = _optional_finite(self.time_min, f"segment {self.path} time_min")
        tmax = _optional_finite(self.time_max, f"segment {self.path} time_max")
        if (tmin is None) != (tmax is None) or (tmin is not None and tmax is not None and tmin > tmax):
            raise ValueError(f"segment {self.path}: time range {tmin}..{tmax} is invalid")
        for start, end, digest in self.sources:
            if not (0 <= start < end and _SHA256_HEX.fullmatch(digest)):
                raise ValueError(f"segment {self.path}: source range {(start, end, digest)!r} is invalid")

    def to_json(self) -> dict:
        out = asdict(self)
        out["metrics"] = list(self.metrics)
        out["replaces"] = list(self.replaces)
        out["sources"] = [list(r) for r in self.sources]
        return out

    @classmethod
    def from_json(cls, obj: dict) -> SegmentInfo:
        return cls(
            path=obj["path"],
            run=obj["run"],
            metrics=tuple(obj["metrics"]),
            step_min=int(obj["step_min"]),
            step_max=int(obj["step_max"]),
            time_min=obj.get("time_min"),
            time_max=obj.get("time_max"),
            rows=int(obj["rows"]),
            replaces=tuple(obj.get("replaces", ())),
            bytes=obj.get("bytes"),
            sha256=obj.get("sha256"),
            created=float(obj.get("created", 0.0)),
            sources=tuple((int(a), int(b), str(h)) for a, b, h in obj.get("sources", ())),
        )

    def overlaps(
        self,
        runs: frozenset[str] | None,
        metrics: frozenset[str] | None,
        steps: tuple[int | None, int | None],
        times: tuple[float | None, float | None],
    ) -> bool:
        """Could this segment hold a row the query wants? (False means: skip the file.)"""
        if runs is not None and self.run not in runs:
            return False
        if metrics is not None and metrics.isdisjoint(self.metrics):
            return False
        lo, hi = steps
        if (lo is not None and self.step_max < lo) or (hi is not None and self.step_min > hi):
            return False
        tlo, thi = times
        if tlo is not None or thi is not None:
            if self.time_min is None or self.time_max is None:  # both or neither (__post_init__)
                return False  # no row of this segment has a time, so none can match a time range
            if (tlo is not None and self.time_max < tlo) or (thi is not None and self.time_min > thi):
                return False
        return True


def normalise(table: pa.Table) -> pa.Table:
    """Cast to SCHEMA, refuse nulls where a row needs a value, sort by (metric, step, time)."""
    missing = [name for name in SCHEMA.names if name not in table.column_names]
    if missing:
        raise ValueError(f"telemetry rows lack columns {missing}")
    table = table.select(SCHEMA.names).cast(SCHEMA)
    for name in ("run", "metric", "step"):
        if table.column(name).null_count:
            raise ValueError(f"telemetry column {name!r} has {table.column(name).null_count} null(s)")
    return table.sort_by(SORT_KEYS)


def summarise(
    table: pa.Table, path: str, replaces: tuple[str, ...] = (), created: float = 0.0, sources: tuple[SourceRange, ...] = ()
) -> SegmentInfo:
    """The footer/index summary of a normalised, non-empty table that holds one run."""
    runs = table.column("run").unique().to_pylist()
    if len(runs) != 1:
        raise ValueError(f"a segment holds exactly one run, got {sorted(map(str, runs))}")
    steps = pc.min_max(table.column("step")).as_py()
    times = pc.min_max(table.column("time")).as_py()
    metrics = tuple(sorted(table.column("metric").unique().to_pylist()))
    return SegmentInfo(
        path=path,
        run=runs[0],
        metrics=metrics,
        step_min=steps["min"],
        step_max=steps["max"],
        time_min=times["min"],
        time_max=times["max"],
        rows=table.num_rows,
        replaces=tuple(replaces),
        created=created,
        sources=tuple(sorted(set(sources))),
    )


def encode(table: pa.Table, info: SegmentInfo) -> tuple[bytes, SegmentInfo]:
    """Parquet bytes of a segment (summary in the footer) and the summary with size and checksum."""
    footer = json.dumps({"format": FORMAT, **info.to_json()}, sort_keys=True).encode()
    table = table.replace_schema_metadata({FOOTER_KEY: footer})
    sink = pa.BufferOutputStream()
    # pyarrow's write_table is unannotated: use_dictionary is inferred bool from its default, yet takes column names
    pq.write_table(
        table,
        sink,
        compression="zstd",
        row_group_size=ROW_GROUP_ROWS,
        use_dictionary=["run", "metric", "phase"],  # pyright: ignore[reportArgumentType]
        write_statistics=True,
    )
    data = sink.getvalue().to_pybytes()
    sized = replace(info, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    return data, sized


def read_footer(handle, path: str) -> SegmentInfo:
    """The summary a segment's footer carries (reads the footer only, not the rows)."""
    metadata = pq.ParquetFile(handle).schema_arrow.metadata or {}
    if FOOTER_KEY not in metadata:
        raise ValueError(f"{path}: not a telemetry segment (no {FOOTER_KEY.decode()} footer)")
    obj = json.loads(metadata[FOOTER_KEY])
    info = SegmentInfo.from_json({**obj, "bytes": None, "sha256": None})
    if info.path != path:
        raise ValueError(f"{path}: footer names another path {info.path!r} (a copied segment?)")
    return info


def empty_frame() -> pl.LazyFrame:
    return pl.DataFrame(schema=POLARS_SCHEMA).lazy()


def finite_or_null(values: np.ndarray) -> pa.Array:
    """float64 array where NaN and +-inf become null (see TelemetryWriter for why)."""
    values = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(values)
    return pa.array(values, type=pa.float64(), mask=None if finite.all() else ~finite)
