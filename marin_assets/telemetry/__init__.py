"""Telemetry: training/eval/sweep metrics in immutable Parquet segments with a small index.

with TelemetryWriter(root, run) as w:      # per step
    w.log(step, {"loss": 2.3, "lr": 1e-3}, phase="warmup")
TelemetryStore(root).query(run=run, metric="loss", steps=(100, 200))   # polars DataFrame
TelemetryStore(root).scan(...)                                          # lazy
TelemetryStore(root).compact()                                          # merge small segments
import_metrics_jsonl(root, run, "metrics.jsonl")                        # an existing run
"""

from marin_assets.settings import artifact_prefix
from marin_assets.store.fsutil import join
from marin_assets.telemetry.ingest import IngestReport, import_metrics_jsonl
from marin_assets.telemetry.segments import SCHEMA, SegmentInfo
from marin_assets.telemetry.store import CompactionReport, DamagedSegmentError, RepairReport, TelemetryStore
from marin_assets.telemetry.writer import NO_TIME, TelemetryWriter


def default_root() -> str:
    """Where metrics go when no root is given: ``$MARIN_PREFIX/telemetry`` (./artifacts/telemetry)."""
    return join(artifact_prefix(), "telemetry")


__all__ = [
    "CompactionReport",
    "DamagedSegmentError",
    "IngestReport",
    "NO_TIME",
    "RepairReport",
    "SCHEMA",
    "SegmentInfo",
    "TelemetryStore",
    "TelemetryWriter",
    "default_root",
    "import_metrics_jsonl",
]
