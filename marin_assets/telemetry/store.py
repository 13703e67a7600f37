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

TelemetryStore is one class made of four parts, each a module: the files (store_files.py:
writing a segment, the index, the listing), queries.py, compaction.py and repair.py. The
names other code imports from here are re-exported.
"""

from __future__ import annotations

from marin_assets.store.lease import Lease  # tests/telemetry/test_store.py takes it from here
from marin_assets.telemetry.compaction import CompactionConfig, CompactionReport, StoreCompaction
from marin_assets.telemetry.queries import StoreQueries
from marin_assets.telemetry.repair import RepairReport, StoreRepair
from marin_assets.telemetry.store_files import DamagedSegmentError

__all__ = [
    "CompactionConfig",
    "CompactionReport",
    "DamagedSegmentError",
    "Lease",
    "RepairReport",
    "TelemetryStore",
]


class TelemetryStore(StoreQueries, StoreCompaction, StoreRepair):
    """Append-only metric rows in immutable Parquet segments; lazy, pruned polars queries."""
