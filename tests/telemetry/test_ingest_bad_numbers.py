"""Numbers the store cannot hold: a step beyond int64 is quarantined with its line, numbers
beyond float64 become null like any non-finite value, and the rest of the file is ingested."""

from __future__ import annotations

import json

import pytest

from marin_assets.cli import main
from marin_assets.telemetry import TelemetryStore, TelemetryWriter, import_metrics_jsonl

INT64_MAX = 2**63 - 1


def test_a_step_beyond_int64_is_quarantined_and_the_rest_ingested(tmp_path, capsys):
    path, root = tmp_path / "metrics.jsonl", str(tmp_path / "tel")
    path.write_text(
        "".join(
            json.dumps(r) + "\n"
            for r in [
                {"step": 1, "loss": 2.0},
                {"step": 2**70, "loss": 1.0},
                {"step": INT64_MAX, "loss": 0.5},
                {"step": 10**400, "loss": 0.1},
                {"step": 3, "loss": 1.5},
            ]
        )
    )
    report = import_metrics_jsonl(root, "r1", path)
    assert (report.steps, report.quarantined, report.values) == (3, 2, 3)
    assert report.quarantine == [
        "line 2: step 1180591620717411303424 is beyond int64 (the largest step is 2**63-1)",
        "line 4: step 100000000000... (401 digits) is beyond int64 (the largest step is 2**63-1)",
    ]
    frame = TelemetryStore(root).query()
    assert frame.select("step", "value").rows() == [(1, 2.0), (3, 1.5), (INT64_MAX, 0.5)]
    assert main(["telemetry", "ingest", "--root", str(tmp_path / "tel2"), "--run", "r1", str(path)]) == 0
    err = capsys.readouterr().err
    assert f"{path}: 2 line(s) quarantined, first line 2: step 1180591620717411303424 is beyond int64" in err


def test_numbers_beyond_float64_are_null_like_other_non_finite_values(tmp_path):
    path, root = tmp_path / "metrics.jsonl", str(tmp_path / "tel")
    path.write_text(
        f'{{"step": 1, "loss": {10**400}, "lr": -{10**400}, "x": 1e400, "time": {10**400}}}\n'
        '{"step": 2, "loss": "nan", "lr": 0.5, "time": 7.0}\n'
    )
    report = import_metrics_jsonl(root, "r1", path)
    assert (report.values, report.nonfinite, report.quarantined) == (5, 4, 0)
    assert report.ignored_fields == {"time (not a finite number)": 1}
    frame = TelemetryStore(root).query()
    assert frame.select("step", "metric", "value", "time").rows() == [
        (1, "loss", None, None),
        (2, "loss", None, 7.0),
        (1, "lr", None, None),
        (2, "lr", 0.5, 7.0),
        (1, "x", None, None),
    ]


def test_a_line_that_is_not_utf8_is_quarantined_not_fatal(tmp_path):
    path, root = tmp_path / "metrics.jsonl", str(tmp_path / "tel")
    path.write_bytes(b'{"step": 1, "loss": 2.0}\n{"step": 2, "loss": "\xff"}\n{"step": 3, "loss": 1.0}\n')
    report = import_metrics_jsonl(root, "r1", path)
    assert (report.steps, report.quarantined) == (2, 1)
    assert report.quarantine == ["line 2: not UTF-8 (invalid start byte at byte 21)"]


def test_the_writer_refuses_a_step_beyond_int64_at_log_and_keeps_working(tmp_path):
    root = str(tmp_path / "tel")
    with TelemetryWriter(root, "r1") as w:
        w.log(1, {"loss": 1.0})
        with pytest.raises(ValueError, match="run r1: step must be a non-negative integer below 2\\*\\*63"):
            w.log(2**63, {"loss": 2.0})
        w.log(INT64_MAX, {"loss": 3.0})
    assert TelemetryStore(root).query()["step"].to_list() == [1, INT64_MAX]
