"""Telemetry store vs a training metrics.jsonl read with polars.

Both sides receive the same per-step rows (loss, lr, grad_norm, update_norm, tokens, plus
step, time and phase), ``--rows`` metric values in all (steps = rows / 5):

- telemetry_ingest: metric values per second. Ours: ``TelemetryWriter.log`` per step and
  ``close`` (Parquet segments, index, fsync). Reference: ``MetricsLogger.write`` per step
  and ``close`` (the trainer's metrics.jsonl). Rows are built before the clock starts.
- telemetry_range_query: latency of "loss of run R for 1,001 steps in the middle".
  Ours: ``TelemetryStore.query`` (index pruning + lazy polars scan with pushdown).
  Reference: ``pl.scan_ndjson(metrics.jsonl).filter(step range).select(step, loss)``.
  Both answers must be equal, or the script exits 1.
- telemetry_range_query_compacted: the same query after ``compact`` (reference unchanged).

    python benchmarks/telemetry.py [--rows 10000000] [--dir DIR] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import polars as pl

sys.path.insert(0, os.path.dirname(__file__))
from _common import emit, timed  # noqa: E402

from marin_assets.telemetry import TelemetryStore, TelemetryWriter  # noqa: E402
from marin_assets.train.metrics import MetricsLogger  # noqa: E402

METRICS = ("loss", "lr", "grad_norm", "update_norm", "tokens")
CHUNK_STEPS = 50_000


def chunks(n_steps: int, seed: int = 0):
    """(steps, times, phases, metric dicts) per chunk: trainer-like, deterministic values."""
    rng = np.random.default_rng(seed)
    t0 = 1.7e9
    for start in range(0, n_steps, CHUNK_STEPS):
        steps = np.arange(start, min(start + CHUNK_STEPS, n_steps))
        loss = (10.0 / np.sqrt(steps + 1) + 2.0 + 0.01 * rng.standard_normal(len(steps))).tolist()
        lr = (1e-3 * np.minimum(1.0, (steps + 1) / 1000)).tolist()
        grad = np.abs(rng.standard_normal(len(steps))).tolist()
        upd = (np.abs(rng.standard_normal(len(steps))) * 1e-3).tolist()
        tokens = (steps * 4096).tolist()
        times = (t0 + steps * 0.25).tolist()
        phases = ["warmup" if s < 1000 else "stable" for s in steps.tolist()]
        metrics = [dict(zip(METRICS, vals)) for vals in zip(loss, lr, grad, upd, tokens)]
        yield steps.tolist(), times, phases, metrics


def ingest_ours(root: str, run: str, n_steps: int) -> float:
    elapsed = 0.0
    writer = TelemetryWriter(root, run, flush_rows=100_000, flush_seconds=1e9)
    for steps, times, phases, metrics in chunks(n_steps):
        start = time.perf_counter()
        log = writer.log
        for step, t, phase, m in zip(steps, times, phases, metrics):
            log(step, m, time=t, phase=phase)
        elapsed += time.perf_counter() - start
    start = time.perf_counter()
    writer.close()
    return elapsed + time.perf_counter() - start


def ingest_reference(out_dir: str, n_steps: int) -> float:
    elapsed = 0.0
    logger = MetricsLogger(out_dir)
    for steps, times, phases, metrics in chunks(n_steps):
        rows = [{"step": s, "time": t, "phase": p, **m} for s, t, p, m in zip(steps, times, phases, metrics)]
        start = time.perf_counter()
        write = logger.write
        for row in rows:
            write(row)
        elapsed += time.perf_counter() - start
    start = time.perf_counter()
    logger.close()
    return elapsed + time.perf_counter() - start


def median_latency(fn, repeats: int) -> tuple[float, object]:
    fn()  # warm: imports, page cache, polars thread pool
    runs = [timed(fn) for _ in range(repeats)]
    return statistics.median(r[0] for r in runs), runs[-1][1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="metric values in all (default 10M)")
    parser.add_argument("--dir", help="work directory (default: a temporary one, removed afterwards)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.rows < 10 * len(METRICS) * 1001 or args.repeats < 1:
        parser.error(f"--rows must be >= {10 * len(METRICS) * 1001} and --repeats >= 1")
    n_steps = args.rows // len(METRICS)
    work = args.dir or tempfile.mkdtemp(prefix="bench-telemetry-")
    root, jsonl_dir, run = os.path.join(work, "telemetry"), os.path.join(work, "jsonl"), "bench"
    try:
        # Warm both paths (lazy imports, first-file costs) in scratch space before timing.
        ingest_ours(os.path.join(work, "warm-ours"), run, 2 * CHUNK_STEPS // 10)
        ingest_reference(os.path.join(work, "warm-ref"), 2 * CHUNK_STEPS // 10)
        cpu0 = time.process_time()
        ours_s = ingest_ours(root, run, n_steps)
        cpu1 = time.process_time()
        ref_s = ingest_reference(jsonl_dir, n_steps)
        cpu2 = time.process_time()
        rows = n_steps * len(METRICS)
        store = TelemetryStore(root)
        # Wall clock is the figure; process CPU seconds (including row building) are context
        # for a shared machine, where wall time also counts other processes.
        emit(
            "telemetry_ingest",
            "metric values/s",
            rows / ours_s,
            rows / ref_s,
            higher_is_better=True,
            rows=rows,
            segments=len(store.segments()),
            cpu_s_ours=round(cpu1 - cpu0, 3),
            cpu_s_reference=round(cpu2 - cpu1, 3),
        )

        lo = n_steps // 2
        hi = lo + 1000
        jsonl = os.path.join(jsonl_dir, "metrics.jsonl")

        def ours():
            return store.query(run=run, metric="loss", steps=(lo, hi)).select("step", "value")

        def reference():
            return (
                pl.scan_ndjson(jsonl)
                .filter(pl.col("step").is_between(lo, hi))
                .select("step", pl.col("loss").alias("value"))
                .collect()
                .sort("step")
            )

        ours_q, got = median_latency(ours, args.repeats)
        ref_q, want = median_latency(reference, max(1, args.repeats // 2))
        if not got.equals(want) or got.height != 1001:
            print(f"answers differ: ours {got.height} rows, reference {want.height}", file=sys.stderr)
            return 1
        emit(
            "telemetry_range_query",
            "s",
            ours_q,
            ref_q,
            higher_is_better=False,
            rows=rows,
            steps=f"{lo}:{hi}",
            answer_rows=got.height,
            jsonl_bytes=os.path.getsize(jsonl),
        )

        report = store.compact(grace_s=0)
        ours_c, got_c = median_latency(ours, args.repeats)
        if not got_c.equals(want):
            print("answer changed after compaction", file=sys.stderr)
            return 1
        emit(
            "telemetry_range_query_compacted",
            "s",
            ours_c,
            ref_q,
            higher_is_better=False,
            rows=rows,
            segments=report.live_segments,
        )
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
