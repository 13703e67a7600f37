"""Ingesting a metrics.jsonl is idempotent: the same rows of the same file never count twice,
whether ingested again, grown, at once from two processes, or after a failed ingest."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_assets.cli import main
from marin_assets.telemetry import TelemetryStore, import_metrics_jsonl
from marin_assets.telemetry import store as store_module


def lines(steps, phase="p"):
    return "".join(json.dumps({"step": s, "loss": 1.0 / (s + 1), "lr": s * 1e-4, "phase": phase}) + "\n" for s in steps)


def expected_rows(steps):
    return sorted([("loss", s, 1.0 / (s + 1)) for s in steps] + [("lr", s, s * 1e-4) for s in steps])


def stored_rows(root, run="r1"):
    return sorted(TelemetryStore(root).query(run=run).select("metric", "step", "value").rows())


def test_the_same_file_twice_in_a_row_adds_nothing(root, tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text(lines(range(40)))
    first = import_metrics_jsonl(root, "r1", path, flush_rows=25)
    assert (first.values, first.segments, first.already_ingested_bytes) == (80, 4, 0)
    second = import_metrics_jsonl(root, "r1", path, append=True, flush_rows=25)
    assert (second.values, second.lines, second.segments) == (0, 0, 0)
    assert second.already_ingested_bytes == path.stat().st_size
    assert main(["telemetry", "ingest", "--root", root, "--run", "r1", "--append", str(path)]) == 0
    assert "nothing new" in capsys.readouterr().err
    assert stored_rows(root) == expected_rows(range(40))
    # Another run is another run: the same file goes into it once as well.
    assert import_metrics_jsonl(root, "r2", path).values == 80
    assert import_metrics_jsonl(root, "r2", path).values == 0
    assert stored_rows(root, "r2") == expected_rows(range(40))


def test_a_grown_file_adds_only_its_new_lines(root, tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(lines(range(100)))
    import_metrics_jsonl(root, "r1", path, flush_rows=64)
    first_size = path.stat().st_size
    with open(path, "a") as f:
        f.write(lines(range(100, 130)))
    grown = import_metrics_jsonl(root, "r1", path, flush_rows=64)  # no --append needed: it is the same file
    assert (grown.values, grown.lines, grown.already_ingested_bytes) == (60, 30, first_size)
    assert stored_rows(root) == expected_rows(range(130))
    # Compaction keeps the record of what was ingested: the file still adds nothing.
    TelemetryStore(root).compact(grace_s=0)
    assert import_metrics_jsonl(root, "r1", path).values == 0
    assert stored_rows(root) == expected_rows(range(130))


def test_a_rerun_after_a_failed_ingest_adds_exactly_the_rest(tmp_path, monkeypatch):
    path, root = tmp_path / "metrics.jsonl", str(tmp_path / "tel")
    path.write_text(lines(range(50)))
    real_append, calls = store_module.TelemetryStore.append, []

    def append_failing_third(self, table, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise OSError("disk full")
        return real_append(self, table, *args, **kwargs)

    monkeypatch.setattr(store_module.TelemetryStore, "append", append_failing_third)
    with pytest.raises(OSError, match="disk full"):
        import_metrics_jsonl(root, "r1", path, flush_rows=20)
    monkeypatch.undo()
    assert stored_rows(root) == expected_rows(range(20))  # two segments of ten steps made it
    rerun = import_metrics_jsonl(root, "r1", path, flush_rows=20)
    assert rerun.values == 60 and rerun.lines == 30
    assert stored_rows(root) == expected_rows(range(50))


def test_a_torn_last_line_is_deferred_then_ingested_whole(tmp_path):
    path, root = tmp_path / "metrics.jsonl", str(tmp_path / "tel")
    whole = json.dumps({"step": 3, "loss": 0.25})
    path.write_text(lines(range(3)) + whole[:9])
    first = import_metrics_jsonl(root, "r1", path)
    assert (first.lines, first.steps, first.quarantined) == (4, 3, 0)
    assert len(first.deferred) == 1 and first.deferred[0].startswith("line 4: unterminated last line")
    with open(path, "a") as f:
        f.write(whole[9:])  # complete JSON, still no newline: ingested, it is a whole record
    second = import_metrics_jsonl(root, "r1", path)
    assert (second.steps, second.deferred) == (1, [])
    with open(path, "a") as f:
        f.write("\n" + json.dumps({"step": 4, "loss": 0.2}) + "\n")
    third = import_metrics_jsonl(root, "r1", path)
    assert (third.steps, third.quarantined, third.lines) == (1, 0, 1)
    frame = TelemetryStore(root).query(metric="loss")
    assert frame.select("step", "value").rows() == [(s, 1.0 / (s + 1)) for s in range(3)] + [(3, 0.25), (4, 0.2)]


@pytest.mark.slow
def test_two_concurrent_ingest_processes_add_the_file_once(tmp_path):
    path, root, go = tmp_path / "metrics.jsonl", str(tmp_path / "tel"), tmp_path / "go"
    path.write_text(lines(range(20_000)))
    # Both processes import everything first, then start ingesting at the same moment.
    body = (
        "import os, sys, time\nfrom marin_assets.cli import main\nimport marin_assets.telemetry\n"
        "while not os.path.exists(sys.argv[1]): time.sleep(0.005)\nsys.exit(main(sys.argv[2:]))"
    )
    argv = [sys.executable, "-c", body, str(go), "telemetry", "ingest", "--root", root, "--run", "r1", str(path)]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    time.sleep(3.0)  # time for both to import
    go.touch()
    results = [(p.wait(timeout=300), p.stdout.read(), p.stderr.read()) for p in procs]
    assert [rc for rc, _, _ in results] == [0, 0], results
    reports = [json.loads(out) for _, out, _ in results]
    assert sorted(r["values"] for r in reports) == [0, 40_000]  # one added the file, the other found it there
    assert stored_rows(root) == expected_rows(range(20_000))


records = st.fixed_dictionaries(
    {"step": st.integers(0, 50)},
    optional={"loss": st.floats(allow_nan=False, allow_infinity=False, width=32), "lr": st.sampled_from([1e-3, "nan", True])},
)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.one_of(records, st.sampled_from(["garbage", "[1]", "12"])), max_size=15), st.data())
def test_ingesting_after_every_growth_equals_one_ingest_of_the_whole_file(tmp_path_factory, items, data):
    """The file grows in arbitrary byte chunks (cut mid-line too); after each, it is ingested:
    the store ends up holding exactly the rows one ingest of the finished file gives."""
    tmp = tmp_path_factory.mktemp("grow")
    content = "".join((json.dumps(i) if isinstance(i, dict) else i) + "\n" for i in items).encode()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(content)), max_size=5)))
    growing, once = tmp / "growing.jsonl", tmp / "once.jsonl"
    for cut in [*cuts, len(content)]:
        growing.write_bytes(content[:cut])
        import_metrics_jsonl(str(tmp / "tel"), "r1", growing)
    once.write_bytes(content)
    import_metrics_jsonl(str(tmp / "tel"), "r2", once)
    columns = ["metric", "step", "value"]
    assert (
        TelemetryStore(str(tmp / "tel"))
        .query(run="r1")
        .select(columns)
        .equals(TelemetryStore(str(tmp / "tel")).query(run="r2").select(columns))
    )


def test_a_line_read_before_its_newline_and_the_next_line_are_each_stored_once(tmp_path):
    """Hypothesis found it: a complete JSON last line is read before its newline is written; the
    next ingest records the newline and the next line as a range starting mid-line, which the
    third ingest did not count as held, so it stored the next line again."""
    root, path = str(tmp_path / "tel"), tmp_path / "metrics.jsonl"
    content = lines([10, 0]).encode()
    first_end = content.index(b"\n")
    for cut in (first_end, len(content) - 1, len(content)):  # no newline; the next line's newline missing; all
        path.write_bytes(content[:cut])
        import_metrics_jsonl(root, "r1", path)
    assert stored_rows(root) == expected_rows([10, 0])
