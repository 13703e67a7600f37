"""`marin telemetry query|ingest|compact|repair`: output, exit codes, input validation."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from marin_assets.cli import main
from marin_assets.cli.telemetry import parse_steps
from marin_assets.telemetry import TelemetryStore, TelemetryWriter


@pytest.fixture
def store_root(tmp_path):
    root = str(tmp_path / "tel")
    with TelemetryWriter(root, "r1", flush_rows=200) as w:
        for s in range(300):
            w.log(s, {"loss": 10.0 - s / 100, "lr": 0.001}, time=100.0 + s, phase="stable")
    return root


def test_query_prints_csv_of_the_inclusive_range(store_root, capsys):
    assert main(["telemetry", "query", "--root", store_root, "--run", "r1", "--metric", "loss", "--steps", "100:200"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [int(r["step"]) for r in rows] == list(range(100, 201))
    assert rows[0] == {"run": "r1", "metric": "loss", "step": "100", "value": "9.0", "time": "200.0", "phase": "stable"}


def test_query_prints_json_and_accepts_open_ranges(store_root, capsys):
    assert main(["telemetry", "query", "--root", store_root, "--steps", "298:", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["metric"], r["step"]) for r in rows] == [("loss", 298), ("loss", 299), ("lr", 298), ("lr", 299)]
    assert main(["telemetry", "query", "--root", store_root, "--metric", "lr", "--steps", ":1"]) == 0
    assert capsys.readouterr().out.count("\n") == 3  # header and two rows


def test_query_latest_flag(store_root, capsys):
    with TelemetryWriter(store_root, "r1") as w:
        w.log(5, {"loss": 0.25}, time=10_000.0)
    assert main(["telemetry", "query", "--root", store_root, "--metric", "loss", "--steps", "5"]) == 0
    assert capsys.readouterr().out.count("\n") == 3
    assert (
        main(["telemetry", "query", "--root", store_root, "--metric", "loss", "--steps", "5", "--latest", "--format", "json"])
        == 0
    )
    assert [(r["step"], r["value"]) for r in json.loads(capsys.readouterr().out)] == [(5, 0.25)]


def test_query_defaults_to_marin_prefix(store_root, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MARIN_PREFIX", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tel").rename(tmp_path / "telemetry")
    assert main(["telemetry", "query", "--run", "r1", "--steps", "5"]) == 0
    assert capsys.readouterr().out.count("\n") == 3


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--steps", "200:100"], "start 200 is after end 100"),
        (["--steps=-5:10"], "START:END with non-negative integers"),
        (["--steps", "1:2:3"], "START:END"),
        (["--steps", "1.5:3"], "START:END"),
        (["--run", "../etc"], "invalid run '../etc'"),
        (["--metric", "loss;rm"], "invalid metric name"),
    ],
)
def test_query_refuses_bad_input_with_exit_2(store_root, capsys, argv, message):
    assert main(["telemetry", "query", "--root", store_root, *argv]) == 2
    assert message in capsys.readouterr().err


def test_query_with_no_match_exits_1(store_root, capsys):
    assert main(["telemetry", "query", "--root", store_root, "--run", "r9"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "run,metric,step,value,time,phase\n" and "no rows matched" in captured.err


def test_ingest_then_compact_then_repair(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0 / (s + 1), "phase": "a"}) + "\n" for s in range(50)) + "garbage\n")
    root = str(tmp_path / "tel")
    assert main(["telemetry", "ingest", "--root", root, "--run", "r1", str(path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["values"], report["quarantined"], report["quarantine"]) == (50, 1, ["line 51: not JSON (Expecting value)"])
    assert main(["telemetry", "ingest", "--root", root, "--run", "r1", str(path)]) == 0  # the same file: no new rows
    assert json.loads(capsys.readouterr().out)["values"] == 0
    later = tmp_path / "later.jsonl"
    later.write_text("".join(json.dumps({"step": s, "loss": 1.0 / (s + 1), "phase": "b"}) + "\n" for s in range(50, 100)))
    assert main(["telemetry", "ingest", "--root", root, "--run", "r1", str(later)]) == 2
    assert "already has 50 rows" in capsys.readouterr().err
    assert main(["telemetry", "ingest", "--root", root, "--run", "r1", "--append", str(later)]) == 0
    capsys.readouterr()
    before = TelemetryStore(root).query()
    assert main(["telemetry", "compact", "--root", root, "--grace-seconds", "0"]) == 0
    compacted = json.loads(capsys.readouterr().out)
    assert (compacted["merged"], compacted["written"], compacted["rows"], compacted["deleted"]) == (2, 1, 100, 2)
    assert TelemetryStore(root).query().equals(before)
    assert main(["telemetry", "repair", "--root", root]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 100


def test_ingest_of_a_file_with_no_values_exits_1(tmp_path, capsys):
    path = tmp_path / "empty.jsonl"
    path.write_text('{"step": 1}\n')
    assert main(["telemetry", "ingest", "--root", str(tmp_path / "tel"), "--run", "r1", str(path)]) == 1
    assert "no metric values imported" in capsys.readouterr().err
    assert main(["telemetry", "ingest", "--root", str(tmp_path / "tel"), "--run", "r1", str(tmp_path / "missing.jsonl")]) == 2


def test_compact_refuses_bad_numbers(tmp_path, capsys):
    assert main(["telemetry", "compact", "--root", str(tmp_path), "--grace-seconds", "nan"]) == 2
    assert "grace_s" in capsys.readouterr().err
    assert main(["telemetry", "compact", "--root", str(tmp_path), "--target-rows", "1"]) == 2


@given(st.integers(0, 10**12), st.integers(0, 10**12))
def test_parse_steps_round_trips_or_refuses(lo, hi):
    if lo <= hi:
        assert parse_steps(f"{lo}:{hi}") == (lo, hi)
    else:
        with pytest.raises(ValueError, match="is after end"):
            parse_steps(f"{lo}:{hi}")
    assert parse_steps(f"{lo}:") == (lo, None) and parse_steps(f":{hi}") == (None, hi)
    assert parse_steps(str(lo)) == (lo, lo)


@given(st.text(max_size=12))
def test_parse_steps_never_accepts_junk(text):
    try:
        lo, hi = parse_steps(text)
    except ValueError:
        return
    stripped = text.strip()
    assert re.fullmatch(r"[0-9]*:?[0-9]*", stripped)
    assert (lo is None or lo >= 0) and (hi is None or hi >= 0)


def test_query_compact_repair_of_a_root_that_is_a_file_exit_2_with_one_line(tmp_path, capsys):
    not_a_dir = tmp_path / "metrics.jsonl"
    not_a_dir.write_text('{"step": 1, "loss": 1.0}\n')
    for argv in (["query"], ["compact"], ["repair"], ["ingest", "--run", "r1", str(not_a_dir)]):
        assert main(["telemetry", *argv, "--root", str(not_a_dir)]) == 2
        err = capsys.readouterr().err
        assert err == f"marin telemetry {argv[0]}: telemetry store root {not_a_dir} is a file, not a directory\n"


_INGEST_BOUNDED = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # an unbounded read fails here, not on the machine
from marin_assets.cli import main
sys.exit(main(["telemetry", "ingest", "--root", sys.argv[1], "--run", "r1", sys.argv[2]]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["device", "fifo", "directory"])
def test_ingest_refuses_a_file_that_is_not_regular_at_once(tmp_path, kind):
    """/dev/zero never ends and a FIFO's open waits for a writer: both were read (or waited on)
    forever. A subprocess, so that a regression times out instead of hanging the suite."""
    import os
    import subprocess
    import sys

    path = {"device": "/dev/zero", "fifo": str(tmp_path / "fifo"), "directory": str(tmp_path)}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    done = subprocess.run(
        [sys.executable, "-c", _INGEST_BOUNDED, str(tmp_path / "tel"), path], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert (
        done.stderr == f"marin telemetry ingest: {path}: not a regular file (a device, FIFO, socket or directory); "
        "give a metrics.jsonl file\n"
    )


def test_ingest_refuses_a_line_past_the_bound_without_reading_on(tmp_path, capsys, monkeypatch):
    import marin_assets.telemetry.ingest as ingest

    monkeypatch.setattr(ingest, "MAX_LINE_BYTES", 4096)
    path = tmp_path / "metrics.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"step": 1, "loss": 1.0}\n')
        f.truncate(1 << 30)  # a sparse GiB of NUL bytes: no newline after line 1
    assert main(["telemetry", "ingest", "--root", str(tmp_path / "tel"), "--run", "r1", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"marin telemetry ingest: {path}: line 2 runs past 4096 bytes without a newline; "
        "not a metrics.jsonl (its lines are a few KB)\n"
    )
    assert TelemetryStore(str(tmp_path / "tel")).query().height == 0  # nothing half-ingested
