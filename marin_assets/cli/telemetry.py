"""`marin telemetry ...`: the telemetry store (marin_assets/telemetry) from the shell.

query    rows of one or more runs/metrics in a step range, as CSV (default) or JSON
ingest   load a training metrics.jsonl into a run: only the rows the run does not hold yet, so
         the same file twice (or two ingests at once) adds it once and a grown file its new lines
compact  merge small segments (answers do not change)
repair   rebuild the index from the segment files; move damaged ones to _quarantine/, naming them
         and the rows lost

The default root is $MARIN_PREFIX/telemetry (./artifacts/telemetry without it). Exit codes:
0 done (also: an ingest that found every row already in the run), 1 nothing matched / the file
had no metric values, 2 bad input (or a busy lease), 3 the store has a damaged segment (the
message names it; run `marin telemetry repair`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from marin_assets.knobs import add_flags, from_flags
from marin_assets.store.fsutil import check_bucket

_RANGE = re.compile(r"([0-9]*):([0-9]*)")
_STEP = re.compile(r"[0-9]+")


def parse_steps(text: str) -> tuple[int | None, int | None]:
    """``100:200`` (inclusive), ``100:``, ``:200``, or ``150`` (one step)."""
    text = text.strip()
    if _STEP.fullmatch(text):
        return (int(text), int(text))
    match = _RANGE.fullmatch(text)
    if not match:
        raise ValueError(f"--steps {text!r}: use START:END with non-negative integers (either may be empty)")
    lo, hi = (int(g) if g else None for g in match.groups())
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"--steps {text!r}: start {lo} is after end {hi}")
    return (lo, hi)


def register(subparsers) -> None:
    from marin_assets.telemetry.compaction import CompactionConfig  # deferred (import cost): polars, pyarrow

    parser = subparsers.add_parser("telemetry", help="Query, ingest and compact the telemetry store.")
    sub = parser.add_subparsers(dest="telemetry_command", metavar="SUBCOMMAND")
    root_help = "store root, a path or fsspec URL (default: $MARIN_PREFIX/telemetry)"

    q = sub.add_parser("query", help="Print rows (run, metric, step, value, time, phase) as CSV or JSON.")
    q.add_argument("--root", help=root_help)
    q.add_argument("--run", action="append", help="run name (repeatable; default: all runs)")
    q.add_argument("--metric", action="append", help="metric name (repeatable; default: all metrics)")
    q.add_argument("--steps", help="inclusive step range START:END (either end may be empty)")
    q.add_argument("--format", choices=["csv", "json"], default="csv")
    q.add_argument(
        "--latest", action="store_true", help="one row per (run, metric, step): the last logged (a resumed run re-logs steps)"
    )
    q.set_defaults(handler=_query)

    i = sub.add_parser("ingest", help="Load a training metrics.jsonl into a run.")
    i.add_argument("--root", help=root_help)
    i.add_argument("--run", required=True)
    i.add_argument("--append", action="store_true", help="allow a run that already has rows")
    i.add_argument("file", help="metrics.jsonl")
    i.set_defaults(handler=_ingest)

    c = sub.add_parser("compact", help="Merge small segments of each run and hour.")
    c.add_argument("--root", help=root_help)
    add_flags(c, CompactionConfig, {"target_rows": "target-rows", "grace_s": "grace-seconds"})
    c.set_defaults(handler=_compact)

    r = sub.add_parser("repair", help="Rebuild the index from the segment files.")
    r.add_argument("--root", help=root_help)
    r.set_defaults(handler=_repair)


def _fail(command: str, err: Exception) -> int:
    """One line on stderr; exit 3 for a damaged store, else 2."""
    from marin_assets.telemetry.store import DamagedSegmentError  # deferred (import cost): polars, pyarrow

    print(f"marin telemetry {command}: {err}", file=sys.stderr)
    return 3 if isinstance(err, DamagedSegmentError) else 2


def _store(args):
    from marin_assets.telemetry import TelemetryStore, default_root  # deferred (import cost): polars, pyarrow

    root = args.root or default_root()
    check_bucket(root)  # gs://no-such-bucket: named, not as the upload URL of the first write
    return TelemetryStore(root)


def _query(args: argparse.Namespace) -> int:
    try:
        steps = parse_steps(args.steps) if args.steps else None
        frame = _store(args).query(run=args.run, metric=args.metric, steps=steps, latest=args.latest)
    except (ValueError, OSError, RuntimeError) as err:
        return _fail("query", err)
    if args.format == "csv":
        sys.stdout.write(frame.write_csv())
    else:
        print(json.dumps(frame.to_dicts()))
    if frame.height == 0:
        print("marin telemetry query: no rows matched", file=sys.stderr)
        return 1
    return 0


def _ingest(args: argparse.Namespace) -> int:
    from marin_assets.telemetry import import_metrics_jsonl  # deferred (import cost): polars, pyarrow

    try:
        report = import_metrics_jsonl(_store(args), args.run, args.file, append=args.append)
    except (ValueError, OSError, RuntimeError) as err:
        return _fail("ingest", err)
    print(json.dumps(report.to_json()))
    say = f"marin telemetry ingest: {args.file}:"
    if report.quarantined:
        print(f"{say} {report.quarantined} line(s) quarantined, first {report.quarantine[0]}", file=sys.stderr)
    for note in report.deferred:
        print(f"{say} {note}", file=sys.stderr)
    if report.values == 0 and report.already_ingested_bytes:
        print(
            f"{say} nothing new: run {args.run} already holds the rows of {report.already_ingested_bytes} "
            "bytes of it, and the rest gave no metric value",
            file=sys.stderr,
        )
        return 0
    if report.values == 0:
        print(f"{say} no metric values imported", file=sys.stderr)
        return 1
    return 0


def _compact(args: argparse.Namespace) -> int:
    from marin_assets.telemetry.compaction import CompactionConfig  # deferred (import cost): polars, pyarrow

    try:
        config = from_flags(args, CompactionConfig)
        report = _store(args).compact(config.target_rows, config.grace_s)
    except (ValueError, OSError, RuntimeError) as err:
        return _fail("compact", err)
    print(json.dumps(report.__dict__))
    return 0


def _repair(args: argparse.Namespace) -> int:
    try:
        report = _store(args).repair()
    except (ValueError, OSError) as err:
        return _fail("repair", err)
    print(json.dumps(report.__dict__))
    for bad in report.damaged:
        print(
            f"marin telemetry repair: damaged segment {bad['path']} ({bad['reason']}) moved to {bad['moved_to']}", file=sys.stderr
        )
    if report.damaged:
        lost = "unknown (the index did not know every damaged segment)" if report.rows_lost is None else report.rows_lost
        print(f"marin telemetry repair: rows lost: {lost}", file=sys.stderr)
    return 0
