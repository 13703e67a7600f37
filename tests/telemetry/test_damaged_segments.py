"""A damaged (truncated) segment: queries name it and exit 3, repair quarantines it and says
how many rows were lost, and queries work again."""

from __future__ import annotations

import json

import pytest

from marin_assets.cli import main
from marin_assets.telemetry import TelemetryStore, TelemetryWriter, import_metrics_jsonl
from marin_assets.telemetry.store import DamagedSegmentError


def write_run(root, run, steps, flush_every):
    with TelemetryWriter(root, run, flush_rows=flush_every, flush_seconds=1e9) as w:
        for s in steps:
            w.log(s, {"loss": float(s)}, time=1000.0 + s)
    return w.segments


def truncate(store, rel, keep=0.5):
    data = store.fs.cat_file(store._abs(rel))
    store.fs.pipe_file(store._abs(rel), data[: int(len(data) * keep)])


def test_query_names_a_truncated_segment_and_exits_3(root, capsys):
    segments = write_run(root, "r1", range(30), flush_every=10)
    write_run(root, "r2", range(5), flush_every=10)
    store = TelemetryStore(root)
    bad = segments[1].path
    truncate(store, bad)
    with pytest.raises(DamagedSegmentError) as caught:
        store.query(run="r1")
    assert list(caught.value.problems) == [bad] and "repair" in str(caught.value)
    assert store.query(run="r1", steps=(0, 9))["step"].to_list() == list(range(10))  # pruned: never reads it
    assert store.query(run="r2").height == 5
    assert main(["telemetry", "query", "--root", root, "--run", "r1"]) == 3
    err = capsys.readouterr().err
    assert bad in err and "damaged segment" in err and "marin telemetry repair" in err
    assert main(["telemetry", "query", "--root", root, "--run", "r9"]) == 1  # nothing matched stays 1
    assert main(["telemetry", "compact", "--root", root]) == 3
    assert bad in capsys.readouterr().err


def test_repair_quarantines_the_damaged_segment_and_counts_the_rows_lost(root, capsys):
    segments = write_run(root, "r1", range(30), flush_every=10)
    store = TelemetryStore(root)
    bad = segments[1].path
    truncate(store, bad, keep=0.9)
    assert any(bad in p for p in store.verify())
    assert main(["telemetry", "repair", "--root", root]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert [(d["path"], d["rows"], d["moved_to"]) for d in report["damaged"]] == [(bad, 10, f"_quarantine/{bad}")]
    assert (report["rows_lost"], report["rows"], report["live_segments"], report["restored"]) == (10, 20, 2, [])
    assert bad in captured.err and "rows lost: 10" in captured.err
    assert store.fs.exists(store._abs(f"_quarantine/{bad}")) and not store.fs.exists(store._abs(bad))
    assert store.verify() == []
    assert store.query(run="r1")["step"].to_list() == [*range(10), *range(20, 30)]
    assert main(["telemetry", "query", "--root", root, "--run", "r1"]) == 0


def test_an_unindexed_truncated_segment_fails_every_query_until_repaired(tmp_path):
    root = str(tmp_path / "tel")
    segments = write_run(root, "r1", range(20), flush_every=10)
    write_run(root, "r2", range(5), flush_every=10)
    store = TelemetryStore(root)
    store.fs.rm(store._abs("index.json"))  # e.g. a fresh copy of the segments: footers are the truth
    truncate(store, segments[0].path)
    with pytest.raises(DamagedSegmentError, match=segments[0].path):
        store.query(run="r2")  # without its footer the file could hold rows of any run
    problems = [p for p in store.verify() if "not in the index" not in p]
    assert len(problems) == 1 and problems[0].startswith(f"{segments[0].path}: unreadable (ArrowInvalid: ")
    report = store.repair()
    assert [d["path"] for d in report.damaged] == [segments[0].path]
    assert report.damaged[0]["rows"] is None and report.rows_lost is None  # nobody knew its row count
    assert store.query().height == 15


def test_a_damaged_merged_segment_gives_back_its_inputs(root):
    write_run(root, "r1", range(30), flush_every=10)
    store = TelemetryStore(root)
    before = store.query()
    assert store.compact(grace_s=3600).merged == 3  # the inputs stay on disk for the grace period
    (merged,) = store.segments()
    truncate(store, merged.path)
    report = store.repair()
    assert [d["path"] for d in report.damaged] == [merged.path]
    assert (report.rows_lost, len(report.restored), report.live_segments) == (0, 3, 3)
    assert store.query().equals(before)


def test_reingesting_the_file_after_repair_brings_the_lost_rows_back(tmp_path):
    path, root = tmp_path / "metrics.jsonl", str(tmp_path / "tel")
    path.write_text("".join(json.dumps({"step": s, "loss": s / 2}) + "\n" for s in range(60)))
    report = import_metrics_jsonl(root, "r1", path, flush_rows=20)
    assert report.segments == 3
    store = TelemetryStore(root)
    before = store.query()
    truncate(store, store.segments()[1].path)
    assert store.repair().rows_lost == 20
    again = import_metrics_jsonl(root, "r1", path)  # the file's other rows are there: no --append needed
    assert (again.values, again.lines) == (20, 20)
    assert store.query().equals(before)
