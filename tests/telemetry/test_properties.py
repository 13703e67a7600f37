"""Random appends, flushes and compactions: every query equals a plain in-memory filter."""

from __future__ import annotations

import math
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from marin_assets.telemetry import TelemetryStore, TelemetryWriter

RUNS = ["r1", "r2"]
METRICS = ["loss", "lr", "counts.x"]

values = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64), st.integers(-1000, 1000))
log_op = st.tuples(
    st.just("log"),
    st.sampled_from(RUNS),
    st.integers(0, 60),
    st.dictionaries(st.sampled_from(METRICS), values, min_size=1, max_size=3),
    st.sampled_from([None, "warmup", "stable"]),
)
flush_op = st.tuples(st.just("flush"), st.sampled_from(RUNS))
compact_op = st.tuples(st.just("compact"), st.integers(2, 40), st.sampled_from([0.0, 3600.0]))
step_end = st.one_of(st.none(), st.integers(0, 60))
query = st.tuples(
    st.one_of(st.none(), st.sampled_from(RUNS), st.just(RUNS)),
    st.one_of(st.none(), st.sampled_from(METRICS), st.lists(st.sampled_from(METRICS), min_size=1)),
    st.tuples(step_end, step_end).map(lambda r: r if None in r else tuple(sorted(r))),
)


def expected(model, run, metric, steps):
    runs = None if run is None else {run} if isinstance(run, str) else set(run)
    metrics = None if metric is None else {metric} if isinstance(metric, str) else set(metric)
    lo, hi = steps
    rows = [
        r
        for r in model
        if (runs is None or r[0] in runs)
        and (metrics is None or r[1] in metrics)
        and (lo is None or r[2] >= lo)
        and (hi is None or r[2] <= hi)
    ]
    key = lambda r: (r[0], r[1], r[2], r[4], -math.inf if r[3] is None else r[3], r[5] or "")  # noqa: E731
    return sorted(rows, key=key)


def check(store, model, queries):
    for run, metric, steps in queries:
        got = store.query(run=run, metric=metric, steps=steps).rows()
        assert got == expected(model, run, metric, steps), (run, metric, steps)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.one_of(log_op, log_op, log_op, flush_op, compact_op), max_size=40), st.lists(query, min_size=1, max_size=5))
def test_queries_match_an_in_memory_filter(ops, queries):
    root = f"memory://telemetry-prop-{uuid.uuid4().hex}"
    store = TelemetryStore(root)
    writers = {run: TelemetryWriter(store, run, flush_rows=7, flush_seconds=1e9) for run in RUNS}
    flushed, buffered = [], {run: [] for run in RUNS}
    clock = 0.0
    try:
        for op in ops:
            if op[0] == "log":
                _, run, step, metrics, phase = op
                clock += 1.0
                writers[run].log(step, metrics, time=clock, phase=phase)
                for name, v in metrics.items():
                    buffered[run].append((run, name, step, float(v) if math.isfinite(v) else None, clock, phase))
                if not writers[run]._buffered:  # the size rule flushed it
                    flushed += buffered[run]
                    buffered[run] = []
            elif op[0] == "flush":
                writers[op[1]].flush()
                flushed += buffered[op[1]]
                buffered[op[1]] = []
            else:
                before = store.query().rows()
                store.compact(target_rows=op[1], grace_s=op[2])
                assert store.query().rows() == before
            assert store.query().height == len(flushed)  # buffered rows are not visible yet
        check(store, flushed, queries)
        for w in writers.values():
            w.close()
        check(store, flushed + buffered["r1"] + buffered["r2"], queries)
        assert store.verify() == []
    finally:
        if store.fs.exists(store.root):
            store.fs.rm(store.root, recursive=True)
