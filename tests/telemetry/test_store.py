"""The telemetry store: writes, pruned queries, compaction, repair, and input validation."""

from __future__ import annotations

import math
import time

import polars as pl
import pytest

from marin_assets.telemetry import TelemetryStore, TelemetryWriter
from marin_assets.telemetry import store as store_module


def write_steps(root, run, steps, flush_every, metrics=("loss", "lr"), phase="p"):
    """Log ``steps`` for ``run``, flushing every ``flush_every`` steps; value = step * (i + 1)."""
    with TelemetryWriter(root, run, flush_rows=flush_every * len(metrics), flush_seconds=1e9) as w:
        for s in steps:
            w.log(s, {m: s * (i + 1.0) for i, m in enumerate(metrics)}, time=1000.0 + s, phase=phase)
    return w


QUERIES = [
    dict(),
    dict(run="r1"),
    dict(run=["r1", "r2"], metric="loss"),
    dict(metric="lr", steps=(10, 25)),
    dict(run="r2", steps=(None, 7)),
    dict(run="r1", metric=["loss", "lr"], steps=(33, None)),
    dict(steps=(40, 40)),
    dict(times=(1010.0, 1012.5)),
]


def answers(store):
    return [store.query(**q) for q in QUERIES]


def test_roundtrip_values_ranges_and_filters(root):
    write_steps(root, "r1", range(50), flush_every=8)
    write_steps(root, "r2", range(10), flush_every=100, metrics=("loss",))
    store = TelemetryStore(root)
    assert store.runs() == ["r1", "r2"]
    got = store.query(run="r1", metric="loss", steps=(100 // 10, 20))
    assert got["step"].to_list() == list(range(10, 21))  # inclusive at both ends
    assert got["value"].to_list() == [float(s) for s in range(10, 21)]
    assert set(got["run"]) == {"r1"} and set(got["phase"]) == {"p"}
    assert got["time"].to_list() == [1000.0 + s for s in range(10, 21)]
    lr = store.query(run="r1", metric="lr", steps=(49, None))
    assert lr.rows() == [("r1", "lr", 49, 98.0, 1049.0, "p")]
    assert store.query().height == 50 * 2 + 10
    in_time = store.query(run="r1", metric="loss", times=(1010.0, 1012.5))
    assert in_time["step"].to_list() == [10, 11, 12]
    assert store.query(run="r3").height == 0
    assert store.query(metric="nope").height == 0


def test_step_range_prunes_segments_before_scanning(tmp_path, monkeypatch):
    root = str(tmp_path)
    write_steps(root, "r1", range(100), flush_every=10)
    store = TelemetryStore(root)
    assert len(store.segments()) == 10
    scanned = []
    original = store._scan_files
    monkeypatch.setattr(store, "_scan_files", lambda rels: scanned.append(rels) or original(rels))
    frame = store.query(run="r1", metric="loss", steps=(25, 34))
    assert frame["step"].to_list() == list(range(25, 35))
    assert len(scanned[-1]) == 2  # segments 20-29 and 30-39 only
    store.query(run="other")
    assert len(scanned) == 1  # no segment of that run: nothing scanned at all


def test_scan_is_lazy_and_pushes_predicates_down(tmp_path):
    root = str(tmp_path)
    write_steps(root, "r1", range(20), flush_every=5)
    lazy = TelemetryStore(root).scan(run="r1", metric="loss", steps=(3, 4))
    assert isinstance(lazy, pl.LazyFrame)
    plan = lazy.explain()
    assert "SELECTION" in plan or "selection" in plan.lower()
    assert lazy.collect().height == 2


def test_nonfinite_values_are_kept_as_null_rows(root):
    with TelemetryWriter(root, "r1", flush_seconds=1e9) as w:
        w.log(1, {"loss": math.nan, "grad_norm": math.inf})
        w.log(2, {"loss": 1.5, "grad_norm": -math.inf})
    assert w.nonfinite == 3
    frame = TelemetryStore(root).query(run="r1")
    assert frame.height == 4  # every logged value is a row, the non-finite ones with null
    assert frame.filter(pl.col("value").is_null()).height == 3
    assert frame.filter(pl.col("value").is_nan()).height == 0
    assert frame.filter(pl.col("metric") == "loss")["value"].to_list() == [None, 1.5]


@pytest.mark.parametrize(
    "step, metrics, kwargs, message",
    [
        (-1, {"loss": 1.0}, {}, "non-negative integer"),
        (True, {"loss": 1.0}, {}, "non-negative integer"),
        ("3", {"loss": 1.0}, {}, "non-negative integer"),
        (1, {"../loss": 1.0}, {}, "invalid metric name '../loss'"),
        (1, {"loss\n": 1.0}, {}, "invalid metric name"),
        (1, {"loss": "2.0"}, {}, "metric 'loss': value must be a real number, got str"),
        (1, {"loss": None}, {}, "metric 'loss': value must be a real number, got NoneType"),
        (1, {"loss": 1.0}, {"time": math.nan}, "time must be a finite number"),
        (1, {"loss": 1.0}, {"phase": 3}, "phase must be a string"),
    ],
)
def test_log_rejects_bad_input_by_name(tmp_path, step, metrics, kwargs, message):
    w = TelemetryWriter(str(tmp_path), "r1")
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        w.log(step, metrics, **kwargs)
    assert w.flush() is None  # the rejected step buffered nothing


@pytest.mark.parametrize("bad", ["/loss", "moe/", "moe//load_cv", "moe/../x", "moe/.x", "moe/a b", "moe\\x", "x" * 257])
def test_grouped_metric_names_refuse_empty_hidden_or_parent_parts(tmp_path, bad):
    w = TelemetryWriter(str(tmp_path), "r1")
    with pytest.raises(ValueError, match="invalid metric name"):
        w.log(1, {bad: 1.0})
    with pytest.raises(ValueError, match="invalid metric name"):
        TelemetryStore(str(tmp_path)).query(metric=bad)


def test_grouped_metric_names_are_written_queried_and_ingested(tmp_path):
    """The per-step MoE telemetry's names (``moe/drop_rate``, ``moe/layer0/load_cv``), wandb-style groups."""
    import json

    from marin_assets.telemetry import import_metrics_jsonl

    names = {"moe/drop_rate": 0.25, "moe/layer0/load_cv": 1.5, "tokens_per_s": 900.0}
    with TelemetryWriter(str(tmp_path / "w"), "r1") as w:
        w.log(1, names, phase="main")
    store = TelemetryStore(str(tmp_path / "w"))
    frame = store.query(run="r1", metric=["moe/layer0/load_cv", "moe/drop_rate"])
    assert dict(zip(frame["metric"], frame["value"])) == {"moe/drop_rate": 0.25, "moe/layer0/load_cv": 1.5}
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "phase": "main", "loss": 2.0, **names}) + "\n")
    report = import_metrics_jsonl(str(tmp_path / "i"), "r1", path)
    assert report.ignored_fields == {}
    frame = TelemetryStore(str(tmp_path / "i")).query(metric="moe/layer0/load_cv")
    assert frame["value"].to_list() == [1.5]


def test_writer_accepts_numpy_and_bools(tmp_path):
    import numpy as np

    with TelemetryWriter(str(tmp_path), "r1") as w:
        w.log(np.int64(3), {"loss": np.float32(0.5), "skipped": True, "tokens": 4096})
    frame = TelemetryStore(str(tmp_path)).query()
    assert dict(zip(frame["metric"], frame["value"])) == {"loss": 0.5, "skipped": 1.0, "tokens": 4096.0}


def test_bad_names_and_ranges_are_refused(tmp_path):
    with pytest.raises(ValueError, match="invalid run"):
        TelemetryWriter(str(tmp_path), "a/b")
    store = TelemetryStore(str(tmp_path))
    with pytest.raises(ValueError, match="empty"):
        store.query(steps=(5, 4))
    with pytest.raises(ValueError, match="non-negative integers"):
        store.query(steps=(-1, 4))
    with pytest.raises(ValueError, match="finite"):
        store.query(times=(math.nan, 4))
    with pytest.raises(ValueError, match="invalid metric name"):
        store.query(metric="a b")
    with pytest.raises(ValueError, match="flush_rows"):
        TelemetryWriter(str(tmp_path), "r1", flush_rows=0)
    for bad in (math.nan, math.inf, 0.0, -1.0):
        with pytest.raises(ValueError, match="flush_seconds"):
            TelemetryWriter(str(tmp_path), "r1", flush_seconds=bad)
    assert TelemetryWriter(str(tmp_path), "r1", flush_seconds=0.5).flush_seconds == 0.5


def test_flush_by_size_by_time_and_on_exception(tmp_path):
    root = str(tmp_path)
    w = TelemetryWriter(root, "r1", flush_rows=4, flush_seconds=1e9)
    w.log(0, {"a": 1.0, "b": 2.0})
    assert w.segments == []
    w.log(1, {"a": 1.0, "b": 2.0})  # 4 values: flushed
    assert [s.rows for s in w.segments] == [4]
    timed = TelemetryWriter(root, "r2", flush_rows=10**6, flush_seconds=0.05)
    timed.log(0, {"a": 1.0})
    time.sleep(0.1)
    timed.log(1, {"a": 1.0})  # the flush interval has passed: both rows go out
    assert [s.rows for s in timed.segments] == [2]
    with pytest.raises(RuntimeError):
        with TelemetryWriter(root, "r3") as w3:
            w3.log(7, {"a": 1.0})
            raise RuntimeError("trainer crashed")
    assert TelemetryStore(root).query(run="r3")["step"].to_list() == [7]


def test_compaction_keeps_every_answer(root):
    write_steps(root, "r1", range(50), flush_every=4)
    write_steps(root, "r2", range(12), flush_every=3, metrics=("loss",))
    store = TelemetryStore(root)
    before, n_before = answers(store), len(store.segments())
    report = store.compact(target_rows=30, grace_s=0)
    after = answers(store)
    assert n_before == 13 + 4
    assert report.merged > report.written > 0
    assert report.deleted == report.merged  # no grace: the replaced files are gone
    assert report.live_segments == len(store.segments()) < n_before
    assert all(s.rows < 30 + 8 for s in store.segments())
    for q, b, a in zip(QUERIES, before, after):
        assert b.height > 0 or q == dict(times=(1010.0, 1012.5))
        assert b.equals(a), q
    assert store.verify() == []
    again = store.compact(target_rows=30, grace_s=0)
    assert again.written <= 1 and answers(store)[0].equals(before[0])


def test_retired_files_stay_for_the_grace_period_but_never_count(root):
    write_steps(root, "r1", range(40), flush_every=5)
    store = TelemetryStore(root)
    before = answers(store)
    report = store.compact(target_rows=10**6, grace_s=3600)
    assert (report.merged, report.written, report.deleted) == (8, 1, 0)
    assert len(store._list_segment_files()) == 9  # the 8 replaced files are still there
    assert all(b.equals(a) for b, a in zip(before, answers(store)))
    assert store.compact(grace_s=0).deleted == 8
    assert len(store._list_segment_files()) == 1


def test_reader_during_the_swap_never_double_counts(tmp_path, monkeypatch):
    """Run queries, from a separate reader, at the instant the merged segment exists but the
    index has not been updated and the replaced files are still on disk."""
    root = str(tmp_path)
    write_steps(root, "r1", range(60), flush_every=6)
    store, reader = TelemetryStore(root), TelemetryStore(root)
    before = answers(reader)
    seen = []
    original = store._update_index

    def checking_update(add=(), remove=(), retire=()):
        if retire:  # the swap of a merge: merged file published, index still old
            assert len(reader._list_segment_files()) == 11
            seen.append(answers(reader))
        return original(add=add, remove=remove, retire=retire)

    monkeypatch.setattr(store, "_update_index", checking_update)
    store.compact(target_rows=10**6, grace_s=0)
    assert len(seen) == 1
    assert all(b.equals(m) for b, m in zip(before, seen[0]))
    assert all(b.equals(a) for b, a in zip(before, answers(reader)))


def test_compaction_killed_before_the_index_update_is_healed(tmp_path, monkeypatch):
    root = str(tmp_path)
    write_steps(root, "r1", range(30), flush_every=5)
    store = TelemetryStore(root)
    before = answers(store)
    original = store._update_index

    def die_at_swap(add=(), remove=(), retire=()):
        if retire:
            raise KeyboardInterrupt("killed")
        return original(add=add, remove=remove, retire=retire)

    monkeypatch.setattr(store, "_update_index", die_at_swap)
    with pytest.raises(KeyboardInterrupt):
        store.compact(target_rows=10**6, grace_s=0)
    fresh = TelemetryStore(root)
    assert all(b.equals(a) for b, a in zip(before, answers(fresh)))
    assert len(fresh.segments()) == 1  # the merged file, found by its footer
    problems = fresh.verify()
    assert len(problems) == 1 and "not in the index" in problems[0]
    report = fresh.repair()
    assert (report.live_segments, report.rows, len(report.unindexed)) == (1, 60, 1)
    assert fresh.verify() == []
    assert fresh.compact(grace_s=0).deleted == 6
    assert all(b.equals(a) for b, a in zip(before, answers(fresh)))


def test_deleting_a_merged_segment_never_resurrects_its_predecessors(tmp_path):
    """Second-generation merges name the first generation's inputs while they exist."""
    root = str(tmp_path)
    write_steps(root, "r1", range(20), flush_every=5)
    store = TelemetryStore(root)
    store.compact(target_rows=10**6, grace_s=3600)  # 4 inputs retired, kept on disk
    first = store.segments()[0]
    write_steps(root, "r1", range(20, 30), flush_every=5)
    before = answers(store)
    store.compact(target_rows=10**6, grace_s=3600)
    second = store.segments()[0]
    assert set(first.replaces) < set(second.replaces) and first.path in second.replaces
    store.fs.rm(store._abs(first.path))  # first-generation merge deleted before its inputs
    assert all(b.equals(a) for b, a in zip(before, answers(store)))


def test_index_is_a_cache_rebuilt_from_segments(tmp_path):
    root = str(tmp_path)
    write_steps(root, "r1", range(30), flush_every=7)
    store = TelemetryStore(root)
    before = answers(store)
    store.fs.rm(store._abs("index.json"))
    assert all(b.equals(a) for b, a in zip(before, answers(store)))
    with open(store._abs("index.json"), "w") as f:
        f.write("{not json")
    assert all(b.equals(a) for b, a in zip(before, answers(store)))
    with open(store._abs("index.json"), "w") as f:
        f.write('{"format": 1, "segments": [{"path": "../x"}], "retired": []}')
    assert all(b.equals(a) for b, a in zip(before, answers(store)))
    report = store.repair()
    assert (report.live_segments, report.rows, len(report.unindexed)) == (5, 60, 5)
    assert store.verify() == []


def test_verify_reports_a_tampered_segment(tmp_path):
    root = str(tmp_path)
    write_steps(root, "r1", range(10), flush_every=5)
    store = TelemetryStore(root)
    assert store.verify() == []
    victim = store._abs(store.segments()[0].path)
    with open(victim, "r+b") as f:
        f.seek(10)
        f.write(b"\xff\xff")
    problems = store.verify()
    assert len(problems) == 1 and "sha256" in problems[0]


def test_second_compaction_is_refused_while_one_runs(tmp_path):
    root = str(tmp_path)
    write_steps(root, "r1", range(10), flush_every=5)
    store = TelemetryStore(root)
    lease = store_module.Lease(store.fs, store._abs("_compact"))
    assert lease.acquire()
    try:
        with pytest.raises(RuntimeError, match="another compaction"):
            store.compact()
    finally:
        lease.release()
    assert store.compact(grace_s=0).merged == 2


def test_latest_keeps_the_resumed_values_of_relogged_steps(root):
    with TelemetryWriter(root, "r1") as w:
        for s in range(10):
            w.log(s, {"loss": 10.0 - s}, time=100.0 + s)
    with TelemetryWriter(root, "r1") as w:  # resumed from the checkpoint at step 4
        for s in range(5, 8):
            w.log(s, {"loss": 0.5 - s / 100}, time=200.0 + s)
    store = TelemetryStore(root)
    assert store.query(run="r1").height == 13  # both attempts are kept
    latest = store.query(run="r1", latest=True)
    assert latest["step"].to_list() == list(range(10))
    assert latest["value"].to_list() == [10.0 - s for s in range(5)] + [0.45, 0.44, 0.43] + [2.0, 1.0]
    assert store.query(run="r1", steps=(6, 6), latest=True)["time"].to_list() == [206.0]
