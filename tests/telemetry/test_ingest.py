"""Importing a training metrics.jsonl: every line kept, quarantined or counted."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_assets.telemetry import TelemetryStore, import_metrics_jsonl
from marin_assets.train.metrics import MetricsLogger


def trainer_rows(n):
    return [
        {
            "step": s,
            "loss": 3.0 - s / 10,
            "lr": 1e-3,
            "grad_norm": math.nan if s == 2 else 0.5,
            "update_norm": 0.1,
            "skipped": s == 2,
            "tokens": 4096 * s,
            "phase": "warmup" if s < 3 else "stable",
            "counts": {"spike_skips": int(s == 2), "nonfinite": 0},
        }
        for s in range(1, n + 1)
    ]


def test_trainer_file_imports_every_value(tmp_path):
    logger = MetricsLogger(tmp_path / "run")
    for row in trainer_rows(5):
        logger.write(row)
    logger.close()
    root = str(tmp_path / "tel")
    report = import_metrics_jsonl(root, "r1", tmp_path / "run" / "metrics.jsonl")
    assert (report.lines, report.steps, report.quarantined, report.empty) == (5, 5, 0, 0)
    assert report.values == 5 * 8 and report.nonfinite == 1 and report.ignored_fields == {}
    frame = TelemetryStore(root).query(run="r1", steps=(2, 2))
    got = dict(zip(frame["metric"], frame["value"]))
    assert got == {
        "loss": 2.8,
        "lr": 1e-3,
        "grad_norm": None,
        "update_norm": 0.1,
        "skipped": 1.0,
        "tokens": 8192.0,
        "counts.spike_skips": 1.0,
        "counts.nonfinite": 0.0,
    }
    assert set(frame["phase"]) == {"warmup"} and frame["time"].null_count() == frame.height
    assert TelemetryStore(root).query(metric="loss", steps=(4, 5))["phase"].to_list() == ["stable", "stable"]


def test_bad_lines_are_quarantined_with_reasons(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(
        "\n".join(
            [
                json.dumps({"step": 1, "loss": 2.0, "time": 5.5, "note": "hello", "tags": [1]}),
                json.dumps({"loss": 2.0}),
                json.dumps({"step": -3, "loss": 2.0}),
                json.dumps([1, 2]),
                "",
                json.dumps({"step": 2}),
                json.dumps({"step": 3, "bad name": 1.0, "loss": "-inf"}),
                '{"step": 4, "loss": 1.',
            ]
        )
        + "\n"
    )
    root = str(tmp_path / "tel")
    report = import_metrics_jsonl(root, "r1", path)
    assert report.lines == 7  # the blank line is not a record
    assert (report.steps, report.empty, report.quarantined) == (2, 1, 4)
    assert report.steps + report.empty + report.quarantined == report.lines
    assert report.quarantine == [
        "line 2: step must be a non-negative integer, got None",
        "line 3: step must be a non-negative integer, got -3",
        "line 4: not a JSON object (list)",
        "line 8: not JSON (Expecting ',' delimiter)",
    ]
    assert report.ignored_fields == {"bad name (invalid metric name)": 1, "note (not a number)": 1, "tags (not a number)": 1}
    frame = TelemetryStore(root).query()
    assert frame.select("step", "metric", "value", "time").rows() == [(1, "loss", 2.0, 5.5), (3, "loss", None, None)]


def test_same_file_again_adds_nothing_and_another_file_needs_append(tmp_path):
    path, other = tmp_path / "m.jsonl", tmp_path / "other.jsonl"
    path.write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n")
    other.write_text(json.dumps({"step": 2, "loss": 1.5}) + "\n")
    root = str(tmp_path / "tel")
    assert import_metrics_jsonl(root, "r1", path).values == 1
    for append in (False, True):  # --append does not make the same rows count twice either
        again = import_metrics_jsonl(root, "r1", path, append=append)
        assert (again.values, again.lines, again.segments, again.already_ingested_bytes) == (0, 0, 0, path.stat().st_size)
    with pytest.raises(ValueError, match=r"already has 1 rows .*none from"):
        import_metrics_jsonl(root, "r1", other)
    assert import_metrics_jsonl(root, "r1", other, append=True).values == 1
    assert TelemetryStore(root).query().select("step", "value").rows() == [(1, 2.0), (2, 1.5)]
    with pytest.raises(ValueError, match="invalid run"):
        import_metrics_jsonl(root, "r 1", path)


scalars = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**6), 10**6),
    st.booleans(),
    st.sampled_from(["nan", "inf", "-inf", "text"]),
    st.none(),
)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.fixed_dictionaries(
                {"step": st.integers(0, 1000)},
                optional={
                    "loss": scalars,
                    "lr": scalars,
                    "phase": st.one_of(st.none(), st.text(max_size=3)),
                    "counts": st.dictionaries(st.sampled_from(["a", "b"]), scalars, max_size=2),
                },
            ),
            st.text(max_size=8),
        ),
        max_size=12,
    )
)
def test_any_file_is_accounted_for_line_by_line(tmp_path_factory, records):
    tmp = tmp_path_factory.mktemp("ingest")
    lines = [json.dumps(r) if isinstance(r, dict) else r.replace("\n", " ") for r in records]
    lines = [line for line in lines if line.strip()]
    (tmp / "m.jsonl").write_text("".join(line + "\n" for line in lines))
    report = import_metrics_jsonl(str(tmp / "tel"), "r1", tmp / "m.jsonl")
    assert report.lines == len(lines)
    assert report.steps + report.empty + report.quarantined + len(report.deferred) == report.lines
    frame = TelemetryStore(str(tmp / "tel")).query()
    assert frame.height == report.values
    assert frame["value"].null_count() == report.nonfinite
